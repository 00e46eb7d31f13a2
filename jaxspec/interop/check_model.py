"""Check that jaxspec runs a checkpoint exactly as transformers does.

``python -m jaxspec.interop.check_model PATH`` loads ``PATH`` -- a Hugging Face directory (``config.json`` +
``*.safetensors``) or a llama ``.gguf`` file (transformers reads it with ``gguf_file=``; both sides dequantize
it with the ``gguf`` package to the same float32 weights) -- with ``jaxspec.models.load_model`` (paged attention
through a shuffled page table, all prompts in one right-padded batch) and with ``transformers`` (torch, CPU, one
prompt at a time with its own KV cache), and compares greedy decoding on the same token ids: random prompts,
``--prompts-file`` (a JSON list of token id lists) or ``--mtbench N`` (N MT-Bench first turns, one per category
in turn, each rendered through the checkpoint's chat template and tokenized by ``jaxspec.text``; the questions
are fetched once into the user cache by ``jaxspec.data.mtbench``, hash-checked).

* **float32** (``--dtype float32``, the default; weights and KV in float32 on both sides):

  - the prompt logits: ``max |jax - hf| <= rtol * max |hf|`` over every prompt position (default
    ``rtol = 1e-4``). Both sides compute the same f32 graph and differ only in summation order and in how RoPE
    frequencies are rounded: a few f32 ulps per layer (2-4e-7 of the logit scale on 2-layer test models,
    3.1e-6 on the 30-layer SmolLM2-135M-Instruct over 8 chat prompts). 1e-4 leaves ~30x headroom for deeper
    models, while any layout error (a dropped bias, the wrong RoPE half, llama.cpp's q/k permutation left in,
    a wrong norm epsilon, an untied head) moves logits by 1e-2 of their scale or more;
  - the greedy continuations: ``--new-tokens`` tokens, identical token for token.

* **bfloat16** (``--dtype bfloat16``: jaxspec's weights and KV in bf16; transformers in ``--hf-dtype``, by
  default the same): bf16 rounding (8-bit mantissas: ~4e-3 relative per rounding, compounded over 30 layers)
  moves logits by ~1e-2 of their scale on both sides, differently, so greedy paths part where the two best
  candidates nearly tie. The check also runs transformers in float32 as the exact reference and reports:

  - each side's prompt-logit error against that f32 reference (``max |bf16 - f32| / max |f32|``). jaxspec's may
    be at most ``--max-err-ratio`` (default 2) times transformers' own bf16 error: both round the same weights
    to bf16, so a jaxspec error well above transformers' is a systematic difference (a missing f32 upcast, a
    wrong accumulation dtype), not rounding;
  - per prompt, the first generated position where the tokens differ and, there (both sides saw the same
    tokens so far), each side's top-2 logit gap (its token's logit minus the best other token's: 0 when
    transformers' bf16 logits tie exactly and the lower index wins), each side's margin of its own choice
    over the other side's choice (on its own logits), and the f32 reference's margin between the two tokens at
    the same position. A divergence is a near-tie when both margins are at most ``--tie-tol`` logits (default:
    the larger of the two sides' measured max |bf16 - f32| prompt-logit error, i.e. no larger than bf16 rounding
    demonstrably moves a logit in this very run); a token outside the other side's top 8 is never one.

  It passes when every divergence is a near-tie and the error ratio holds. The logits-within-rtol line is
  reported too (``--rtol``); bf16 against bf16 is not expected to meet the f32 ``rtol``.

Exit status: 0 the check holds; 1 it fails (jaxspec differs); 2 jaxspec refuses the checkpoint or the arguments
(the message says why); 3 cannot compare: transformers (or torch) is missing or refuses or fails to load a
checkpoint that jaxspec accepts (the message gives transformers' error). Needs the ``hf`` extra (transformers,
accelerate), torch, and ``gguf`` for a GGUF file; only ``--mtbench`` downloads anything.
"""

import argparse
import dataclasses
import inspect
import json
import os
import sys

import numpy as np

from jaxspec.cli_help import parser

