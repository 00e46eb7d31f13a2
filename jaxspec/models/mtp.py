"""DeepSeek-V3 multi-token-prediction (MTP) draft layers on a Llama-family decoder: the jaxspec MTP head.

MTP layer ``s`` mirrors DeepSeek-V3's MTP module (as SGLang's multi-layer MTP draft worker runs it): it takes
the pre-norm hidden state of the previous position (from the target for ``s == 0``, from MTP step ``s - 1``
after that) and the embedding of the *next* token, RMS-normalises both, projects ``[enorm(emb), hnorm(h)]``
from ``2D`` to ``D`` (``eh_proj``), runs one decoder block, and reuses the target's embedding, final norm and
LM head.
``MTPModel`` is the target with its MTP layers in one module, so the shared weights exist once; it implements
both ``TargetModel`` and ``jaxspec.protocols.MTPHead``.

Weight layers vs draft steps: a model may run more draft steps than it has MTP weight layers (a checkpoint
with one ``nextn`` layer, as DeepSeek-V3 / MiMo ship, drafting S = 3 or 5 tokens). As SGLang does for such
models, draft step ``s`` uses the weights of MTP layer ``min(s, num_mtp_layers - 1)``, but its OWN KV layer
``s`` of the draft cache: the steps' inputs differ (step ``s`` sees step ``s - 1``'s hidden), so their keys and
values do too. ``num_draft_steps`` (>= ``num_mtp_layers``; default equal) is the protocol's "steps the head can
run" and the draft cache's layer count; checkpoints store the weight layers only.
"""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import Decoder, DecoderLayer, Linear, RMSNorm
from jaxspec.protocols import AttentionMetadata, PagedKVCache


class MTPLayer(nnx.Module):
    """``block(eh_proj([enorm(embed(next token)), hnorm(h_prev)]))`` (DeepSeek-V3 tensor names)."""

    def __init__(self, cfg: DecoderConfig, *, dtype, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.enorm = RMSNorm(d, cfg.rms_norm_eps, dtype)
        self.hnorm = RMSNorm(d, cfg.rms_norm_eps, dtype)
        self.eh_proj = Linear(2 * d, d, bias=False, dtype=dtype, rngs=rngs)
        self.block = DecoderLayer(cfg, dtype=dtype, rngs=rngs)

    def __call__(self, h_prev, emb, meta: AttentionMetadata, cache: PagedKVCache | None, layer: int):
        x = jnp.concatenate([self.enorm(emb), self.hnorm(h_prev)], axis=-1)
        return self.block(self.eh_proj(x), meta, cache, layer)


class DraftVocab(nnx.Variable):
    """Arrays of a reduced draft vocabulary: derived from the LM head, not checkpoint parameters (``nnx.Param``
    filters, e.g. ``save_model`` and training, skip them)."""


class DraftHead(Linear):
    """The LM head restricted to ``token_ids``: ``kernel [D, Vd]`` = the head's columns of those tokens, and
    ``token_ids i32[Vd]`` (logit column ``j`` is token ``token_ids[j]``). Computes as ``Linear``."""

    def __init__(self, kernel, token_ids):  # noqa: D107 - no Linear.__init__: the kernel is given
        self.kernel = DraftVocab(kernel)
        self.bias = None
        self.token_ids = DraftVocab(token_ids)


class MTPModel(Decoder):
    """A ``Decoder`` (the target) plus ``num_mtp_layers`` MTP draft layers sharing its embedding and head.

    ``num_mtp_layers=None`` takes ``cfg.num_nextn_predict_layers``. ``num_draft_steps`` (default
    ``num_mtp_layers``, at least that many): the draft steps the head can run; step ``s`` runs the weights of
    layer ``min(s, num_mtp_layers - 1)`` with its own KV layer ``s`` (module docstring). ``hidden`` from
    ``forward`` must be the last pre-norm hidden (``aux_layers`` is not accepted here), since MTP step 0
    consumes it.
    """

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32, kv_dtype=None,
                 num_mtp_layers: int | None = None, num_draft_steps: int | None = None):
        super().__init__(cfg, rngs=rngs, param_dtype=param_dtype, kv_dtype=kv_dtype)
        n = cfg.num_nextn_predict_layers if num_mtp_layers is None else num_mtp_layers
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"num_mtp_layers: expected an int >= 1 (or cfg.num_nextn_predict_layers >= 1), got {n!r}")
        steps = n if num_draft_steps is None else num_draft_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < n:
            raise ValueError(f"num_draft_steps: expected an int >= num_mtp_layers ({n}), got {steps!r}")
        self.mtp_layers = nnx.List([MTPLayer(cfg, dtype=param_dtype, rngs=rngs) for _ in range(n)])
        self.num_draft_steps = steps
        self.draft_head = None  # with_draft_vocab: the LM head of the draft steps over a reduced vocabulary

    @property
    def draft_token_ids(self):
        """``i32[Vd]``: the token of each draft logit column (``with_draft_vocab``), or ``None`` (full vocabulary)."""
        return None if self.draft_head is None else self.draft_head.token_ids[...]

    def draft_logits(self, h):
        """The draft steps' head: ``logits`` over the full vocabulary, or over ``draft_token_ids``."""
        return self.logits(h) if self.draft_head is None else self.draft_head(self.norm(h))

    @property
    def num_mtp_layers(self) -> int:
        """MTP weight layers (what a checkpoint stores as ``num_nextn_predict_layers``)."""
        return len(self.mtp_layers)

    def mtp_layer_of_step(self, step: int) -> int:
        """The weight layer draft step ``step`` runs: ``min(step, num_mtp_layers - 1)``."""
        return min(step, self.num_mtp_layers - 1)

    def make_draft_cache(self, req_to_token, num_slots: int) -> PagedKVCache:
        """A zeroed ``[num_draft_steps, num_slots, Hkv, E]`` pool (layer ``s`` holds draft step ``s``'s KV)."""
        return self._pool(self.num_draft_steps, req_to_token, num_slots)

    def draft_kv_bytes_per_slot(self) -> int:
        c = self.cfg
        return 2 * self.num_draft_steps * c.num_key_value_heads * c.head_dim * self.kv_dtype.itemsize

    def mtp_forward(self, step: int, h_prev, tokens, meta: AttentionMetadata, cache: PagedKVCache | None,
                    rows=None):
        """Draft step ``step`` (static): ``h_prev [B, Q, D]`` (pre-norm), ``tokens i32[B, Q]`` (the next tokens)
        -> ``(logits f32[B, Q, V], hidden f32[B, Q, D], cache)``. Runs MTP weight layer
        ``mtp_layer_of_step(step)``; K/V go to layer ``step`` of ``cache``. ``rows`` (``i32[R]`` indices into
        the ``B * Q`` flattened rows): logits ``f32[R, V]`` of those rows only. With a reduced draft vocabulary
        (``with_draft_vocab``) the logits are ``[..., Vd]``, column ``j`` the token ``draft_token_ids[j]``."""
        if not 0 <= step < self.num_draft_steps:
            raise ValueError(f"step: expected a draft step in [0, {self.num_draft_steps}), got {step}")
        x, cache = self.mtp_layers[self.mtp_layer_of_step(step)](h_prev, self.embed(tokens), meta, cache, step)
        if rows is None:
            return self.draft_logits(x), x, cache
        if rows.ndim != 1:
            raise ValueError(f"rows: expected i32[R] indices into the B * Q = {x.shape[0] * x.shape[1]} rows, "
                             f"got shape {rows.shape}")
        return self.draft_logits(x.reshape(-1, x.shape[-1])[rows]), x, cache


