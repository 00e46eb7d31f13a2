"""A target with its draft head, loaded in one call: ``load_target_with_head(model, head)``.

A draft head is one of:

- ``"eagle3"``: an EAGLE-3 checkpoint directory (``save_eagle3``'s layout: ``config.json`` naming
  ``LlamaForCausalLMEagle3``, ``*.safetensors``); the target is loaded tapping the head's aux layers and drafts
  with ``EAGLE3Drafter``;
- ``"mtp"``: an MTP head directory (``config.json`` with ``num_nextn_predict_layers``, ``mtp.safetensors`` with
  only the MTP layers' tensors, as ``python -m jaxspec.train_draft --arch mtp`` writes it), attached to the
  target by ``load_mtp_head``; drafts with ``MTPDrafter``;
- ``"builtin"``: the MTP layers a checkpoint directory carries itself (``num_nextn_predict_layers`` in its
  ``config.json``, e.g. the shipped pairs), loaded with it as an ``MTPModel``; drafts with ``MTPDrafter``.

``head_kind(path)`` tells the first two apart; ``shipped_head(model, kind)`` is where the heads shipped in
``jaxspec/assets/heads`` lie.
"""

import json
import os
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

HEAD_KINDS = ("eagle3", "mtp", "builtin")
HEADS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "heads")


class TargetWithHead(NamedTuple):
    """What ``load_target_with_head`` returns: the target (a ``Decoder``, an ``MTPModel`` for the MTP kinds), the
    drafter (``None`` without a head) and the head's kind (``None`` without a head)."""

    target: object
    drafter: object
    kind: str | None


def shipped_head(model: str, kind: str) -> str:
    """The directory of the draft head shipped for a registered model.

    Args:
        model: a registered model name (``jaxspec.models.MODELS``), e.g. ``"smollm2-135m-instruct"``.
        kind: ``"eagle3"`` or ``"mtp"``.

    Returns:
        ``jaxspec/assets/heads/{model}-{kind}`` (it need not exist).
    """
    if kind not in ("eagle3", "mtp"):
        raise ValueError(f"kind: expected 'eagle3' or 'mtp', got {kind!r}")
    return os.path.join(HEADS_DIR, f"{model}-{kind}")


def head_kind(path: str, *, arg: str = "head") -> str:
    """The layout of a draft head directory.

    Args:
        path: the head's directory.
        arg: what the caller calls ``path`` (e.g. ``"--draft"``), named in the errors.

    Returns:
        ``"eagle3"`` (``architectures`` names ``LlamaForCausalLMEagle3``) or ``"mtp"`` (``mtp.safetensors`` and
        ``num_nextn_predict_layers > 0`` in ``config.json``); ``ValueError`` for anything else.
    """
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(f"{arg} {path}: no config.json there (expected an EAGLE-3 or MTP head directory)")
    with open(cfg_path) as f:
        cfg = json.load(f)
    if "LlamaForCausalLMEagle3" in (cfg.get("architectures") or []):
        return "eagle3"
    if os.path.isfile(os.path.join(path, "mtp.safetensors")) and int(cfg.get("num_nextn_predict_layers") or 0) > 0:
        return "mtp"
    raise ValueError(f"{arg} {path}: neither an EAGLE-3 checkpoint (architectures [\"LlamaForCausalLMEagle3\"]) nor "
                     f"an MTP head (mtp.safetensors and num_nextn_predict_layers in config.json)")


def load_mtp_head(target, path: str, *, num_draft_steps: int | None = None):
    """Attach the MTP layers of an MTP head directory to a target.

    Args:
        target: a ``Decoder`` without aux layers (its weights are shared, not copied).
        path: the head's directory (``config.json`` with ``num_nextn_predict_layers``, ``mtp.safetensors``).
        num_draft_steps: the draft steps (default: the head's MTP layers; more reuse the last layer).

    Returns:
        An ``MTPModel``: ``target`` with the head's layers, in the target's parameter dtype. ``ValueError`` names
        a missing count, a missing tensor or a tensor of the wrong shape.
    """
    from flax import nnx  # noqa: PLC0415
    from safetensors.numpy import load_file  # noqa: PLC0415

    from jaxspec.models.checkpoint import hf_tensors  # noqa: PLC0415
    from jaxspec.models.mtp import add_mtp_layers  # noqa: PLC0415

    with open(os.path.join(path, "config.json")) as f:
        n = int(json.load(f).get("num_nextn_predict_layers", 0))
    if n < 1:
        raise ValueError(f"{path}: config.json has no num_nextn_predict_layers")
    model = add_mtp_layers(target, n, rngs=nnx.Rngs(0), num_draft_steps=num_draft_steps)
    found = load_file(os.path.join(path, "mtp.safetensors"))
    for key, var in nnx.to_flat_state(nnx.state(model.mtp_layers, nnx.Param)):
        parts, transpose = hf_tensors(("mtp_layers",) + tuple(key), model.cfg)
        missing = [nm for nm, _ in parts if nm not in found]
        if missing:
            raise ValueError(f"{path}: missing tensors {missing}")
        arr = np.concatenate([found[nm].astype(np.float32) for nm, _ in parts], axis=0)
        arr = arr.T if transpose else arr
        if arr.shape != tuple(var.get_value().shape):
            raise ValueError(f"{path}: {parts[0][0]}: expected shape {tuple(var.get_value().shape)}, got {arr.shape}")
        var.set_value(jnp.asarray(arr).astype(model.param_dtype))
    return model


