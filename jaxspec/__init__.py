"""jaxspec: speculative decoding (EAGLE/MTP chain and tree speculation) in JAX/Pallas for NVIDIA GPUs.

The pipeline ops mirror SGLang 0.5.23 (``python/sglang/srt/speculative/`` and
``python/sglang/kernels/ops/speculative/``) and are pure, jittable and static-shaped. Kernels live in
``jaxspec.kernels``, the torch interop in ``jaxspec.interop`` (imported on demand: ``import jaxspec``
needs neither torch nor triton), the tiny model pair in ``jaxspec.models`` and the compiled decoding
loop in ``jaxspec.engine``.
"""

from jaxspec._validate import checked as checked
from jaxspec._validate import checks as checks
from jaxspec.config import SpecConfig as SpecConfig
from jaxspec.ops.accept import EagleSampleOutput as EagleSampleOutput
from jaxspec.ops.accept import eagle_sample as eagle_sample
from jaxspec.ops.accept import fill_bonus_tokens as fill_bonus_tokens
from jaxspec.ops.accept import make_coins as make_coins
from jaxspec.ops.draft import DraftResults as DraftResults
from jaxspec.ops.draft import SelectTopKOutput as SelectTopKOutput
from jaxspec.ops.draft import TreeInfo as TreeInfo
from jaxspec.ops.draft import chain_draft_results as chain_draft_results
from jaxspec.ops.draft import organize_draft_results as organize_draft_results
from jaxspec.ops.draft import organize_mtp_draft_results as organize_mtp_draft_results
from jaxspec.ops.draft import select_top_k_tokens as select_top_k_tokens
from jaxspec.ops.tree import TreeMaskMode as TreeMaskMode
from jaxspec.ops.tree import TreeOutput as TreeOutput
from jaxspec.ops.tree import build_chain_tree as build_chain_tree
from jaxspec.ops.tree import build_tree as build_tree
from jaxspec.ops.verify import VerifyOutput as VerifyOutput
from jaxspec.ops.verify import top_k_renorm_prob as top_k_renorm_prob
from jaxspec.ops.verify import top_p_renorm_prob as top_p_renorm_prob
from jaxspec.ops.verify import tree_speculative_sampling_target_only as tree_speculative_sampling_target_only
from jaxspec.ops.verify import verify_tree_greedy as verify_tree_greedy

__version__ = "0.1.0"
