"""Bring your own model: a third-party target and an EAGLE-3-shaped drafter, defined HERE (nothing from
``jaxspec.models``), run in the engine through ``jaxspec.protocols`` alone, losslessly.

* ``ToyTarget``: a pure-JAX pytree decoder (learned position embedding, multi-head attention written here
  over ``AttentionMetadata``: the prefix is gathered through ``page_table`` / ``page_size``, fresh tokens
  see each other through ``qmask``, K/V written to ``write_locs`` after attention). Its ``hidden`` feature
  is the concatenation of chosen layers' outputs (EAGLE-3's auxiliary hidden states).
* ``Eagle3Drafter``: a separate one-layer draft model fed ``fc(aux features)`` with its own KV cache and
  its own smaller vocabulary, mapped to the target's through a ``d2t`` offset table (EAGLE-3's layout:
  ``target_id = draft_id + d2t[draft_id]``); beam search over K beams for S steps (K == 1: a chain).

Both models share a "bigram" path (the next token depends mostly on the current one) so that drafts are
often accepted and the accept / KV-move / compaction paths of the round run, not only rejections.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.config import SpecConfig
from jaxspec.engine import Engine
from jaxspec.ops.draft import organize_draft_results, select_top_k_tokens
from jaxspec.protocols import AttentionMetadata, PagedKVCache

V, D, L, H, E = 64, 32, 3, 2, 16  # target: vocab, width, layers, heads, head dim
AUX = (0, 1, 2)  # target layers whose outputs form the drafter's feature (F = 3 * D)
VD, DD = 32, 32  # draft vocab, draft width
W, MAX_NEW, PAGE = 64, 20, 16
CHAIN = SpecConfig(num_steps=3, topk=1, num_draft_tokens=4)
TREE = SpecConfig(num_steps=3, topk=2, num_draft_tokens=6)
_PREC = jax.lax.Precision.HIGHEST


def _static(default=None):
    return dataclasses.field(default=default, metadata=dict(static=True))


def _attend(q, k_new, v_new, meta: AttentionMetadata, cache_k, cache_v):
    """Multi-head attention of fresh ``q/k/v (B, Q, H, E)`` over the paged prefix + the fresh tokens."""
    w = meta.page_table.shape[1] * meta.page_size  # every position a row's pages can hold
    slots = meta.prefix_slots(w)  # (B, W') from page_table / page_size
    k_pre, v_pre = cache_k[slots], cache_v[slots]  # (B, W', H, E)
    pre_ok = jnp.arange(w)[None, :] < meta.prefix_lens[:, None]
    s_pre = jnp.einsum("bqhe,bwhe->bhqw", q, k_pre, precision=_PREC)
    s_new = jnp.einsum("bqhe,bkhe->bhqk", q, k_new, precision=_PREC)
    s = jnp.concatenate(
        [jnp.where(pre_ok[:, None, None, :], s_pre, -1e30), jnp.where(meta.qmask[:, None], s_new, -1e30)], -1
    ) * (q.shape[-1] ** -0.5)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhe->bqhe", p, jnp.concatenate([v_pre, v_new], 1), precision=_PREC)


def _write(cache_k, cache_v, meta, k, v):
    if meta.write_locs is None:
        return cache_k, cache_v
    flat = meta.write_locs.reshape(-1)
    return cache_k.at[flat].set(k.reshape(flat.shape[0], H, E)), cache_v.at[flat].set(v.reshape(flat.shape[0], H, E))


def _layer(p, x, meta, ck, cv):
    b, q, _ = x.shape
    qh, kh, vh = (jnp.einsum("bqd,df->bqf", x, p[n], precision=_PREC).reshape(b, q, H, E) for n in ("wq", "wk", "wv"))
    a = _attend(qh, kh, vh, meta, ck, cv).reshape(b, q, H * E)
    x = x + jnp.einsum("bqf,fd->bqd", a, p["wo"], precision=_PREC)
    ck, cv = _write(ck, cv, meta, kh, vh)
    return x + jnp.tanh(jnp.einsum("bqd,de->bqe", x, p["w1"], precision=_PREC)) @ p["w2"], ck, cv


def _layer_params(key, d):
    ks = jax.random.split(key, 6)
    shapes = {"wq": (d, H * E), "wk": (d, H * E), "wv": (d, H * E), "wo": (H * E, d), "w1": (d, 2 * d), "w2": (2 * d, d)}
    return {n: jax.random.normal(k, s, jnp.float32) * 0.3 * s[0] ** -0.5 for k, (n, s) in zip(ks, shapes.items())}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ToyTarget:
    """A third-party target: a pytree of arrays with static configuration; meets ``TargetModel``."""

    embed: jax.Array  # (V, D)
    pos_embed: jax.Array  # (W, D)
    layers: list  # L dicts of weights
    bigram: jax.Array  # (V, V): the dominant "next token given this token" logits
    head: jax.Array  # (D, V)
    vocab_size: int = _static(V)
    feature_size: int = _static(len(AUX) * D)

    @staticmethod
    def create(key, bigram):
        ks = jax.random.split(key, L + 3)
        return ToyTarget(
            embed=jax.random.normal(ks[0], (V, D), jnp.float32),
            pos_embed=jax.random.normal(ks[1], (W, D), jnp.float32) * 0.3,
            layers=[_layer_params(k, D) for k in ks[2 : 2 + L]],
            bigram=bigram,
            head=jax.random.normal(ks[-1], (D, V), jnp.float32) * 0.3,
        )

    def kv_bytes_per_slot(self) -> int:
        return L * 2 * H * E * 4

    def make_cache(self, req_to_token, num_slots):
        z = jnp.zeros((L, num_slots, H, E), jnp.float32)
        return PagedKVCache(k=z, v=jnp.zeros_like(z), req_to_token=jnp.asarray(req_to_token, jnp.int32))

    def forward(self, tokens, meta, cache):
        x = self.embed[tokens] + self.pos_embed[jnp.minimum(meta.positions, W - 1)]
        ks, vs, aux = [], [], []
        for i, p in enumerate(self.layers):
            x, ck, cv = _layer(p, x, meta, cache.k[i], cache.v[i])
            ks.append(ck)
            vs.append(cv)
            if i in AUX:
                aux.append(x)
        logits = self.bigram[tokens] + jnp.einsum("bqd,dv->bqv", x, self.head, precision=_PREC)
        cache = dataclasses.replace(cache, k=jnp.stack(ks), v=jnp.stack(vs))
        return logits, jnp.concatenate(aux, -1), cache


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle3State:
    cache: PagedKVCache  # one draft layer
    topk_p: jax.Array  # (B, K) first-step probabilities at the last real row
    topk_index: jax.Array  # (B, K) first-step tokens, TARGET ids
    hidden: jax.Array  # (B, DD) draft hidden at that row


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Eagle3Drafter:
    """EAGLE-3-shaped drafter: ``fc`` over the target's auxiliary features, one decoder layer with its own
    KV, a ``VD``-token head mapped to target ids by ``d2t``. Meets ``Drafter``."""

    embed: jax.Array  # (V, DD): input tokens are target ids
    fc: jax.Array  # (3D, DD)
    proj: jax.Array  # (2 DD, DD)
    layer: dict
    bigram: jax.Array  # (V, VD)
    head: jax.Array  # (DD, VD)
    d2t: jax.Array  # (VD,) offsets: target id = draft id + d2t[draft id]

    @staticmethod
    def create(key, bigram, draft_vocab):
        ks = jax.random.split(key, 5)
        return Eagle3Drafter(
            embed=jax.random.normal(ks[0], (V, DD), jnp.float32),
            fc=jax.random.normal(ks[1], (len(AUX) * D, DD), jnp.float32) * (len(AUX) * D) ** -0.5,
            proj=jax.random.normal(ks[2], (2 * DD, DD), jnp.float32) * (2 * DD) ** -0.5,
            layer=_layer_params(ks[3], DD),
            bigram=bigram[:, draft_vocab],
            head=jax.random.normal(ks[4], (DD, VD), jnp.float32) * 0.3,
            d2t=jnp.asarray(draft_vocab - np.arange(VD), jnp.int32),
        )

    def kv_bytes_per_slot(self, spec) -> int:
        return 2 * H * E * 4

    def init_state(self, spec, req_to_token, num_slots):
        b, k = req_to_token.shape[0], spec.topk
        z = jnp.zeros((1, num_slots, H, E), jnp.float32)
        cache = PagedKVCache(k=z, v=jnp.zeros_like(z), req_to_token=jnp.asarray(req_to_token, jnp.int32))
        return Eagle3State(cache, jnp.zeros((b, k), jnp.float32), jnp.zeros((b, k), jnp.int32), jnp.zeros((b, DD), jnp.float32))

    def _step(self, tokens, h, meta, cache):
        """One draft forward: ``tokens (B, Q)`` target ids, ``h (B, Q, DD)`` -> (target-id probs top-k input)."""
        x = jnp.concatenate([self.embed[tokens], h], -1) @ self.proj
        x, ck, cv = _layer(self.layer, x, meta, cache.k[0], cache.v[0])
        logits = self.bigram[tokens] + jnp.einsum("bqd,dv->bqv", x, self.head, precision=_PREC)
        return jax.nn.softmax(logits, -1), x, dataclasses.replace(cache, k=ck[None], v=cv[None])

    def _topk(self, probs, k):
        p, i = jax.lax.top_k(probs, k)
        return p, (i + self.d2t[i]).astype(jnp.int32)  # draft ids -> target ids

    def _extend(self, spec, state, next_tokens, feats, meta, select):
        b, q = next_tokens.shape
        probs, x, cache = self._step(next_tokens, feats @ self.fc, meta, state.cache)
        p, idx = self._topk(probs.reshape(b * q, -1)[select], spec.topk)
        return Eagle3State(cache, p, idx, x.reshape(b * q, -1)[select])

    def extend_after_prefill(self, spec, state, tokens, hidden, meta, prompt_lens, first_tokens):
        b, p = tokens.shape
        j = jnp.arange(p)[None, :]
        nxt = jnp.where(j == prompt_lens[:, None] - 1, first_tokens[:, None], jnp.roll(tokens, -1, axis=1))
        return self._extend(spec, state, nxt, hidden, meta, jnp.arange(b) * p + prompt_lens - 1)

    def extend_after_verify(self, spec, state, tokens, hidden, meta, accept_lens):
        b, n = tokens.shape
        return self._extend(spec, state, tokens, hidden, meta, jnp.arange(b) * n + accept_lens - 1)

    def propose(self, spec, state, bonus, meta):
        """Beam search (K beams, S steps; K == 1 is a chain), beams at the last committed row attending to
        the draft's committed KV and themselves (nothing written)."""
        k, (b, d) = spec.topk, state.hidden.shape
        sel = select_top_k_tokens(0, state.topk_p, state.topk_index, state.hidden, None, topk=k)
        lists = ([sel.tree_info.scores], [sel.tree_info.tokens], [sel.tree_info.parents])
        row = meta.prefix_lens - 1
        beam = dataclasses.replace(
            meta, positions=jnp.broadcast_to(row[:, None], (b, k)), prefix_lens=row, write_locs=None,
            qmask=jnp.broadcast_to(jnp.eye(k, dtype=bool)[None], (b, k, k)),
        )
        for i in range(1, spec.num_steps):
            probs, x, _ = self._step(sel.input_ids.reshape(b, k), sel.hidden_states.reshape(b, k, d), beam, state.cache)
            p, idx = self._topk(probs.reshape(b * k, -1), k)
            sel = select_top_k_tokens(i, p, idx, x.reshape(b * k, d), sel.scores, topk=k)
            for lst, v in zip(lists, sel.tree_info):
                lst.append(v)
        return organize_draft_results(*lists, num_draft_tokens=spec.num_draft_tokens), state


