"""EAGLE-3 draft model (SGLang's ``LlamaForCausalLMEagle3``) and its checkpoint format.

The draft is one Llama decoder layer whose attention reads ``concat(input_layernorm(embed(token)),
hidden_norm(h))`` (q/k/v take ``2H`` inputs), as in SGLang's ``python/sglang/srt/models/llama_eagle3.py``
(``LlamaDecoderLayer.forward``, ``LlamaModel.forward``):

* ``h`` is ``fc(aux)`` for the first draft step (``aux``: the target's low/mid/high residual streams
  concatenated, ``3 * target_hidden_size`` wide), and the draft's OWN pre-norm output for later steps
  (SGLang applies ``fc`` only when the width differs from the embedding's).
* ``residual = h``; ``x = attn(cat(input_layernorm(emb), hidden_norm(h)))``; ``residual = x + residual``;
  ``x = mlp(post_attention_layernorm(residual))``; ``out = x + residual`` (the pre-norm hidden the next
  step consumes); ``logits = lm_head(norm(out))`` over the ``draft_vocab_size`` draft tokens.
* Draft token ``i`` is target token ``i + d2t[i]``; ``t2d[j]`` says whether target token ``j`` is in the
  draft vocabulary. The token embedding is the target's (shared, never stored in the checkpoint).

Auxiliary layers. ``config.json``'s ``eagle_config.eagle_aux_hidden_state_layer_ids`` follow SGLang: id ``i`` is
the OUTPUT of target layer ``i``, i.e. the residual stream entering layer ``i + 1`` (SGLang's
``set_eagle3_layers_to_capture`` captures ``[i + 1 for i in ids]``; its default with no ids is the inputs of
layers ``[2, L // 2, L - 3]``, i.e. ids ``[1, L // 2 - 1, L - 4]``). ``jaxspec.models.Decoder(aux_layers=)``
counts inputs, so ``aux_layers = tuple(i + 1 for i in ids)`` (``aux_layers_from_ids``; the inverse is
``ids_from_aux_layers``). For SmolLM2-135M (L = 30): ids ``[1, 14, 26]``, ``aux_layers (2, 15, 27)``.

Checkpoint directory (``save_eagle3`` / ``load_eagle3``; SGLang and SpecForge read and write the same):
``config.json`` with ``architectures: ["LlamaForCausalLMEagle3"]``, ``num_hidden_layers: 1``,
``draft_vocab_size``, ``vocab_size`` (the target's), ``tie_word_embeddings: false`` (SGLang would otherwise
use the embedding as the head), ``target_hidden_size``, ``eagle_config``; ``model.safetensors`` with
``fc.weight [H, 3Ht]``, ``midlayer.hidden_norm.weight``, ``midlayer.input_layernorm.weight``,
``midlayer.self_attn.{q,k,v}_proj.weight [out, 2H]``, ``midlayer.self_attn.o_proj.weight``,
``midlayer.post_attention_layernorm.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``, ``norm.weight``,
``lm_head.weight [Vd, H]``, ``d2t`` (int64 ``[Vd]``), ``t2d`` (bool ``[V]``).

Training (``jaxspec.train_draft``) uses ``ttt_forward``: SpecForge's training-time test, the draft unrolled
over its own hidden states with SpecForge's attention (step ``k``'s query at row ``t``, at position ``t + k``, sees
step-0 keys of rows ``<= t`` and the keys of steps ``1..k`` at row ``t`` itself: SGLang's draft step ``k``).
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.models.config import DecoderConfig
from jaxspec.models.decoder import MLP, Linear, RMSNorm, SelfAttention, apply_rope, rope_inv_freq
from jaxspec.protocols import AttentionMetadata, PagedKVCache

_F32 = jnp.float32
ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """SGLang's default taps as checkpoint ids (layer outputs): ``(1, L // 2 - 1, L - 4)``."""
    ids = (1, num_layers // 2 - 1, num_layers - 4)
    if not 0 <= ids[0] < ids[1] < ids[2]:
        raise ValueError(f"num_layers: SGLang's default taps {list(ids)} are not three distinct layers for a "
                         f"{num_layers}-layer target (it needs >= 7 layers); give the aux layer ids explicitly")
    return ids


def aux_layers_from_ids(ids, num_layers: int) -> tuple[int, ...]:
    """Checkpoint ids (output of layer ``i``) -> ``Decoder(aux_layers=)`` (input of layer ``i + 1``)."""
    ids = tuple(int(i) for i in ids)
    if not ids or any(not 0 <= i < num_layers for i in ids) or list(ids) != sorted(set(ids)):
        raise ValueError(f"eagle_aux_hidden_state_layer_ids: expected increasing layer ids in [0, {num_layers}), "
                         f"got {list(ids)}")
    return tuple(i + 1 for i in ids)


def ids_from_aux_layers(aux_layers) -> tuple[int, ...]:
    """``Decoder(aux_layers=)`` -> checkpoint ids (the inverse of ``aux_layers_from_ids``)."""
    if any(int(i) < 1 for i in aux_layers):
        raise ValueError(f"aux_layers: layer 0's input (the embedding) has no EAGLE-3 id, got {tuple(aux_layers)}")
    return tuple(int(i) - 1 for i in aux_layers)


def draft_vocab_from_counts(counts, draft_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """SpecForge's ``process_token_dict_to_mappings``: ``(d2t int64[Vd], t2d bool[V])`` from per-token counts
    (``counts[j]``: occurrences of target token ``j`` in the training responses, ``V = len(counts)``).

    If fewer than ``Vd`` tokens occur, the lowest unseen ids fill up with count 0 (SpecForge's rule); the
    ``Vd`` most frequent are kept (ties: lower id first; SpecForge's ``Counter.most_common`` keeps first-seen
    order) and sorted, ``d2t[i] = used[i] - i``, ``t2d[j] = j in used``."""
    counts = np.asarray(counts)
    v = counts.shape[0] if counts.ndim == 1 else -1
    if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
        raise ValueError(f"counts: expected a 1-D array of non-negative integer counts, got {counts.dtype}{list(counts.shape)}")
    if not isinstance(draft_vocab_size, int) or not 1 <= draft_vocab_size <= v:
        raise ValueError(f"draft_vocab_size: expected an int in [1, {v}] (the target vocabulary), got {draft_vocab_size!r}")
    seen = counts > 0
    if seen.sum() < draft_vocab_size:  # SpecForge: lowest missing ids get count 0 until Vd tokens are known
        known = seen.copy()
        for j in np.flatnonzero(~seen):
            if known.sum() >= draft_vocab_size:
                break
            known[j] = True
    else:
        known = seen
    cand = np.flatnonzero(known)
    order = np.lexsort((cand, -counts[cand]))  # by count descending, then id
    used = np.sort(cand[order[:draft_vocab_size]])
    d2t = (used - np.arange(draft_vocab_size)).astype(np.int64)
    t2d = np.zeros((v,), bool)
    t2d[used] = True
    return d2t, t2d


class DraftMap(nnx.Variable):
    """Integer / boolean arrays of the draft vocabulary (``d2t`` -> ``token_ids``, ``t2d``): not trained."""


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """The draft's shape: ``decoder`` (hidden size, heads, MLP width, RoPE, norm eps; ``vocab_size`` is the
    TARGET's), ``target_hidden_size``, ``draft_vocab_size`` and the SGLang aux-layer ids."""

    decoder: DecoderConfig
    target_hidden_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...]
    max_position_embeddings: int = 8192  # written for SGLang's RoPE cache (transformers' LlamaConfig default: 2048)

    def __post_init__(self):
        if self.decoder.num_hidden_layers != 1:
            raise ValueError(f"decoder.num_hidden_layers: an EAGLE-3 draft has one layer, got {self.decoder.num_hidden_layers}")
        if not 1 <= self.draft_vocab_size <= self.decoder.vocab_size:
            raise ValueError(f"draft_vocab_size: expected [1, {self.decoder.vocab_size}], got {self.draft_vocab_size}")
        if len(self.aux_layer_ids) < 1:
            raise ValueError("aux_layer_ids: expected at least one layer id")

    @classmethod
    def for_target(cls, target_cfg: DecoderConfig, *, draft_vocab_size: int, aux_layer_ids=None,
                   intermediate_size: int | None = None) -> "Eagle3Config":
        """A draft shaped like ``target_cfg``'s layers (SpecForge's configs copy the target's), 1 layer."""
        ids = default_aux_layer_ids(target_cfg.num_hidden_layers) if aux_layer_ids is None else tuple(aux_layer_ids)
        aux_layers_from_ids(ids, target_cfg.num_hidden_layers)  # validates
        dec = dataclasses.replace(target_cfg, num_hidden_layers=1, tie_word_embeddings=False,
                                  num_nextn_predict_layers=0,
                                  intermediate_size=intermediate_size or target_cfg.intermediate_size)
        return cls(dec, target_cfg.hidden_size, int(draft_vocab_size), tuple(int(i) for i in ids))

    def to_hf(self) -> dict:
        d = self.decoder.to_hf()
        d.pop("num_nextn_predict_layers", None)
        d.update(architectures=[ARCHITECTURE], num_hidden_layers=1, draft_vocab_size=self.draft_vocab_size,
                 target_hidden_size=self.target_hidden_size, tie_word_embeddings=False, torch_dtype="bfloat16",
                 max_position_embeddings=self.max_position_embeddings,
                 eagle_config={"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
                               "use_aux_hidden_state": True})
        return d

    @classmethod
    def from_hf(cls, hf: dict, *, num_target_layers: int | None = None) -> "Eagle3Config":
        arch = hf.get("architectures") or []
        if ARCHITECTURE not in arch:
            raise ValueError(f"config.json architectures: expected [{ARCHITECTURE!r}], got {arch!r}")
        if hf.get("num_hidden_layers") != 1:
            raise ValueError(f"config.json num_hidden_layers: expected 1 (one EAGLE-3 midlayer), got {hf.get('num_hidden_layers')!r}")
        ids = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if ids is None:
            if num_target_layers is None:
                raise ValueError("config.json has no eagle_config.eagle_aux_hidden_state_layer_ids: pass "
                                 "num_target_layers to use SGLang's default taps")
            ids = default_aux_layer_ids(num_target_layers)
        hf = dict(hf, tie_word_embeddings=False, num_nextn_predict_layers=0)
        dec = DecoderConfig.from_hf(hf)
        vd = hf.get("draft_vocab_size") or dec.vocab_size
        return cls(dec, int(hf.get("target_hidden_size") or dec.hidden_size), int(vd), tuple(int(i) for i in ids),
                   int(hf.get("max_position_embeddings") or 2048))


class Eagle3Attention(SelfAttention):
    """``SelfAttention`` whose fused ``qkv_proj`` reads ``2H`` inputs (SGLang overrides it the same way, no bias);
    the paged path is ``SelfAttention.__call__``; ``ttt`` is SpecForge's training attention."""

    def __init__(self, cfg: DecoderConfig, *, dtype, rngs: nnx.Rngs):
        super().__init__(cfg, dtype=dtype, rngs=rngs)
        e, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.qkv_proj = Linear(2 * cfg.hidden_size, (hq + 2 * hkv) * e, bias=False, dtype=dtype, rngs=rngs)

    def qkv(self, x, positions):
        cfg = self.cfg
        b, nq = positions.shape
        e, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        inv = rope_inv_freq(cfg)
        qkv = self.qkv_proj(x).reshape(b, nq, hq + 2 * hkv, e)
        return (apply_rope(qkv[:, :, :hq], positions, inv), apply_rope(qkv[:, :, hq:hq + hkv], positions, inv),
                qkv[:, :, hq + hkv:])

    def ttt(self, x, positions, step: int, kv_cache: list):
        """Training-time-test attention of step ``step`` over ``x [B, T, 2H]`` (SpecForge's ``LlamaAttention``
        with ``cache_hidden``): RoPE at ``positions + step``; the query at row ``t`` sees step 0's keys at rows
        ``r <= t`` (causal) and, for each step ``1..step``, that step's key at row ``t``: what SGLang's draft step
        ``step`` of the position after row ``t`` attends to. ``kv_cache``: the earlier steps' ``(k, v)``; this
        step's is appended. Matmuls at the default precision (training only; the paged path keeps HIGHEST)."""
        cfg = self.cfg
        e, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        b, t, _ = x.shape
        q, k, v = self.qkv(x, positions + step)
        kv_cache.append((k, v))
        rep = hq // hkv
        q = q.reshape(b, t, hkv, rep, e)
        k0, v0 = kv_cache[0]
        s0 = jnp.einsum("bqgre,bkge->bgrqk", q, k0) * e**-0.5
        vis = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        s0 = jnp.where(vis[None, None, None], s0, -1e30)
        diag = [jnp.einsum("bqgre,bqge->bgrq", q, kj)[..., None] * e**-0.5 for kj, _ in kv_cache[1:]]
        s = jnp.concatenate([s0, *diag], axis=-1) if diag else s0
        p = jax.nn.softmax(s, axis=-1)
        out = jnp.einsum("bgrqk,bkge->bqgre", p[..., :t], v0)
        for j, (_, vj) in enumerate(kv_cache[1:]):
            out = out + jnp.einsum("bgrq,bqge->bqgre", p[..., t + j], vj)
        return self.o_proj(out.reshape(b, t, hq * e))


class Eagle3Layer(nnx.Module):
    """SGLang's ``llama_eagle3.LlamaDecoderLayer`` (the ``midlayer``)."""

    def __init__(self, cfg: DecoderConfig, *, dtype, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.hidden_norm = RMSNorm(d, cfg.rms_norm_eps, dtype)
        self.input_layernorm = RMSNorm(d, cfg.rms_norm_eps, dtype)
        self.self_attn = Eagle3Attention(cfg, dtype=dtype, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype=dtype, rngs=rngs)

    def __call__(self, emb, h, attend):
        x = jnp.concatenate([self.input_layernorm(emb), self.hidden_norm(h)], axis=-1)
        a, extra = attend(x)
        residual = a + h.astype(_F32)
        return self.mlp(self.post_attention_layernorm(residual)) + residual, extra


class EAGLE3Model(nnx.Module):
    """The EAGLE-3 draft: ``fc``, ``midlayer``, ``norm``, ``lm_head`` (draft vocabulary) and the draft map
    (``token_ids = arange(Vd) + d2t``, ``t2d``). The embedding is the target's and is passed in (``emb``)."""

    def __init__(self, cfg: Eagle3Config, *, rngs: nnx.Rngs, param_dtype=_F32, kv_dtype=None, d2t=None):
        from jaxspec.models.decoder import default_kv_dtype

        dec = cfg.decoder
        self.cfg = cfg
        self.param_dtype = jnp.dtype(param_dtype)
        self.kv_dtype = jnp.dtype(default_kv_dtype() if kv_dtype is None else kv_dtype)
        self.fc = Linear(len(cfg.aux_layer_ids) * cfg.target_hidden_size, dec.hidden_size, bias=False,
                         dtype=param_dtype, rngs=rngs)
        self.midlayer = Eagle3Layer(dec, dtype=param_dtype, rngs=rngs)
        self.norm = RMSNorm(dec.hidden_size, dec.rms_norm_eps, param_dtype)
        self.lm_head = Linear(dec.hidden_size, cfg.draft_vocab_size, bias=False, dtype=param_dtype, rngs=rngs)
        if d2t is None:
            d2t = np.zeros((cfg.draft_vocab_size,), np.int64)
        self.set_draft_map(d2t)

    def set_draft_map(self, d2t) -> None:
        """Install ``d2t`` (``[Vd]``, target id = ``i + d2t[i]``; ids distinct and in the target vocabulary)."""
        vd, v = self.cfg.draft_vocab_size, self.cfg.decoder.vocab_size
        d2t = np.asarray(d2t)
        if d2t.shape != (vd,) or not np.issubdtype(d2t.dtype, np.integer):
            raise ValueError(f"d2t: expected an integer array of shape ({vd},), got {d2t.dtype}{list(d2t.shape)}")
        ids = np.arange(vd) + d2t
        if ids.min() < 0 or ids.max() >= v or np.unique(ids).size != vd:
            raise ValueError(f"d2t: arange({vd}) + d2t must be distinct target ids in [0, {v})")
        t2d = np.zeros((v,), bool)
        t2d[ids] = True
        self.token_ids = DraftMap(jnp.asarray(ids, jnp.int32))
        self.t2d = DraftMap(jnp.asarray(t2d))

    @property
    def hidden_size(self) -> int:
        return self.cfg.decoder.hidden_size

    def kv_bytes_per_slot(self) -> int:
        c = self.cfg.decoder
        return 2 * c.num_key_value_heads * c.head_dim * self.kv_dtype.itemsize

    def make_cache(self, req_to_token, num_slots: int) -> PagedKVCache:
        c = self.cfg.decoder
        shape = (1, int(num_slots), c.num_key_value_heads, c.head_dim)
        r2t = jnp.asarray(req_to_token, jnp.int32)
        return PagedKVCache(k=jnp.zeros(shape, self.kv_dtype), v=jnp.zeros(shape, self.kv_dtype), req_to_token=r2t)

    def project(self, aux):
        """``fc``: the target's concatenated aux hidden ``[..., n * Ht]`` -> ``[..., H]``."""
        return self.fc(aux)

    def logits(self, out):
        """Draft-vocabulary logits ``f32[..., Vd]`` from the pre-norm output (column ``j`` = ``token_ids[j]``)."""
        return self.lm_head(self.norm(out))

    def forward(self, emb, h, meta: AttentionMetadata, cache: PagedKVCache | None):
        """One draft step over fresh rows: ``emb [B, Q, H]`` (the target's embedding of the input tokens), ``h
        [B, Q, H]`` (``project(aux)`` for the first step, else the draft's own pre-norm output) -> ``(out [B, Q,
        H] pre-norm, cache)``; K/V to layer 0 of ``cache`` at ``meta.write_locs`` (``cache=None``: dense)."""
        attn = self.midlayer.self_attn
        return self.midlayer(emb, h, lambda x: attn(x, meta, cache, 0))

    def ttt_forward(self, emb_steps, h0, positions):
        """SpecForge's training-time test: ``emb_steps``: a list of ``[B, T, H]`` input embeddings, one per step
        (step ``k``'s row ``t`` holds token ``t + 1 + k``), ``h0 = project(aux) [B, T, H]``; returns the list of
        per-step pre-norm outputs (step ``k + 1`` consumes step ``k``'s output at the same row)."""
        attn = self.midlayer.self_attn
        kv, outs, h = [], [], h0
        for step, emb in enumerate(emb_steps):
            h, _ = self.midlayer(emb, h, lambda x, s=step: (attn.ttt(x, positions, s, kv), None))
            outs.append(h)
        return outs



def target_head_columns(target, token_ids):
    """The target's LM head restricted to ``token_ids`` (``i32[Vd]``): ``[D, Vd]``, column ``j`` the head of token
    ``token_ids[j]`` (the embedding rows of a tied target, SmolLM2's case)."""
    if target.lm_head is not None:
        return target.lm_head.kernel[...][:, token_ids]
    return target.embed_tokens[...][token_ids].T


def init_lm_head_from_target(head: EAGLE3Model, target) -> None:
    """Set ``head``'s LM head to the target's columns of the draft vocabulary (``target_head_columns``): a trained
    start for the draft's largest matrix (the draft's own final norm starts at ones, as the target's may not)."""
    if target.cfg.hidden_size != head.hidden_size:
        raise ValueError(f"target: hidden size {target.cfg.hidden_size} differs from the head's {head.hidden_size}")
    w = target_head_columns(target, head.token_ids[...])
    head.lm_head.kernel.set_value(w.astype(head.lm_head.kernel[...].dtype))

# ------------------------------------------------------------------------------------------- checkpoint
_LINEAR = {("fc",): "fc", ("lm_head",): "lm_head", ("midlayer", "self_attn", "o_proj"): "midlayer.self_attn.o_proj",
           ("midlayer", "mlp", "down_proj"): "midlayer.mlp.down_proj"}
_NORMS = ("midlayer.hidden_norm", "midlayer.input_layernorm", "midlayer.post_attention_layernorm", "norm")


def _tensor_plan(cfg: Eagle3Config) -> dict:
    """Checkpoint name -> (NNX path, row range of a fused kernel's output axis or None, transpose)."""
    d = cfg.decoder
    e, hq, hkv, f = d.head_dim, d.num_attention_heads, d.num_key_value_heads, d.intermediate_size
    plan = {f"{n}.weight": (p + ("kernel",), None, True) for p, n in _LINEAR.items()}
    plan.update({f"{n}.weight": tuple(n.split(".")) + ("weight",) for n in _NORMS})
    plan = {k: (v if isinstance(v[0], tuple) else (v, None, False)) for k, v in plan.items()}
    qkv = ("midlayer", "self_attn", "qkv_proj", "kernel")
    for name, lo, hi in (("q", 0, hq * e), ("k", hq * e, (hq + hkv) * e), ("v", (hq + hkv) * e, (hq + 2 * hkv) * e)):
        plan[f"midlayer.self_attn.{name}_proj.weight"] = (qkv, (lo, hi), True)
    gu = ("midlayer", "mlp", "gate_up_proj", "kernel")
    plan["midlayer.mlp.gate_proj.weight"] = (gu, (0, f), True)
    plan["midlayer.mlp.up_proj.weight"] = (gu, (f, 2 * f), True)
    return plan


def _params(model: EAGLE3Model) -> dict:
    return {tuple(str(p) for p in k): v for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def eagle3_tensors(model: EAGLE3Model, dtype=None) -> dict:
    """The checkpoint's tensors as NumPy arrays (HF ``[out, in]`` layout; ``d2t`` int64, ``t2d`` bool)."""
    params = _params(model)
    out = {}
    for name, (path, rows, transpose) in _tensor_plan(model.cfg).items():
        arr = np.asarray(params[path].get_value())
        if rows is not None:
            arr = arr[:, rows[0]:rows[1]]
        arr = arr.T if transpose else arr
        out[name] = arr if dtype is None else arr.astype(dtype)
    ids = np.asarray(model.token_ids[...]).astype(np.int64)
    out["d2t"] = ids - np.arange(ids.shape[0], dtype=np.int64)
    out["t2d"] = np.asarray(model.t2d[...]).astype(bool)
    return out


COUNTS_FILE = "draft_token_counts.json"  # beside the weights: how often each draft token occurred in training


def _counts_ok(counts: np.ndarray, vd: int) -> bool:
    """Whether ``counts`` holds one non-negative integer count per draft token (``[vd]``)."""
    return counts.shape == (vd,) and np.issubdtype(counts.dtype, np.integer) and not (counts < 0).any()


def save_eagle3(model: EAGLE3Model, path: str, *, dtype=jnp.bfloat16, metadata: dict | None = None,
                token_counts=None) -> None:
    """Write ``path/config.json`` + ``path/model.safetensors`` in SGLang / SpecForge's EAGLE-3 layout (weights in
    ``dtype``, default bf16; ``d2t`` int64, ``t2d`` bool; no embedding). ``token_counts`` (``[Vd]`` non-negative
    integers, draft id order): each draft token's count in the training replies, written to ``COUNTS_FILE`` (a
    JSON file SGLang does not read) so that ``load_eagle3(path, draft_vocab=N)`` can keep the ``N`` most
    frequent."""
    from safetensors.flax import save_file

    vd = model.cfg.draft_vocab_size
    if token_counts is not None:
        token_counts = np.asarray(token_counts)
        if not _counts_ok(token_counts, vd):
            raise ValueError(f"token_counts: expected {vd} non-negative integers (one per draft token), got "
                             f"{token_counts.dtype}{list(token_counts.shape)}")
    os.makedirs(path, exist_ok=True)
    counts_path = os.path.join(path, COUNTS_FILE)
    if token_counts is not None:
        with open(counts_path, "w") as f:
            json.dump({"counts": [int(c) for c in token_counts]}, f)
    elif os.path.exists(counts_path):  # an earlier head's counts would describe other tokens
        os.remove(counts_path)
    tensors = eagle3_tensors(model, None)
    for name, arr in tensors.items():
        if name not in ("d2t", "t2d"):
            tensors[name] = np.ascontiguousarray(np.asarray(arr).astype(jnp.dtype(dtype)))
    cfg = model.cfg.to_hf()
    cfg["torch_dtype"] = {"bfloat16": "bfloat16", "float32": "float32", "float16": "float16"}[jnp.dtype(dtype).name]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt", **(metadata or {})})


def _kept_draft_ids(path: str, vd: int, draft_vocab) -> np.ndarray:
    """The draft ids ``load_eagle3(draft_vocab=N)`` keeps: the ``N`` most frequent by ``COUNTS_FILE`` (ties: lower
    draft id first), in draft id order."""
    if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, (int, np.integer)) or not 1 <= draft_vocab <= vd:
        raise ValueError(f"draft_vocab: expected None or an int in [1, {vd}] (the head's draft vocabulary), "
                         f"got {draft_vocab!r}")
    f = os.path.join(path, COUNTS_FILE)
    if not os.path.exists(f):
        raise ValueError(f"draft_vocab={draft_vocab}: {path} has no {COUNTS_FILE} (the draft tokens' training counts "
                         "that pick the most frequent; jaxspec.train_draft writes it)")
    with open(f) as fh:
        counts = np.asarray(json.load(fh).get("counts", []))
    if not _counts_ok(counts, vd):
        raise ValueError(f"{f}: expected 'counts': {vd} non-negative integers, got {counts.dtype}{list(counts.shape)}")
    return np.sort(np.argsort(-counts, kind="stable")[:draft_vocab])


def load_eagle3(path: str, *, param_dtype=_F32, kv_dtype=None, num_target_layers: int | None = None,
                draft_vocab: int | None = None) -> EAGLE3Model:
    """Read an EAGLE-3 checkpoint directory (``save_eagle3``'s layout, or SpecForge's / an SGLang-served head's:
    names with or without a ``model.`` prefix; a stored ``embed_tokens.weight`` is ignored, the target's is
    used). A missing tensor, a wrong shape or ``t2d`` disagreeing with ``d2t`` raises ``ValueError``.

    ``draft_vocab=N`` keeps the head's ``N`` most frequent draft tokens only (by the counts ``save_eagle3`` wrote
    beside the weights; FR-Spec's frequency-ranked draft head, SGLang's ``speculative_token_map``): the LM head's
    rows of the others are dropped, so each draft step reads ``N`` rows instead of ``Vd``. The kept tokens' logits
    are unchanged; a draft can no longer propose the others (verification, and so the output, is unchanged)."""
    from safetensors import safe_open

    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    full = Eagle3Config.from_hf(hf, num_target_layers=num_target_layers)
    keep = None
    if draft_vocab is not None:
        keep = _kept_draft_ids(path, full.draft_vocab_size, draft_vocab)
        hf = {**hf, "draft_vocab_size": int(draft_vocab)}
    cfg = Eagle3Config.from_hf(hf, num_target_layers=num_target_layers)
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors file")
    found = {}
    for fn in files:
        with safe_open(os.path.join(path, fn), framework="numpy") as f:
            for k in f.keys():
                found[k[len("model."):] if k.startswith("model.") else k] = f.get_tensor(k)
    model = nnx.eval_shape(lambda: EAGLE3Model(cfg, rngs=nnx.Rngs(0), param_dtype=param_dtype, kv_dtype=kv_dtype))
    params = _params(model)
    pieces: dict = {}
    for name, (p, rows, transpose) in _tensor_plan(cfg).items():
        if name not in found:
            raise ValueError(f"{path}: missing tensor {name}")
        arr = np.asarray(found[name])
        if keep is not None and name == "lm_head.weight":
            if arr.shape[0] != full.draft_vocab_size:
                raise ValueError(f"{path}: tensor {name}: expected {full.draft_vocab_size} rows, found {arr.shape}")
            arr = arr[keep]
        want = tuple(params[p].get_value().shape)
        want = (want[1], want[0]) if transpose else want
        if rows is not None:
            want = (rows[1] - rows[0], want[1])
        if arr.shape != want:
            raise ValueError(f"{path}: tensor {name}: expected shape {want}, found {arr.shape}")
        pieces.setdefault(p, []).append((rows, arr.T if transpose else arr))
    for p, parts in pieces.items():
        arr = parts[0][1] if parts[0][0] is None else np.concatenate([a for _, a in sorted(parts, key=lambda x: x[0][0])], 1)
        params[p].set_value(jnp.asarray(arr.astype(np.float32)).astype(param_dtype))
    for name in ("d2t", "t2d"):
        if name not in found:
            raise ValueError(f"{path}: missing tensor {name}")
    d2t = np.asarray(found["d2t"]).astype(np.int64)
    vd, v = full.draft_vocab_size, cfg.decoder.vocab_size
    ids = np.arange(d2t.shape[0]) + d2t if d2t.ndim == 1 else None
    if d2t.shape != (vd,) or ids.min() < 0 or ids.max() >= v or np.unique(ids).size != vd:
        raise ValueError(f"{path}: d2t: expected {vd} offsets with arange({vd}) + d2t distinct target ids in [0, {v})")
    t2d = np.asarray(found["t2d"]).astype(bool)
    want_t2d = np.zeros((v,), bool)
    want_t2d[ids] = True
    if t2d.shape != want_t2d.shape or not np.array_equal(t2d, want_t2d):
        raise ValueError(f"{path}: t2d disagrees with d2t (t2d[j] must be True exactly for the ids arange(Vd) + d2t)")
    if keep is not None:
        d2t = ids[keep] - np.arange(keep.shape[0])
    model.set_draft_map(d2t)
    return model


__all__ = [
    "ARCHITECTURE", "COUNTS_FILE", "EAGLE3Model", "Eagle3Config", "aux_layers_from_ids", "default_aux_layer_ids",
    "draft_vocab_from_counts", "eagle3_tensors", "ids_from_aux_layers", "init_lm_head_from_target", "load_eagle3",
    "save_eagle3", "target_head_columns",
]
