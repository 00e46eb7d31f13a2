"""Keyword-name mapping between jaxspec's API and SGLang's kernel signatures.

jaxspec fixes upstream misspellings in its own API (``retrieve_*``); SGLang's CUDA op schemas and the
``tree.py`` JIT wrappers keep ``retrive_*`` (and some call sites use ``verified_id`` / ``selected_index``
for what jaxspec calls ``bonus_tokens`` / ``top_scores_index``). This table is the only place the
interop layer spells the upstream names, so callers can translate keyword dicts in one call.
"""

# jaxspec name -> SGLang 0.5.23 keyword name (only the names that differ).
JAXSPEC_TO_SGLANG: dict[str, str] = {
    "retrieve_index": "retrive_index",
    "retrieve_next_token": "retrive_next_token",
    "retrieve_next_sibling": "retrive_next_sibling",
    "top_scores_index": "selected_index",  # tree.cuh / spec_tree.py kernel parameter name
    "seq_lens": "verified_seq_len",  # tree.cuh / spec_tree.py kernel parameter name
    "num_draft_tokens": "draft_token_num",
    "num_steps": "depth",
    "mask_mode": "tree_mask_mode",
    "num_correct_drafts": "accept_token_num",
    "predict": "predicts",
}

SGLANG_TO_JAXSPEC: dict[str, str] = {v: k for k, v in JAXSPEC_TO_SGLANG.items()}
# Older (v2-early / seed) spellings that map onto the same jaxspec names.
SGLANG_TO_JAXSPEC.update({"verified_id": "bonus_tokens", "accept_length": "accept_lens"})


def to_sglang(kwargs: dict) -> dict:
    """Rename jaxspec keyword names to SGLang's (unknown names pass through unchanged)."""
    return {JAXSPEC_TO_SGLANG.get(k, k): v for k, v in kwargs.items()}


def to_jaxspec(kwargs: dict) -> dict:
    """Rename SGLang keyword names to jaxspec's (unknown names pass through unchanged)."""
    return {SGLANG_TO_JAXSPEC.get(k, k): v for k, v in kwargs.items()}