@pytest.fixture(scope="module")
def pair():
    rng = np.random.default_rng(0)
    draft_vocab = np.sort(rng.choice(V, VD, replace=False))
    # Bigram logits whose argmax is always a draft-vocab token (so a good draft is possible), well separated.
    bigram = rng.standard_normal((V, V)).astype(np.float32)
    bigram[np.arange(V), rng.choice(draft_vocab, V)] += 6.0
    bigram = jnp.asarray(bigram)
    target = ToyTarget.create(jax.random.key(1), bigram)
    return target, Eagle3Drafter.create(jax.random.key(2), bigram, draft_vocab)


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(5)
    return [rng.integers(0, V, n).astype(np.int32) for n in (5, 11, 3)]  # B=3 -> bucket 4 (one padding row)


def _engine(target, drafter, spec):
    return Engine(target, drafter, spec=spec, max_context=W, page_size=PAGE, max_batch=4)


@pytest.fixture(scope="module")
def plain(pair, prompts):
    return _engine(pair[0], None, None).generate(prompts, MAX_NEW)


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_third_party_target_with_eagle3_drafter_lossless(pair, prompts, plain, spec):
    res = _engine(*pair, spec).generate(prompts, MAX_NEW)
    assert len(res.tokens) == len(prompts)
    for i, (a, b) in enumerate(zip(res.tokens, plain.tokens)):
        assert len(a) == MAX_NEW
        np.testing.assert_array_equal(a, b, err_msg=f"request {i}")
    # The drafts are good (shared bigram path), so accepted drafts, KV moves and compaction all ran.
    assert res.mean_accept_length > 1.5, res.mean_accept_length


