"""jaxspec.models: Llama-family decoders (Llama 2/3, Qwen2/2.5, Mistral) with DeepSeek-V3 MTP draft layers,
loaded from Hugging Face safetensors checkpoints or llama GGUF files (``load_model``), over a paged KV cache
(Flax NNX); a target with its EAGLE-3 or MTP draft head and the drafter in one call (``load_target_with_head``);
real models fetched by name into the user cache (``fetch_model("smollm2-135m-instruct")``); the shipped tiny pair
(``load_pair()``: the ``MTPModel`` of ``DEFAULT_WEIGHTS``) and the demo's deeper pair (``DEMO_WEIGHTS``)."""

from jaxspec.models.checkpoint import load_model as load_model
from jaxspec.models.checkpoint import save_model as save_model
from jaxspec.models.config import DecoderConfig as DecoderConfig
from jaxspec.models.decoder import Decoder as Decoder
from jaxspec.models.gguf import read_gguf_config as read_gguf_config
from jaxspec.models.gguf import read_gguf_info as read_gguf_info
from jaxspec.models.io import DEFAULT_WEIGHTS as DEFAULT_WEIGHTS
from jaxspec.models.io import DEMO_PAIR_CONFIG as DEMO_PAIR_CONFIG
from jaxspec.models.io import DEMO_WEIGHTS as DEMO_WEIGHTS
from jaxspec.models.io import TINY_PAIR_CONFIG as TINY_PAIR_CONFIG
from jaxspec.models.io import load_pair as load_pair
from jaxspec.models.io import save_pair as save_pair
from jaxspec.models.eagle3 import EAGLE3Model as EAGLE3Model
from jaxspec.models.eagle3 import Eagle3Config as Eagle3Config
from jaxspec.models.eagle3 import aux_layers_from_ids as aux_layers_from_ids
from jaxspec.models.eagle3 import load_eagle3 as load_eagle3
from jaxspec.models.eagle3 import save_eagle3 as save_eagle3
from jaxspec.models.eagle3_drafter import EAGLE3Drafter as EAGLE3Drafter
from jaxspec.models.eagle3_drafter import EAGLE3DraftState as EAGLE3DraftState
from jaxspec.models.heads import HEAD_KINDS as HEAD_KINDS
from jaxspec.models.heads import TargetWithHead as TargetWithHead
from jaxspec.models.heads import head_kind as head_kind
from jaxspec.models.heads import load_mtp_head as load_mtp_head
from jaxspec.models.heads import load_target_with_head as load_target_with_head
from jaxspec.models.heads import shipped_head as shipped_head
from jaxspec.models.mtp_drafter import MTPDrafter as MTPDrafter
from jaxspec.models.mtp_drafter import MTPDraftState as MTPDraftState
from jaxspec.models.mtp import MTPModel as MTPModel
from jaxspec.models.mtp import add_mtp_layers as add_mtp_layers
from jaxspec.models.mtp import with_draft_vocab as with_draft_vocab
from jaxspec.models.vocab import MockVocab as MockVocab
from jaxspec.protocols import PagedKVCache as PagedKVCache
from jaxspec.protocols import make_req_to_token as make_req_to_token
from jaxspec.protocols import num_pages_needed as num_pages_needed


def __getattr__(name):
    # ``MODELS`` and ``fetch_model`` are imported on first use, so ``python -m jaxspec.models.fetch`` runs a module that
    # importing the package has not loaded already (runpy warns about that)
    if name in ("MODELS", "fetch_model"):
        from jaxspec.models import fetch  # noqa: PLC0415

        return getattr(fetch, name)
    raise AttributeError(f"module 'jaxspec.models' has no attribute {name!r}")