_DTYPES = {"float32": "float32", "f32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
EXIT_OK, EXIT_DIFFERS, EXIT_REFUSED, EXIT_CANNOT_COMPARE = 0, 1, 2, 3
TOP_K = 8  # candidates kept per generated position on each side (the other side's choice is looked up among them)


class CannotCompare(RuntimeError):
    """The reference cannot run: transformers or torch is missing, or transformers refuses the checkpoint."""


@dataclasses.dataclass(frozen=True)
class PromptReport:
    """One prompt's greedy comparison: ``first_diff`` is the first generated position where the tokens differ
    (``None``: identical). There (both sides saw the same tokens so far): each side's token, its top-2 gap (its
    token's logit minus the best other token's; 0 for an exact tie broken by index) and that runner-up; each
    side's margin of its own token over the other side's (``margin_jax = jax logit(jax's) - jax logit(hf's)``;
    ``None`` when the other's token is not in this side's top ``TOP_K``); and (bf16) the f32 reference's logit of
    jaxspec's token minus that of transformers' token (``ref_margin``)."""

    index: int
    prompt_len: int
    first_diff: int | None
    jax_token: int | None = None
    hf_token: int | None = None
    gap_jax: float | None = None
    gap_hf: float | None = None
    runner_up_jax: int | None = None
    runner_up_hf: int | None = None
    margin_jax: float | None = None
    margin_hf: float | None = None
    ref_margin: float | None = None

    @property
    def crossed(self) -> bool:
        """Each side's runner-up is the other side's choice (the two tokens swapped places)."""
        return (self.first_diff is not None and self.runner_up_jax == self.hf_token
                and self.runner_up_hf == self.jax_token)

    def near_tie(self, tie_tol: float) -> bool:
        """Each side's choice beats the other side's by at most ``tie_tol`` logits, on that side's own logits."""
        return self.first_diff is None or (self.margin_jax is not None and self.margin_hf is not None
                                           and max(self.margin_jax, self.margin_hf) <= tie_tol)


@dataclasses.dataclass(frozen=True)
class ModelCheck:
    """Result of ``check_model``: prompt-logit agreement, both greedy continuations (``int[B, new_tokens]``) and a
    ``PromptReport`` per prompt; in bf16 also each side's prompt-logit error against the f32 reference
    (``err_jax``, ``err_hf``: max |x - f32| / max |f32|; ``abs_err_jax``, ``abs_err_hf``: in logits)."""

    max_abs_diff: float
    logit_scale: float
    rtol: float
    greedy_jax: np.ndarray
    greedy_hf: np.ndarray
    dtype: str = "float32"
    hf_dtype: str = "float32"
    tie_tol: float | None = None
    prompts: tuple = ()
    err_jax: float | None = None
    err_hf: float | None = None
    abs_err_jax: float | None = None
    abs_err_hf: float | None = None
    max_err_ratio: float = 2.0

    @property
    def exact(self) -> bool:
        """Both sides in float32: the logits and greedy tokens must agree."""
        return self.dtype == "float32" and self.hf_dtype == "float32"

    @property
    def logits_ok(self) -> bool:
        return self.max_abs_diff <= self.rtol * self.logit_scale

    @property
    def greedy_ok(self) -> bool:
        return np.array_equal(self.greedy_jax, self.greedy_hf)

    @property
    def near_ties_ok(self) -> bool:
        return all(p.near_tie(self.tie_tol) for p in self.prompts)

    @property
    def err_ratio(self) -> float | None:
        if self.err_jax is None or self.err_hf is None:
            return None
        return self.err_jax / max(self.err_hf, 1e-30)

    @property
    def err_ok(self) -> bool:
        return self.err_ratio is None or self.err_ratio <= self.max_err_ratio

    @property
    def ok(self) -> bool:
        if self.exact:
            return self.logits_ok and self.greedy_ok
        return self.near_ties_ok and self.err_ok

    def to_json(self) -> dict:
        return {"ok": self.ok, "dtype": self.dtype, "hf_dtype": self.hf_dtype, "logits_ok": self.logits_ok,
                "greedy_ok": self.greedy_ok, "max_abs_diff": self.max_abs_diff, "logit_scale": self.logit_scale,
                "rtol": self.rtol, "tie_tol": self.tie_tol, "err_jax": self.err_jax, "err_hf": self.err_hf,
                "abs_err_jax": self.abs_err_jax, "abs_err_hf": self.abs_err_hf, "err_ratio": self.err_ratio,
                "max_err_ratio": self.max_err_ratio,
                "prompts": [{**dataclasses.asdict(p), "crossed": p.crossed,
                             "near_tie": p.near_tie(self.tie_tol) if self.tie_tol is not None else None}
                            for p in self.prompts],
                "greedy_jax": self.greedy_jax.tolist(), "greedy_hf": self.greedy_hf.tolist()}


# ---------------------------------------------------------------------------------------------- transformers side

def _split(path: str) -> tuple[str, dict]:
    """``from_pretrained``'s directory and keyword for ``path`` (a GGUF file: its directory and ``gguf_file``)."""
    from jaxspec.models.gguf import is_gguf

    if is_gguf(path):
        return os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    return path, {}


def hf_model(path: str, dtype: str = "float32"):
    """transformers' ``AutoModelForCausalLM`` for ``path`` in ``dtype`` (eval mode); ``CannotCompare`` when
    transformers or torch is missing or transformers refuses the checkpoint."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise CannotCompare(f"the reference needs torch and transformers (the hf extra): {e}") from e
    major = int(transformers.__version__.split(".")[0])
    tdt = getattr(torch, dtype)
    kw = {"dtype": tdt} if major >= 5 else {"torch_dtype": tdt}
    where, extra = _split(path)
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(where, **kw, **extra).eval()
    except Exception as e:  # noqa: BLE001 -- any refusal of the reference means the two cannot be compared
        msg = str(e).strip().splitlines()
        raise CannotCompare(f"transformers {transformers.__version__} cannot load {path}: {type(e).__name__}: "
                            f"{msg[0] if msg else ''}") from e


def _as_prompts(prompts) -> list[np.ndarray]:
    return [np.asarray(p, np.int64).reshape(-1) for p in prompts]


def hf_prompt_logits(model, prompts) -> list[np.ndarray]:
    """transformers' f32 logits ``f32[P_b, V]`` of each prompt (one forward each, no generation)."""
    import torch

    with torch.no_grad():
        return [model(input_ids=torch.from_numpy(p[None])).logits[0].float().numpy() for p in _as_prompts(prompts)]


def hf_greedy(model, prompts, new_tokens: int):
    """transformers, one prompt at a time with its KV cache: ``(prompt logits [f32[P_b, V]] per prompt, greedy
    tokens int[B, new_tokens], top-K logits f32[B, new_tokens, K], their ids int[B, new_tokens, K])``, K =
    ``TOP_K``."""
    import torch

    # transformers >= 5.2x names the KV cache argument and output ``cache`` (``past_key_values`` before).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    logits_out, toks, vals, ids = [], [], [], []
    with torch.no_grad():
        for p in _as_prompts(prompts):
            out = model(input_ids=torch.from_numpy(p[None]), use_cache=True)
            logits_out.append(out.logits[0].float().numpy())
            row_t, row_v, row_i = [], [], []
            past = getattr(out, name)
            for i in range(new_tokens):
                last = out.logits[0, -1].float()
                top = torch.topk(last, TOP_K)
                nxt = int(last.argmax())
                row_t.append(nxt)
                row_v.append(top.values.numpy())
                row_i.append(top.indices.numpy())
                if i + 1 < new_tokens:
                    out = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **{name: past})
                    past = getattr(out, name)
            toks.append(row_t)
            vals.append(row_v)
            ids.append(row_i)
    return logits_out, np.asarray(toks, np.int64), np.asarray(vals, np.float32), np.asarray(ids, np.int64)


