"""Save / load a ``TinyPair`` (config + weights) as a single ``.npz``."""

import json
import os

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.models.config import ModelConfig
from jaxspec.models.llama import TinyPair

DEFAULT_WEIGHTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "tiny_pair.npz")


def _key(path) -> str:
    return "/".join(str(p) for p in path)


def save_pair(model: TinyPair, path: str, *, dtype=np.float32, **meta) -> None:
    """Write ``model``'s parameters and config to one compressed ``.npz``.

    ``dtype=np.float16`` halves the file (the shipped asset: < 2 MB); loading always yields float32, so
    the loaded model *is* the reference model (tests compare against the loaded weights).
    """
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    arrays = {
        "w:" + _key(k): np.asarray(v.get_value() if hasattr(v, "get_value") else v.value).astype(dtype)
        for k, v in flat
    }
    arrays["__config__"] = np.frombuffer(json.dumps(model.cfg.to_dict()).encode(), np.uint8)
    arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez_compressed(path, **arrays)


def load_pair(path: str = DEFAULT_WEIGHTS) -> TinyPair:
    """Rebuild the ``TinyPair`` stored by ``save_pair`` (config from the file, weights exact)."""
    with np.load(path) as data:
        cfg = ModelConfig(**json.loads(bytes(data["__config__"]).decode()))
        model = TinyPair(cfg, nnx.Rngs(0))
        state = nnx.state(model, nnx.Param)
        flat = nnx.to_flat_state(state)
        missing = [_key(k) for k, _ in flat if "w:" + _key(k) not in data]
        if missing:
            raise ValueError(f"{path}: missing parameters {missing}")
        for k, v in flat:
            arr = jnp.asarray(data["w:" + _key(k)].astype(np.float32))
            v.set_value(arr) if hasattr(v, "set_value") else setattr(v, "value", arr)
        nnx.update(model, nnx.from_flat_state(flat))
    return model


def load_meta(path: str = DEFAULT_WEIGHTS) -> dict:
    with np.load(path) as data:
        return json.loads(bytes(data["__meta__"]).decode())
