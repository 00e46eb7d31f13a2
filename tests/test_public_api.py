"""The curated public API: names importable from jaxspec / jaxspec.kernels, docs in sync with outputs."""

import inspect

import jaxspec
import jaxspec.kernels

SPEC_NAMES = [
    "SpecConfig", "select_top_k_tokens", "organize_draft_results", "organize_mtp_draft_results",
    "chain_draft_results", "build_tree", "build_chain_tree", "TreeMaskMode", "verify_tree_greedy",
    "tree_speculative_sampling_target_only", "eagle_sample", "fill_bonus_tokens", "top_k_renorm_prob",
    "top_p_renorm_prob",
]
KERNEL_NAMES = [
    "assign_extend_cache_locs", "assign_extend_cache_locs_uniform", "fill_front_out_cache_loc",
    "fill_accept_out_cache_loc", "move_kv_cache", "move_accept_tokens_to_target_kvcache",
    "compact_accept_to_front", "update_req_to_page", "compute_out_cache_loc",
    "compute_out_cache_loc_uniform", "fused_decode_input_prep", "update_block_table", "rotate_input_ids",
    "assign_hidden_states_pool",
]


def test_spec_names():
    for name in SPEC_NAMES:
        assert callable(getattr(jaxspec, name)), name


def test_kernel_names_and_implementation_switch():
    for name in KERNEL_NAMES:
        fn = getattr(jaxspec.kernels, name)
        if name in ("update_block_table", "compact_accept_to_front"):
            continue  # host-side packer / plain XLA gather
        params = inspect.signature(inspect.unwrap(fn)).parameters
        assert "implementation" in params and "interpret" in params, name


def test_output_field_names_match_issue():
    assert jaxspec.TreeOutput._fields[:6] == (
        "tree_mask", "positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling", "draft_tokens")
    assert jaxspec.VerifyOutput._fields == ("predict", "accept_index", "num_correct_drafts")
    assert set(jaxspec.EagleSampleOutput._fields) == {"predict", "accept_lens", "accept_index"}
    for field in jaxspec.VerifyOutput._fields:
        assert field in jaxspec.VerifyOutput.__doc__ or field in (jaxspec.verify_tree_greedy.__doc__ or ""), field