# --------------------------------------------------------------------------------------------------- jaxspec side

def jax_model(path: str, dtype: str = "float32"):
    """``load_model(path)`` with weights and KV in ``dtype`` (the target only); jaxspec's refusals propagate."""
    import jax.numpy as jnp

    from jaxspec.models.checkpoint import load_model

    jdt = getattr(jnp, dtype)
    return load_model(path, mtp=False, param_dtype=jdt, kv_dtype=jdt)


def jax_greedy(model, prompts, new_tokens: int, *, page_size: int = 4, seed: int = 0):
    """jaxspec: all prompts in one batch, right-padded to the longest and prefilled together into a paged KV
    cache (rows' pages shuffled by ``seed``), then one token per forward, each row at its own position. Same
    outputs as ``hf_greedy``. Padding is harmless: causal attention keeps it out of every real position's logits,
    and each decode step overwrites the padded slot at its position before any query attends to it."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from jaxspec.protocols import AttentionMetadata, make_req_to_token, page_table_from_req_to_token

    rows = _as_prompts(prompts)
    lens = np.array([len(p) for p in rows], np.int32)
    b, p = len(rows), int(lens.max())
    tokens = np.zeros((b, p), np.int32)
    for k, r in enumerate(rows):
        tokens[k, : len(r)] = r
    width = -(-(p + new_tokens) // page_size) * page_size
    r2t = make_req_to_token(b, width, page_size, seed=seed)
    cache = model.make_cache(r2t, (int(r2t.max()) // page_size + 1) * page_size)
    table = page_table_from_req_to_token(cache.req_to_token, page_size)
    fwd = nnx.jit(lambda m, t, meta, c: m.forward(t, meta, c))

    def meta(pos, q):  # pos: int32[B], each row's first position
        positions = pos[:, None] + jnp.broadcast_to(jnp.arange(q, dtype=jnp.int32)[None], (b, q))
        return AttentionMetadata(
            positions=positions, qmask=jnp.broadcast_to(jnp.tril(jnp.ones((q, q), bool))[None], (b, q, q)),
            prefix_lens=pos, page_table=table,
            write_locs=jnp.take_along_axis(cache.req_to_token, positions, axis=1), page_size=page_size)

    def pick(last):  # f32[B, V] -> token, top-K values and ids
        last = last.astype(jnp.float32)
        v, i = jax.lax.top_k(last, TOP_K)
        return jnp.argmax(last, -1).astype(jnp.int32), v, i

    lens_j = jnp.asarray(lens)
    logits, _, cache = fwd(model, jnp.asarray(tokens), meta(jnp.zeros((b,), jnp.int32), p), cache)
    nxt, v, i = pick(logits[jnp.arange(b), lens_j - 1])
    toks, vals, ids = [nxt], [v], [i]
    for step in range(new_tokens - 1):
        out, _, cache = fwd(model, nxt[:, None], meta(lens_j + step, 1), cache)
        nxt, v, i = pick(out[:, -1])
        toks.append(nxt)
        vals.append(v)
        ids.append(i)
    logits = np.asarray(jax.device_get(logits.astype(jnp.float32)))
    return ([logits[k, : lens[k]] for k in range(b)], np.asarray(jnp.stack(toks, 1)),
            np.asarray(jnp.stack(vals, 1)), np.asarray(jnp.stack(ids, 1)))


# -------------------------------------------------------------------------------------------------------- prompts

def _vocab_size(path: str) -> int:
    from jaxspec.models.checkpoint import read_config
    from jaxspec.models.gguf import is_gguf, read_gguf_config

    return (read_gguf_config(path) if is_gguf(path) else read_config(path)).vocab_size


def read_prompts_file(file: str, vocab_size: int | None = None) -> list[list[int]]:
    """A JSON list of non-empty token id lists (``ValueError`` naming the file and the bad entry)."""
    with open(file) as f:
        data = json.load(f)
    if not isinstance(data, list) or not data:
        raise ValueError(f"{file}: expected a non-empty JSON list of token id lists")
    for k, row in enumerate(data):
        if (not isinstance(row, list) or not row
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in row)):
            raise ValueError(f"{file}: entry {k}: expected a non-empty list of token ids (ints >= 0)")
        if vocab_size is not None and max(row) >= vocab_size:
            raise ValueError(f"{file}: entry {k}: token id {max(row)} is outside the vocabulary (size {vocab_size})")
    return data


def mtbench_questions(n: int, questions=None) -> list[dict]:
    """``n`` MT-Bench questions, one per category in turn (the first of each category in file order, then the
    second of each, ...): with 8 categories, ``n = 8`` is the first question of each. ``questions``: the parsed
    question list (default: ``jaxspec.data.mtbench.questions()``, fetched when needed)."""
    if questions is None:
        from jaxspec.data.mtbench import questions as fetch

        questions = fetch()
    if not 1 <= n <= len(questions):
        raise ValueError(f"mtbench: expected 1 <= n <= {len(questions)}, got {n}")
    by_cat: dict[str, list[dict]] = {}
    for q in questions:
        by_cat.setdefault(q["category"], []).append(q)
    order = [qs[k] for k in range(max(map(len, by_cat.values()))) for qs in by_cat.values() if k < len(qs)]
    return order[:n]


def mtbench_prompts(tokenizer_path: str, n: int, questions=None) -> list[list[int]]:
    """Token ids of ``mtbench_questions(n)``'s first turns, each as a one-message user conversation through the
    chat template of the checkpoint at ``tokenizer_path`` (``jaxspec.text.Tokenizer.from_file``), with the
    generation prompt."""
    from jaxspec.text import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    return [tok.encode_chat([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True)
            for q in mtbench_questions(n, questions)]


# ---------------------------------------------------------------------------------------------------------- check

def _side(vals, ids, own: int, other: int) -> tuple[float, int, float | None]:
    """One side at a divergence, from its top-K (``vals``, ``ids``; its own token among them): the top-2 gap, the
    runner-up, and its margin over ``other`` (``None`` when ``other`` is not among the top K)."""
    top = float(vals[ids == own][0])
    j = int(np.flatnonzero(ids != own)[0])
    margin = float(top - vals[ids == other][0]) if (ids == other).any() else None
    return top - float(vals[j]), int(ids[j]), margin


def _reports(lens, toks_j, toks_h, vals_j, ids_j, vals_h, ids_h) -> list:
    out = []
    for k in range(toks_j.shape[0]):
        diff = np.flatnonzero(toks_j[k] != toks_h[k])
        if not diff.size:
            out.append(PromptReport(index=k, prompt_len=int(lens[k]), first_diff=None))
            continue
        i = int(diff[0])
        tj, th = int(toks_j[k, i]), int(toks_h[k, i])
        gj, rj, mj = _side(vals_j[k, i], ids_j[k, i], tj, th)
        gh, rh, mh = _side(vals_h[k, i], ids_h[k, i], th, tj)
        out.append(PromptReport(index=k, prompt_len=int(lens[k]), first_diff=i, jax_token=tj, hf_token=th,
                                gap_jax=gj, gap_hf=gh, runner_up_jax=rj, runner_up_hf=rh, margin_jax=mj,
                                margin_hf=mh))
    return out


def _ref_margins(ref, rows, toks, reports) -> list:
    """Each divergent report with the f32 reference's logit of jaxspec's token minus transformers' token, given
    the prompt and the tokens both sides generated before the divergence."""
    out = []
    for r in reports:
        if r.first_diff is None:
            out.append(r)
            continue
        ctx = np.concatenate([rows[r.index], toks[r.index, : r.first_diff]])
        last = hf_prompt_logits(ref, [ctx])[0][-1]
        out.append(dataclasses.replace(r, ref_margin=float(last[r.jax_token] - last[r.hf_token])))
    return out


def _rel_err(a_list, ref_list) -> tuple[float, float]:
    err = max(float(np.max(np.abs(a - r))) for a, r in zip(a_list, ref_list))
    scale = max(float(np.max(np.abs(r))) for r in ref_list)
    return err, scale


def check_model(path: str, *, batch: int = 2, prompt_len: int = 16, new_tokens: int = 32, rtol: float = 1e-4,
                page_size: int = 4, seed: int = 0, prompts=None, dtype: str = "float32", hf_dtype: str | None = None,
                tie_tol: float | None = None, max_err_ratio: float = 2.0) -> ModelCheck:
    """Compare jaxspec with transformers on checkpoint ``path`` (see the module docstring). ``prompts``: token
    id lists (lengths may differ); default ``batch`` random prompts of ``prompt_len`` tokens. ``hf_dtype``:
    default ``dtype``. ``tie_tol``: default the measured bf16 error (bf16 only). jaxspec's refusals of the
    checkpoint or the arguments raise ``ValueError`` (or ``OSError``); ``CannotCompare`` when the reference
    cannot run."""
    hf_dtype = dtype if hf_dtype is None else hf_dtype
    for name, v in (("dtype", dtype), ("hf_dtype", hf_dtype)):
        if v not in _DTYPES:
            raise ValueError(f"{name}: expected one of {sorted(_DTYPES)}, got {v!r}")
    dtype, hf_dtype = _DTYPES[dtype], _DTYPES[hf_dtype]
    if new_tokens < 1:
        raise ValueError(f"new_tokens: expected >= 1, got {new_tokens}")
    vocab = _vocab_size(path)
    if prompts is None:
        prompts = np.random.default_rng(seed).integers(0, vocab, (batch, prompt_len))
    rows = _as_prompts(prompts)
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("prompts: expected at least one non-empty token id list")
    if any(int(r.min()) < 0 or int(r.max()) >= vocab for r in rows):
        raise ValueError(f"prompts: token ids must lie in [0, {vocab})")
    model = jax_model(path, dtype)  # jaxspec refuses first (exit 2) ...
    ref = hf_model(path, hf_dtype)  # ... then the reference may (exit 3)
    logits, toks, v, i = jax_greedy(model, rows, new_tokens, page_size=page_size, seed=seed)
    ref_logits, ref_toks, ref_v, ref_i = hf_greedy(ref, rows, new_tokens)
    diff, scale = _rel_err(logits, ref_logits)
    reports = _reports([len(r) for r in rows], toks, ref_toks, v, i, ref_v, ref_i)
    extra = {}
    if dtype != "float32" or hf_dtype != "float32":
        exact = ref if hf_dtype == "float32" else hf_model(path, "float32")
        f32 = hf_prompt_logits(exact, rows)
        (aj, s32), (ah, _) = _rel_err(logits, f32), _rel_err(ref_logits, f32)
        reports = _ref_margins(exact, rows, toks, reports)
        extra = {"err_jax": aj / s32, "err_hf": ah / s32, "abs_err_jax": aj, "abs_err_hf": ah,
                 "tie_tol": max(aj, ah) if tie_tol is None else tie_tol}
    elif tie_tol is not None:
        extra = {"tie_tol": tie_tol}
    return ModelCheck(max_abs_diff=diff, logit_scale=scale, rtol=rtol, greedy_jax=toks, greedy_hf=ref_toks,
                      dtype=dtype, hf_dtype=hf_dtype, prompts=tuple(reports), max_err_ratio=max_err_ratio, **extra)


def format_report(res: ModelCheck) -> str:
    lines = [f"jaxspec {res.dtype} vs transformers {res.hf_dtype}: prompt logits max |jax - hf| = "
             f"{res.max_abs_diff:.3g}, scale {res.logit_scale:.3g}, ratio "
             f"{res.max_abs_diff / max(res.logit_scale, 1e-30):.3g} (rtol {res.rtol:g}): "
             f"{'ok' if res.logits_ok else 'over rtol' if not res.exact else 'MISMATCH'}"]
    if res.err_ratio is not None:
        lines.append(f"prompt logits against transformers float32: jaxspec {res.dtype} max err {res.abs_err_jax:.3g} "
                     f"({res.err_jax:.3g} of scale), transformers {res.hf_dtype} {res.abs_err_hf:.3g} "
                     f"({res.err_hf:.3g}); ratio {res.err_ratio:.3g} (at most {res.max_err_ratio:g}): "
                     f"{'ok' if res.err_ok else 'MISMATCH'}")
    same = (res.greedy_jax == res.greedy_hf).all(axis=1)
    n = res.greedy_hf.shape[1]
    lines.append(f"greedy {n} tokens x {len(same)} prompts: {int(same.sum())} of {len(same)} identical")
    for p in res.prompts:
        head = f"  prompt {p.index} ({p.prompt_len} tokens): "
        if p.first_diff is None:
            lines.append(head + f"identical over {n} tokens")
            continue
        ref = "" if p.ref_margin is None else f"; f32 reference: logit(jax's) - logit(hf's) = {p.ref_margin:.3g}"
        verdict = "" if res.tie_tol is None else (
            f": {'near-tie' if p.near_tie(res.tie_tol) else 'NOT a near-tie'} (tie-tol {res.tie_tol:.3g})")
        def over(m):
            return f"over the other's by {m:.3g}" if m is not None else f"the other's not in its top {TOP_K}"

        lines.append(head + f"first difference at token {p.first_diff}: jax {p.jax_token} (top-2 gap "
                     f"{p.gap_jax:.3g}, runner-up {p.runner_up_jax}, {over(p.margin_jax)}), hf {p.hf_token} "
                     f"(top-2 gap {p.gap_hf:.3g}, runner-up {p.runner_up_hf}, {over(p.margin_hf)}){ref}{verdict}")
    lines.append("match" if res.ok else "MISMATCH")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = parser("jaxspec.interop.check_model",
                "Check that jaxspec runs a Hugging Face checkpoint directory (config.json + *.safetensors) or a llama "
                "GGUF file like transformers does: prompt logits within rtol and identical greedy continuations in "
                "float32; in bfloat16, where greedy paths part and whether each parting is a near-tie. Exit 0 on a "
                "match, 1 on a mismatch, 2 when jaxspec refuses the checkpoint or the arguments, 3 when transformers "
                "cannot load it (cannot compare).")
    ap.add_argument("path", metavar="PATH", help="checkpoint directory or .gguf file (local)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompts-file", default=None, help="JSON list of token id lists to use as prompts")
    src.add_argument("--mtbench", type=int, default=None, metavar="N",
                     help="N MT-Bench first turns (one per category in turn) through the chat template")
    ap.add_argument("--tokenizer", default=None,
                    help="checkpoint (directory or .gguf) whose tokenizer and chat template --mtbench uses "
                         "(default: PATH)")
    ap.add_argument("--batch", type=int, default=2, help="random prompts compared")
    ap.add_argument("--prompt-len", type=int, default=16, help="tokens per random prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens generated and compared")
    ap.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="jaxspec's weight and KV dtype")
    ap.add_argument("--hf-dtype", default=None, choices=sorted(_DTYPES), help="transformers' dtype (default: --dtype)")
    ap.add_argument("--rtol", type=float, default=1e-4, help="allowed max |logit difference| / max |reference logit|")
    ap.add_argument("--tie-tol", type=float, default=None,
                    help="largest top-2 logit gap a bf16 divergence may have and count as a near-tie "
                         "(default: the run's measured max |bf16 - f32| prompt-logit error)")
    ap.add_argument("--max-err-ratio", type=float, default=2.0,
                    help="bf16: largest allowed jaxspec / transformers prompt-logit error against f32")
    ap.add_argument("--page-size", type=int, default=4, help="KV page size of jaxspec's paged cache")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random prompts and of the page shuffle")
    ap.add_argument("--json", default=None, help="also write the report as JSON to this file")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        prompts = None
        if args.prompts_file:
            prompts = read_prompts_file(args.prompts_file, _vocab_size(args.path))
        elif args.mtbench is not None:
            prompts = mtbench_prompts(args.tokenizer or args.path, args.mtbench)
        res = check_model(args.path, batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                          rtol=args.rtol, page_size=args.page_size, seed=args.seed, prompts=prompts,
                          dtype=args.dtype, hf_dtype=args.hf_dtype, tie_tol=args.tie_tol,
                          max_err_ratio=args.max_err_ratio)
    except CannotCompare as e:
        print(f"check_model: cannot compare: {e}", file=sys.stderr)
        return EXIT_CANNOT_COMPARE
    except (ValueError, OSError) as e:
        print(f"check_model: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(format_report(res))
    if args.json:
        out = {"path": args.path, "new_tokens": args.new_tokens, "prompt_tokens": [p.prompt_len for p in res.prompts]}
        with open(args.json, "w") as f:
            json.dump({**out, **res.to_json()}, f, indent=1)
    return EXIT_OK if res.ok else EXIT_DIFFERS


if __name__ == "__main__":
    sys.exit(main())
