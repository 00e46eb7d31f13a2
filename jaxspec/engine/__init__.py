"""jaxspec.engine: compiled speculative and plain decode loops (greedy or sampled) over any target + drafter meeting
``jaxspec.protocols``."""

from jaxspec.engine.engine import Engine as Engine
from jaxspec.engine.engine import GenerateResult as GenerateResult
from jaxspec.engine.state import DecodeState as DecodeState
from jaxspec.engine.state import EngineOptions as EngineOptions
from jaxspec.engine.policy import AdaptivePolicy as AdaptivePolicy
from jaxspec.engine.simulate import SimulatedAccept as SimulatedAccept
from jaxspec.engine.state import SamplingParams as SamplingParams
from jaxspec.engine.step import adaptive_step as adaptive_step
from jaxspec.engine.step import plain_step as plain_step
from jaxspec.engine.step import prefill as prefill
from jaxspec.engine.step import spec_step as spec_step
