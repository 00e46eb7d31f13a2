"""jaxspec.engine: compiled speculative and plain decode loops (greedy or sampled) over any target + drafter meeting
``jaxspec.protocols``; the slot API (``engine.slots``: requests prefilled into, decoded in and released from the
rows of one state) that ``Engine.generate`` and the serving core share."""

from jaxspec.engine.checks import check_prompts as check_prompts
from jaxspec.engine.checks import check_sampling as check_sampling
from jaxspec.engine.compiled import functionalize_checks as functionalize_checks
from jaxspec.engine.engine import Engine as Engine
from jaxspec.engine.engine import GenerateResult as GenerateResult
from jaxspec.engine.memory import prompt_bucket as prompt_bucket
from jaxspec.engine.state import DecodeState as DecodeState
from jaxspec.engine.state import EngineOptions as EngineOptions
from jaxspec.engine.policy import AdaptivePolicy as AdaptivePolicy
from jaxspec.engine.simulate import SimulatedAccept as SimulatedAccept
from jaxspec.engine.slots import SlotChunks as SlotChunks
from jaxspec.engine.slots import decode_slots as decode_slots
from jaxspec.engine.slots import prefill_slots as prefill_slots
from jaxspec.engine.slots import release_slots as release_slots
from jaxspec.engine.slots import with_tables as with_tables
from jaxspec.engine.state import SamplingParams as SamplingParams
from jaxspec.engine.step import adaptive_step as adaptive_step
from jaxspec.engine.step import plain_step as plain_step
from jaxspec.engine.step import prefill as prefill
from jaxspec.engine.step import spec_step as spec_step