def test_protocol_check_names_missing_members(pair):
    target, drafter = pair

    class NoForward:
        vocab_size, feature_size = V, D

        def make_cache(self, req_to_token, num_slots): ...

        def kv_bytes_per_slot(self): ...

    with pytest.raises(ValueError, match=r"target: NoForward does not implement .*TargetModel: missing forward"):
        Engine(NoForward(), None, max_context=W)

    class HalfDrafter:
        def init_state(self, spec, req_to_token, num_slots): ...

    with pytest.raises(ValueError, match=r"drafter: .*missing kv_bytes_per_slot, extend_after_prefill, propose"):
        Engine(target, HalfDrafter(), spec=CHAIN, max_context=W)
    with pytest.raises(ValueError, match="needs a drafter"):
        Engine(target, None, spec=CHAIN, max_context=W)
    with pytest.raises(ValueError, match="takes none"):
        Engine(target, drafter, spec=None, max_context=W)


def test_shared_cache_buffers_are_refused_with_a_clear_error():
    """A target whose make_cache returns one array for both k and v would be donated twice mid-generate;
    the engine names both fields at prepare time instead."""
    import dataclasses as dc

    import jax
    import jax.numpy as jnp

    from jaxspec.engine import Engine
    from jaxspec.protocols import PagedKVCache

    @jax.tree_util.register_dataclass
    @dc.dataclass(frozen=True)
    class SharedKV:
        table: jax.Array
        vocab_size: int = dc.field(default=16, metadata=dict(static=True))
        feature_size: int = dc.field(default=16, metadata=dict(static=True))

        def kv_bytes_per_slot(self):
            return 8

        def make_cache(self, req_to_token, num_slots):
            z = jnp.zeros((1, num_slots, 1, 1))
            return PagedKVCache(k=z, v=z, req_to_token=jnp.asarray(req_to_token))

        def forward(self, tokens, meta, cache):
            return self.table[tokens], self.table[tokens], cache

    eng = Engine(SharedKV(jnp.eye(16)), max_context=32)
    with pytest.raises(ValueError, match=r"target_cache.*\.v.* and target_cache.*\.k.* are the same array"):
        eng.generate([[1, 2]], max_new_tokens=2)
