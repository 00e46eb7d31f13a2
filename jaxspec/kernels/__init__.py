"""Pallas GPU kernels for paged attention, cache-location and KV-move work, each beside a pure-jnp reference.

Every public op takes ``implementation: Implementation`` (``"auto"``, ``"pallas"``, ``"reference"``, or a Pallas
backend by name, ``"triton"`` / ``"mosaic"``) and ``interpret=`` (run the Pallas kernel on CPU), resolved by one
function, ``_backend.resolve_implementation``, and follows one dispatch convention (``_dispatch.py``): validate on
the host -> resolve ``implementation`` -> one jitted ``KernelOp`` keyed on the static config, the implementation,
``interpret`` and checked mode. ``"auto"`` is the first Pallas kernel that can take the call on this device and
jax (for paged attention: the Mosaic GPU kernel on Hopper, else the Triton one, each only where its tiles fit
the GPU's shared memory), and the reference elsewhere (with one ``PallasBackendWarning`` when a lowering is
missing); an explicit ``"pallas"`` or backend name never falls back silently. Backend-specific imports live in
one module per backend (``_triton.py``, ``_mosaic_gpu.py``). The package imports nothing from the rest of
jaxspec: input validation and checked mode live in ``_validate.py``.

Out-of-range slots, pages, rows, accept indices and lengths have one defined behaviour, the same in the
reference and the kernel (a dropped write or a slot-0 read; see each module); checked mode
(``jaxspec.checks()``) flags them before anything is written.
"""

from jaxspec.kernels._backend import Implementation as Implementation
from jaxspec.kernels._backend import CPU_INVARIANT_FLAG as CPU_INVARIANT_FLAG
from jaxspec.kernels._backend import batch_invariance_blocker as batch_invariance_blocker
from jaxspec.kernels._dispatch import next_pow2 as next_pow2  # the bucket rule every static shape here follows
from jaxspec.kernels.cache_locs import assign_draft_cache_locs as assign_draft_cache_locs
from jaxspec.kernels.cache_locs import assign_extend_cache_locs as assign_extend_cache_locs
from jaxspec.kernels.cache_locs import assign_extend_cache_locs_uniform as assign_extend_cache_locs_uniform
from jaxspec.kernels.cache_locs import fill_accept_out_cache_loc as fill_accept_out_cache_loc
from jaxspec.kernels.cache_locs import fill_front_out_cache_loc as fill_front_out_cache_loc
from jaxspec.kernels.kv_move import KVBuffers as KVBuffers
from jaxspec.kernels.kv_move import MoveConfig as MoveConfig
from jaxspec.kernels.kv_move import compact_accept_to_front as compact_accept_to_front
from jaxspec.kernels.kv_move import dynamic_validate_move as dynamic_validate_move
from jaxspec.kernels.kv_move import move_accept_tokens_to_target_kvcache as move_accept_tokens_to_target_kvcache
from jaxspec.kernels.kv_move import move_kv_cache as move_kv_cache
from jaxspec.kernels.multi_layer_eagle import assign_hidden_states_pool as assign_hidden_states_pool
from jaxspec.kernels.multi_layer_eagle import rotate_input_ids as rotate_input_ids
from jaxspec.kernels.block_table import PageCapacityWarning as PageCapacityWarning
from jaxspec.kernels.block_table import pack_block_table_update as pack_block_table_update
from jaxspec.kernels.paged_cache_locs import compute_out_cache_loc as compute_out_cache_loc
from jaxspec.kernels.paged_cache_locs import compute_out_cache_loc_uniform as compute_out_cache_loc_uniform
from jaxspec.kernels.paged_cache_locs import fused_decode_input_prep as fused_decode_input_prep
from jaxspec.kernels.block_table import update_block_table as update_block_table
from jaxspec.kernels.paged_cache_locs import update_req_to_page as update_req_to_page
from jaxspec.kernels.paged_attention import paged_attention as paged_attention
from jaxspec.kernels.paged_attention import paged_attention_reference as paged_attention_reference
from jaxspec.kernels.paged_attention import qmask_from_bits as qmask_from_bits
from jaxspec.kernels.invariant_attention import invariant_attention as invariant_attention
from jaxspec.kernels.invariant_matmul import invariant_matmul as invariant_matmul
from jaxspec.kernels.invariant_matmul import invariant_matmul_reference as invariant_matmul_reference
from jaxspec.kernels.ordered_sum import ordered_sum as ordered_sum
