"""Adaptive speculation: the per-round choice between plain decoding and the engine's draft shapes.

Modes: ``0`` = plain decoding, ``1 + i`` = a speculative round with ``specs[i]``. A round of mode ``m`` yields
``accept(m)`` tokens per active request (plain: 1) and costs ``round_cost[m]`` seconds for the whole batch
bucket; rows of finished requests are still computed, so the cost of a round depends on the bucket ``B``
(static, one executable per bucket), never on how many requests are left, and the best mode is the one with
the highest ``accept(m) / round_cost[m]``. ``round_cost`` is measured on the device for the bucket
(``Engine.calibrate``, values in the state: new costs never recompile); ``accept`` is a running average of
the accept lengths the mode had, counted per request-round: a round of ``n`` active requests weighs as ``n``
observations of weight ``ema_weight`` each (``1 - (1 - ema_weight) ** n``), so one request's round at batch 1
moves the average little (its accept length is 1 to ``S + 1``, a single draw) and a round of 32 requests,
whose mean is already an average, moves it much; until the mode has ``1 / ema_weight`` request-rounds the
average is their plain mean (weight ``max(that, n / seen)``, ``seen`` the request-rounds so far). It starts
optimistic (``S + 1``) until the mode's first round, whose accept length replaces it. A speculative mode, once
it runs, runs at least ``probe_rounds`` rounds in a row, and a mode whose average is fresh (its first run, or a
probe) at least until the average holds ``probe_requests`` request-rounds: at batch 1 four rounds are four
single draws, too few to switch a shape off on.

Probes: a speculative mode that is not the best runs again (``probe_rounds`` rounds) when its optimistic rate
could beat the best and it has waited ``probe_interval * backoff[m]`` rounds of its own cost (``idle[m] *
round_cost[best] >= probe_interval * backoff[m] * round_cost[m] * stretch``), so a shape switched off by low
acceptance is tried again when the text gets easier. ``stretch`` is how much longer than ``probe_rounds`` a probe
runs at the batch's current size (``ceil(probe_requests / rows) / probe_rounds``, at least 1; ``rows`` the active
requests of the last round): at batch 1 a probe runs 16 rounds to hold 16 request-rounds, and waits 4x longer.
A probe measures afresh: a mode that starts a run after ``probe_interval`` idle rounds or more forgets its old
average (its first round replaces it, as the first round replaces the optimistic start), so an average learned on
other text (or in an earlier call) never keeps a good shape off. Probing a losing shape costs at most
``probe_rounds / probe_interval`` of the time, whatever the batch, halving after each probe it loses
(``backoff`` doubles, up to ``MAX_BACKOFF``, so a shape is probed at least every ``probe_interval * MAX_BACKOFF``
rounds of its cost, times ``stretch``; a round in which the mode is the best resets it to 1).

Warm start (``AdaptivePolicy.warm_start``, on by default): the engine keeps each batch bucket's running
accept lengths, probe waits and back-offs from one decode call to the next (``Engine.policy_memory``): how
well a draft predicts is a property of the model pair and the workload, not of one batch, so only the
first call of a bucket pays for exploration. Every mode is lossless; the choice is made every round inside
the compiled loop (no host sync): ``step.decode_loop`` runs each mode as a segment of rounds and switches
only when the choice changes.

Switching costs no acceptance: the drafter state of every draft shape is extended with every committed token
(``step.extend_draft_states``): a speculative round extends it with its accepted window; plain rounds keep their
tokens and the target's features and extend it once per run of up to ``step.PLAIN_EXTEND_WINDOW`` rounds
(``step.plain_segment``; the window ends when the policy leaves plain), so a shape always drafts from a state
that has every committed position, and a plain round costs a plain step plus a share of one drafter extend. Shapes whose states the
drafter declares equal (``Drafter.state_key``, e.g. EAGLE-3 chains of any length) share one extend.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

MAX_BACKOFF = 16  # the longest probe wait, in multiples of probe_interval


@dataclasses.dataclass(frozen=True)
class AdaptivePolicy:
    """Static settings of adaptive speculation (``Engine(..., spec=(...), adaptive=AdaptivePolicy())``).

    ema_weight: weight of one request's round in a mode's running accept length, in ``(0, 1]`` (a round of ``n``
      active requests weighs ``1 - (1 - ema_weight) ** n``; module docstring).
    probe_interval: a losing speculative mode is probed again after this many rounds' worth of its own round
      cost (>= 1; module docstring): probing costs at most ``probe_rounds / probe_interval`` of the time.
    probe_rounds: the fewest rounds a speculative mode runs in a row once it runs (>= 1), so that its accept
      length is judged on more than one round.
    probe_requests: the fewest request-rounds a fresh average (a mode's first run, or a probe) is judged on
      (>= 1): a run goes on past ``probe_rounds`` rounds until its average holds that many.
    warm_start: carry each batch bucket's learned acceptance from one decode call to the next
      (``Engine.policy_memory``); ``False``: every call starts from the optimistic prior and explores.
    """

    ema_weight: float = 1 / 32
    probe_interval: int = 64
    probe_rounds: int = 4
    probe_requests: int = 16
    warm_start: bool = True

    def __post_init__(self):
        w = self.ema_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 < float(w) <= 1.0:
            raise ValueError(f"AdaptivePolicy.ema_weight: expected a float in (0, 1], got {w!r}")
        p = self.probe_interval
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ValueError(f"AdaptivePolicy.probe_interval: expected an int >= 1, got {p!r}")
        r = self.probe_rounds
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"AdaptivePolicy.probe_rounds: expected an int >= 1, got {r!r}")
        q = self.probe_requests
        if isinstance(q, bool) or not isinstance(q, int) or q < 1:
            raise ValueError(f"AdaptivePolicy.probe_requests: expected an int >= 1, got {q!r}")
        if not isinstance(self.warm_start, bool):
            raise ValueError(f"AdaptivePolicy.warm_start: expected a bool, got {self.warm_start!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PolicyState:
    """What the compiled loop carries for the policy (``M`` = 1 + number of draft shapes).

    round_cost: ``f32[M]`` seconds per round of each mode at this batch bucket (``Engine.calibrate``).
    max_accept: ``f32[M]`` the most a round of each mode can accept (plain 1, spec ``S + 1``).
    accept: ``f32[M]`` running accept length per mode (plain fixed at 1).
    seen: ``i32[M]`` request-rounds in the mode's average since it (re)started (0: ``accept`` is the optimistic
      start, or is forgotten at the next round; plain 1).
    streak: ``i32[M]`` rounds the mode ran in a row up to the last round (0 for the modes that did not run it).
    idle: ``i32[M]`` rounds since each mode last ran.
    backoff: ``i32[M]`` probe wait multiplier per mode (1 .. ``MAX_BACKOFF``).
    mode_rounds: ``i32[M]`` rounds each mode ran in this decode call (statistics).
    rows: ``i32[]`` active requests of the last round (at least 1; 1 before the first): the size a probe's length
      is planned for.
    """

    round_cost: jax.Array
    max_accept: jax.Array
    accept: jax.Array
    seen: jax.Array
    streak: jax.Array
    idle: jax.Array
    backoff: jax.Array
    mode_rounds: jax.Array
    rows: jax.Array


def init_policy_state(round_cost, max_accept, learned: PolicyState | None = None) -> PolicyState:
    """Policy state of a new decode call: every speculative mode at its optimistic accept length ``S + 1``,
    or, with ``learned`` (a previous call's final state at the same bucket), its accept lengths, exploration,
    idle rounds and back-offs; ``round_cost`` is always the given one and ``mode_rounds`` starts at 0."""
    cost = np.asarray(round_cost, np.float32)
    top = np.asarray(max_accept, np.float32)
    if cost.shape != top.shape or cost.ndim != 1 or not np.all(np.isfinite(cost)) or np.any(cost <= 0):
        raise ValueError(f"round_cost: expected {top.shape[0]} positive finite seconds (one per mode), got {cost}")
    m = cost.shape[0]
    if learned is not None:
        if learned.accept.shape != (m,):
            raise ValueError(f"learned: expected a PolicyState of {m} modes, got accept {learned.accept.shape}")
        return PolicyState(
            round_cost=jnp.asarray(cost), max_accept=jnp.asarray(top), accept=jnp.array(learned.accept),
            seen=jnp.array(learned.seen), streak=jnp.zeros((m,), jnp.int32), idle=jnp.array(learned.idle),
            backoff=jnp.array(learned.backoff), mode_rounds=jnp.zeros((m,), jnp.int32), rows=jnp.array(learned.rows),
        )
    return PolicyState(
        round_cost=jnp.asarray(cost), max_accept=jnp.asarray(top), accept=jnp.asarray(top.copy()),
        seen=jnp.asarray((np.arange(m) == 0).astype(np.int32)), streak=jnp.zeros((m,), jnp.int32),
        idle=jnp.zeros((m,), jnp.int32),
        backoff=jnp.ones((m,), jnp.int32), mode_rounds=jnp.zeros((m,), jnp.int32), rows=jnp.ones((), jnp.int32),
    )


def _short_of_evidence(policy: AdaptivePolicy, streak, seen):
    """Whether a speculative run of ``streak`` rounds must go on: fewer than ``probe_rounds`` rounds, or an
    average of fewer than ``probe_requests`` request-rounds (``seen`` counts since the average's last restart,
    so only a fresh one can be short)."""
    return (streak < policy.probe_rounds) | (seen < policy.probe_requests)


def _probe_terms(policy: AdaptivePolicy, ps: PolicyState):
    """``(best i32[], probed bool[M], wait f32[M])``: the best mode by ``accept / round_cost``, the speculative
    modes that could beat it (probe candidates), and each mode's probe wait in seconds (``probe_interval *
    backoff * round_cost * stretch``; module docstring), which ``idle * round_cost[best]`` must reach."""
    rate = ps.accept / ps.round_cost
    best = jnp.argmax(rate).astype(jnp.int32)
    probed = (ps.max_accept / ps.round_cost > rate[best]) & (jnp.arange(rate.shape[0]) > 0)
    probe_len = jnp.maximum(policy.probe_rounds, (policy.probe_requests + ps.rows - 1) // ps.rows)  # rounds
    stretch = probe_len.astype(jnp.float32) / jnp.float32(policy.probe_rounds)
    wait = jnp.float32(policy.probe_interval) * ps.backoff.astype(jnp.float32) * ps.round_cost * stretch
    return best, probed, wait


def choose_mode(policy: AdaptivePolicy, ps: PolicyState) -> jax.Array:
    """``i32[]`` mode of the next round: a speculative mode short of ``probe_rounds`` rounds in a row (or of
    ``probe_requests`` request-rounds in a fresh average) goes on; else the best ``accept / round_cost``, or a due
    probe (lowest mode first)."""
    best, probed, wait = _probe_terms(policy, ps)
    going = (ps.streak > 0) & (jnp.arange(wait.shape[0]) > 0) & (_short_of_evidence(policy, ps.streak, ps.seen))
    due = (ps.idle.astype(jnp.float32) * ps.round_cost[best] >= wait) & probed
    pick = jnp.where(jnp.any(due), jnp.argmax(due).astype(jnp.int32), best)
    return jnp.where(jnp.any(going), jnp.argmax(going).astype(jnp.int32), pick)


def plain_rounds_left(policy: AdaptivePolicy, ps: PolicyState) -> jax.Array:
    """``i32[]``: how many plain rounds in a row ``choose_mode`` goes on choosing from ``ps`` where it chooses plain
    now (a run of plain rounds changes only the modes' idle counts, so the choice can change only when a probe
    falls due; fewer active rows later only make the wait longer): the rounds before the first speculative mode
    that could win has waited its probe wait (``2**30`` when none could win). Exact: the same float32
    comparison as ``choose_mode``'s. From a state where ``choose_mode`` does not choose plain, 0 or more."""
    best, probed, wait = _probe_terms(policy, ps)
    cost = ps.round_cost[best]
    # the least r >= 0 with float32(idle + r) * cost >= wait: from the quotient, then its float32 neighbours
    guess = jnp.ceil(wait / cost).astype(jnp.int32) - ps.idle
    cands = jnp.maximum(guess[:, None] + jnp.arange(-2, 3, dtype=jnp.int32)[None, :], 0)  # [M, 5], ascending
    due = (ps.idle[:, None] + cands).astype(jnp.float32) * cost >= wait[:, None]
    first = jnp.where(jnp.any(due, axis=1), jnp.min(jnp.where(due, cands, 2**30), axis=1), guess + 3)
    return jnp.min(jnp.where(probed, first, 2**30)).astype(jnp.int32)


