"""Argument checks shared by the ops of ``ops.verify`` and ``ops.accept``: dtypes and shapes of index and
float arrays, static thresholds, and host-side value checks (``host_values``: NumPy / Python values and
concrete jax arrays are checked on the host with a ``ValueError``; traced values are flagged in checked
mode instead)."""

import jax
import numpy as np

from jaxspec._validate import check_shape, float_array, index_array
from jaxspec.ops.tree_walk import Tree

FLOAT_DTYPES = (np.float32,)


def validate_tree(candidates, retrieve_index, retrieve_next_token, retrieve_next_sibling):
    retrieve_index = index_array("retrieve_index", retrieve_index)
    if retrieve_index.ndim != 2:
        check_shape("retrieve_index", retrieve_index, (None, None))
    shape = tuple(retrieve_index.shape)
    return Tree(
        candidates=index_array("candidates", candidates, shape),
        retrieve_index=retrieve_index,
        next_token=index_array("retrieve_next_token", retrieve_next_token, shape),
        next_sibling=index_array("retrieve_next_sibling", retrieve_next_sibling, shape),
    )


def threshold(name: str, x) -> float:
    """Thresholds are static Python floats (server configuration, as upstream's ``float`` arguments)."""
    if not isinstance(x, (int, float, np.floating, np.integer)) or isinstance(x, bool):
        raise ValueError(f"{name}: expected a Python float in [0, 1] (static), got {x!r}")
    if not 0.0 <= float(x) <= 1.0:
        raise ValueError(f"{name}: expected a value in [0, 1], got {x}")
    return float(x)


def host_values(x):
    """The values of ``x`` for a host-side check, or ``None`` when they are not known before the op runs
    (``x`` traced under a ``jit``: checked mode flags those). NumPy and Python values are read as they are; a
    concrete jax array (an eager call) is read back from its device with an explicit transfer (a sync before
    the op is dispatched, allowed under ``jax.transfer_guard("disallow")``)."""
    if isinstance(x, jax.core.Tracer):
        return None
    if isinstance(x, jax.Array):
        return np.asarray(jax.device_get(x))
    if isinstance(x, (np.ndarray, np.generic, list, tuple, int, float)):
        return np.asarray(x)
    return None


def top_k_arg(name: str, top_k, rows: int):
    """Validate per-row ``top_k`` (int, shape ``(rows,)``, values ``>= 1`` when known on the host)."""
    vals = host_values(top_k)
    top_k = index_array(name, top_k, (rows,))
    if vals is not None and vals.size and vals.min() < 1:
        raise ValueError(f"{name}: expected values >= 1, got {int(vals.min())}")
    return top_k


def top_p_arg(name: str, top_p, rows: int, dtypes=FLOAT_DTYPES):
    """Validate per-row ``top_p`` (float, shape ``(rows,)``, values in ``(0, 1]`` when known on the host)."""
    vals = host_values(top_p)
    top_p = float_array(name, top_p, (rows,), dtypes)
    if vals is not None and vals.size and not ((vals > 0).all() and (vals <= 1).all()):
        raise ValueError(f"{name}: expected values in (0, 1], got min={vals.min()} max={vals.max()}")
    return top_p
