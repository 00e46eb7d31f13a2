"""The compiled entry points of the decode loops, shared by every ``Engine`` with equal structure and options.

``prefill`` (the target's prefill and the drafter's extend, one executable per prompt bucket), ``decode``
(the whole decode loop: a ``lax.while_loop`` over ``decode_step`` with per-request stopping, one executable
per batch and output bucket, whatever the prompts' lengths) and ``step`` (one round, for the host-driven
loop). ``Engine.generate`` dispatches prefill then decode without a host sync in between. The decode state
is donated.
"""

import functools
from typing import NamedTuple

import jax
from flax import nnx
from jax.experimental import checkify

from jaxspec.engine.state import EngineOptions
from jaxspec.engine.step import decode_loop, decode_step, prefill


class EntryPoints(NamedTuple):
    prefill: object
    step: object
    decode: object


def functionalize_checks(fn, checks: bool):
    """With checks on, functionalise the ``checkify.check``s traced into the kernels (``JAXSPEC_CHECKS``):
    the jitted function then returns ``(error, out)`` and the caller raises before reading ``out``."""
    return checkify.checkify(fn, errors=checkify.user_checks) if checks else fn


@functools.lru_cache(maxsize=64)
def entry_points(graphdef, treedef, opts: EngineOptions, checks: bool) -> EntryPoints:
    """Jitted entry points for one ((target, drafter) structure, options, checks) key, shared by every
    Engine with equal keys (trained and random weights, any EOS share one executable per input shape).

    ``graphdef`` is closed over instead of being a static argument, and each Engine looks its entry points up
    here once per checks setting (``Engine._entry_points``): hashing an NNX GraphDef costs ~3 ms (the demo
    pair's 24 layers on CPU: 4.3 ms of a 1-round decode call's 5 ms went to this cache key). Params
    travel as a flat list of leaves (``treedef`` closed over too): flattening an NNX State costs ~0.5 ms.
    """

    def _models(leaves):
        return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))

    def _prefill(params, state, prompts, lens):
        target, drafter = _models(params)
        return prefill(target, drafter, opts, state, prompts, lens)

    def _step(params, state):
        return decode_step(*_models(params), opts, state)

    def _decode(params, state, force_mode, max_rounds):
        return decode_loop(*_models(params), opts, state, force_mode, max_rounds)

    return EntryPoints(
        prefill=jax.jit(functionalize_checks(_prefill, checks), donate_argnums=(1,)),
        step=jax.jit(functionalize_checks(_step, checks), donate_argnums=(1,)),
        decode=jax.jit(functionalize_checks(_decode, checks), donate_argnums=(1,)),
    )


def split_models(target, drafter):
    """One NNX split of ``(target, drafter)`` (shared weights, e.g. an MTP head inside the target, travel
    once); every leaf must be an array. Returns ``(graphdef, treedef, leaves)``."""
    graphdef, state = nnx.split((target, drafter))
    leaves, treedef = jax.tree.flatten(state)
    for leaf in leaves:
        if not isinstance(leaf, jax.Array):
            raise ValueError(
                f"target / drafter: expected pytrees of jax arrays or NNX modules, found a leaf of type "
                f"{type(leaf).__name__} (mark configuration fields static)"
            )
    return graphdef, treedef, leaves