def add_mtp_layers(target: Decoder, num_mtp_layers: int, *, rngs: nnx.Rngs,
                   num_draft_steps: int | None = None) -> MTPModel:
    """An ``MTPModel`` with ``target``'s weights and ``num_mtp_layers`` freshly initialised MTP layers (e.g. a
    checkpoint without MTP weights, to be trained or used as a random drafter in tests); ``num_draft_steps``
    as in ``MTPModel``."""
    if target.aux_layers is not None:
        raise ValueError("target: an MTP target's hidden must be the last pre-norm hidden (aux_layers=None)")
    model = MTPModel(target.cfg, rngs=rngs, param_dtype=target.param_dtype, kv_dtype=target.kv_dtype,
                     num_mtp_layers=num_mtp_layers, num_draft_steps=num_draft_steps)
    nnx.update(model, nnx.state(target, nnx.Param))
    return model


def with_draft_vocab(model: MTPModel, token_ids) -> MTPModel:
    """``model`` whose draft steps score only ``token_ids`` (``i32[Vd]``, distinct, in ``[0, vocab_size)``; e.g.
    the ``Vd`` most frequent tokens of the serving traffic, FR-Spec, or an EAGLE-3 checkpoint's ``d2t`` map as
    ``arange(Vd) + d2t``). The target forward is unchanged. Returns a new module sharing ``model``'s weight
    arrays; the reduced head (``[D, Vd]``, a copy of the LM head's columns) is its own array."""
    ids = np.asarray(token_ids)
    v = model.vocab_size
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token_ids: expected a non-empty 1-D integer array, got {ids.dtype}{list(ids.shape)}")
    if ids.min() < 0 or ids.max() >= v:
        raise ValueError(f"token_ids: expected ids in [0, {v}) (the vocabulary), got [{ids.min()}, {ids.max()}]")
    if np.unique(ids).size != ids.size:
        raise ValueError("token_ids: expected distinct ids (a draft vocabulary lists each token once)")
    ids = jnp.asarray(ids, jnp.int32)
    new = nnx.merge(*nnx.split(model))
    if model.lm_head is not None:
        kernel = model.lm_head.kernel[...][:, ids]
    else:  # tied: logits = h @ embed.T
        kernel = model.embed_tokens[...][ids].T
    new.draft_head = nnx.data(DraftHead(kernel, ids))
    return new