def num_target_layers(model: str) -> int:
    """The decoder layers of a checkpoint, read from its config only.

    Args:
        model: a llama ``.gguf`` file or a checkpoint directory.

    Returns:
        ``num_hidden_layers`` of its ``DecoderConfig``.
    """
    from jaxspec.models.checkpoint import read_config  # noqa: PLC0415
    from jaxspec.models.gguf import is_gguf, read_gguf_config  # noqa: PLC0415

    return (read_gguf_config(model) if is_gguf(model) else read_config(model)).num_hidden_layers


def load_target_with_head(model: str, head: str | None = None, *, kind: str | None = None,
                          param_dtype=jnp.float32, kv_dtype=None, head_param_dtype=jnp.float32, head_kv_dtype=None,
                          num_draft_steps: int | None = None, target=None,
                          draft_vocab: int | None = None) -> TargetWithHead:
    """Load a target checkpoint and its draft head, and the drafter that runs the head.

    Args:
        model: the target: a llama ``.gguf`` file or a checkpoint directory (``load_model``).
        head: a draft head directory (``"eagle3"`` or ``"mtp"``); ``None``: no separate head.
        kind: the head's kind; ``None`` reads it from ``head`` (``head_kind``), or loads the target alone when
            ``head`` is ``None``. ``"builtin"`` (``head`` must be ``None``): the MTP layers ``model`` carries.
        param_dtype: the target's weight dtype (an MTP head's layers take it too).
        kv_dtype: the target's KV cache dtype (``None``: ``param_dtype``).
        head_param_dtype: an EAGLE-3 head's weight dtype.
        head_kv_dtype: an EAGLE-3 head's KV cache dtype (``None``: ``head_param_dtype``).
        num_draft_steps: the draft steps of an MTP head (``"mtp"``, ``"builtin"``; default: its layers).
        target: for ``"mtp"`` only, an already loaded plain ``Decoder`` of ``model`` to attach the head to (its
            weights shared) instead of loading ``model`` again.
        draft_vocab: for ``"eagle3"`` only, keep the head's ``draft_vocab`` most frequent draft tokens
            (``load_eagle3``'s ``draft_vocab``); ``None``: all of them.

    Returns:
        ``TargetWithHead(target, drafter, kind)``: ``Engine(target, drafter, spec=...)`` decodes with it;
        without a head ``drafter`` and ``kind`` are ``None`` and ``target`` is the plain ``Decoder``.
    """
    from jaxspec.models.checkpoint import load_model  # noqa: PLC0415

    if kind is not None and kind not in HEAD_KINDS:
        raise ValueError(f"kind: expected one of {list(HEAD_KINDS)} or None, got {kind!r}")
    if kind == "builtin" and head is not None:
        raise ValueError(f"head: the builtin kind uses the MTP layers of {model} itself, got head {head!r}")
    if kind in ("eagle3", "mtp") and head is None:
        raise ValueError(f"head: kind {kind!r} needs a head directory")
    if kind is None and head is not None:
        kind = head_kind(head)
    if target is not None and kind != "mtp":
        raise ValueError(f"target: a loaded target is attached to an MTP head only, not to kind {kind!r}")
    if num_draft_steps is not None and kind not in ("mtp", "builtin"):
        raise ValueError(f"num_draft_steps: applies to an MTP head only, not to kind {kind!r}")
    if draft_vocab is not None and kind != "eagle3":
        raise ValueError(f"draft_vocab: applies to an EAGLE-3 head only, not to kind {kind!r}")
    kw = dict(param_dtype=param_dtype, kv_dtype=kv_dtype)
    if kind is None:
        return TargetWithHead(load_model(model, mtp=False, **kw), None, None)
    if kind == "eagle3":
        from jaxspec.models.eagle3 import aux_layers_from_ids, load_eagle3  # noqa: PLC0415
        from jaxspec.models.eagle3_drafter import EAGLE3Drafter  # noqa: PLC0415

        n = num_target_layers(model)
        draft = load_eagle3(head, param_dtype=head_param_dtype, kv_dtype=head_kv_dtype, num_target_layers=n,
                            draft_vocab=draft_vocab)
        tgt = load_model(model, aux_layers=aux_layers_from_ids(draft.cfg.aux_layer_ids, n), **kw)
        return TargetWithHead(tgt, EAGLE3Drafter(draft, tgt), kind)
    from jaxspec.models.mtp_drafter import MTPDrafter  # noqa: PLC0415

    if kind == "builtin":
        tgt = load_model(model, mtp=True, num_draft_steps=num_draft_steps, **kw)
    else:
        plain = load_model(model, mtp=False, **kw) if target is None else target
        tgt = load_mtp_head(plain, head, num_draft_steps=num_draft_steps)
    return TargetWithHead(tgt, MTPDrafter(tgt), kind)