def advance_plain(ps: PolicyState, rounds: jax.Array, requests: jax.Array, rows: jax.Array) -> PolicyState:
    """``ps`` after ``rounds`` plain rounds (``i32[]``, >= 0) of ``requests`` request-rounds in all, the last of
    ``rows`` active requests: what ``rounds`` calls of ``update_policy(.., mode=0, .., rows_i)`` give (plain's
    average is fixed; no back-off changes), in one update."""
    m = ps.accept.shape[0]
    hit = jnp.arange(m) == 0
    ran = rounds > 0
    return dataclasses.replace(
        ps, seen=jnp.where(hit, jnp.minimum(ps.seen + requests, 2**30), ps.seen),
        streak=jnp.where(ran, jnp.where(hit, ps.streak + rounds, 0), ps.streak),
        idle=jnp.where(ran, jnp.where(hit, 0, ps.idle + rounds), ps.idle),
        mode_rounds=ps.mode_rounds + jnp.where(hit, rounds, 0), rows=jnp.where(ran & (rows > 0), rows, ps.rows),
    )


def update_policy(policy: AdaptivePolicy, ps: PolicyState, mode: jax.Array, accept: jax.Array,
                  rows: jax.Array | int = 1) -> PolicyState:
    """Fold the round's mean accept length ``accept`` over its ``rows`` active requests (``f32[]``, ``i32[]``)
    into mode ``mode``'s average with weight ``max(1 - (1 - ema_weight) ** rows, rows / seen)`` (``seen`` its
    request-rounds including these; a mode starting a run after ``probe_interval`` idle rounds or more restarts
    its average, so its first round replaces it); the mode's back-off resets if it is now the best, else doubles
    (once per probe: at its ``probe_rounds``-th round in a row or later). A round of no active request changes no
    average."""
    m = ps.accept.shape[0]
    hit = jnp.arange(m) == mode
    n = jnp.asarray(rows, jnp.int32)
    fresh = (ps.streak == 0) & (ps.idle >= policy.probe_interval)  # a probe measures afresh
    seen0 = jnp.where(fresh & hit & (mode > 0), 0, ps.seen)
    seen = jnp.where(hit, jnp.minimum(seen0 + n, 2**30), seen0)
    nf = n.astype(jnp.float32)
    w_ema = 1.0 - jnp.power(1.0 - jnp.float32(policy.ema_weight), nf)
    w = jnp.maximum(w_ema, nf / jnp.maximum(seen, 1).astype(jnp.float32))
    avg = (1 - w) * ps.accept + w * accept
    new = jnp.where(hit & (mode > 0) & (n > 0), avg, ps.accept)
    rate = new / ps.round_cost
    wins = rate[mode] >= jnp.max(rate)
    streak = jnp.where(hit, ps.streak + 1, 0)
    judged = ~_short_of_evidence(policy, streak, seen)
    lost = jnp.where(judged, jnp.minimum(ps.backoff * 2, MAX_BACKOFF), ps.backoff)
    backoff = jnp.where(hit & (mode > 0), jnp.where(wins, 1, lost), ps.backoff)
    return dataclasses.replace(
        ps, accept=new, seen=seen, streak=streak, idle=jnp.where(hit, 0, ps.idle + 1), backoff=backoff,
        mode_rounds=ps.mode_rounds + hit.astype(jnp.int32), rows=jnp.where(n > 0, n, ps.rows),
    )


__all__ = ["MAX_BACKOFF", "AdaptivePolicy", "PolicyState", "advance_plain", "choose_mode", "init_policy_state",
           "plain_rounds_left", "update_policy"]
