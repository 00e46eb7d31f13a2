"""jaxspec.models: tiny Llama-style target + MTP layers over a paged KV cache (Flax NNX), and the MTP drafter."""

from jaxspec.models.cache import PagedKVCache as PagedKVCache
from jaxspec.models.cache import init_cache as init_cache
from jaxspec.models.cache import make_req_to_token as make_req_to_token
from jaxspec.models.cache import num_pages_needed as num_pages_needed
from jaxspec.models.config import ModelConfig as ModelConfig
from jaxspec.models.io import DEFAULT_WEIGHTS as DEFAULT_WEIGHTS
from jaxspec.models.io import load_pair as load_pair
from jaxspec.models.io import save_pair as save_pair
from jaxspec.models.llama import ForwardInputs as ForwardInputs
from jaxspec.models.llama import TinyPair as TinyPair
from jaxspec.models.llama import causal_mask as causal_mask
from jaxspec.models.mtp_drafter import MTPDrafter as MTPDrafter
from jaxspec.models.mtp_drafter import MTPDraftState as MTPDraftState
from jaxspec.models.vocab import MockVocab as MockVocab
