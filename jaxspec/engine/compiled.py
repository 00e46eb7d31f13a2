"""The compiled entry points of the decode loops, shared by every ``Engine`` with equal structure and options.

They are the slot API's (``engine.slots``), the one compiled form of each piece for ``Engine.generate`` and
the serving core alike: ``prefill`` / ``prefill_chunk`` (``prefill_slots`` of a batch of last / non-final
chunks: the target's prefill and the drafter's extend, one executable per chunk-count and prompt bucket),
``decode`` (``decode_slots``: the decode loop, a ``lax.while_loop`` over ``decode_step`` with per-request
stopping, over a static slot bucket; one executable per bucket and output width, whatever the prompts'
lengths) and ``step`` (one round, for the host-driven loop). ``Engine.generate`` dispatches prefill then
decode without a host sync in between. The decode state is donated.
"""

import functools
from typing import NamedTuple

import jax
from flax import nnx
from jax.experimental import checkify

from jaxspec.engine.state import EngineOptions
from jaxspec.engine.slots import decode_slots, prefill_slots
from jaxspec.engine.step import decode_step


class EntryPoints(NamedTuple):
    prefill: object  # (params, state, chunks: SlotChunks) -> state: last chunks
    prefill_chunk: object  # the same for non-final chunks
    step: object  # (params, state) -> state: one round
    decode: object  # (params, state, force_mode, max_rounds, first_finish, bucket=) -> state


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

    def _prefill(final, params, state, chunks):
        return prefill_slots(*_models(params), opts, state, chunks, final=final)

    def _step(params, state):
        return decode_step(*_models(params), opts, state)

    def _decode(params, state, force_mode, max_rounds, first_finish, bucket):
        def run(params, state, force_mode, max_rounds, first_finish):
            return decode_slots(*_models(params), opts, state, bucket=bucket, max_rounds=max_rounds,
                                force_mode=force_mode, first_finish=first_finish)

        return functionalize_checks(run, checks)(params, state, force_mode, max_rounds, first_finish)

    return EntryPoints(
        prefill=jax.jit(functionalize_checks(functools.partial(_prefill, True), checks), donate_argnums=(1,)),
        prefill_chunk=jax.jit(functionalize_checks(functools.partial(_prefill, False), checks), donate_argnums=(1,)),
        step=jax.jit(functionalize_checks(_step, checks), donate_argnums=(1,)),
        decode=jax.jit(_decode, donate_argnums=(1,), static_argnames=("bucket",)),
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
