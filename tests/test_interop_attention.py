"""The attention side by side (``jaxspec.interop.ops_attention``) bites: the right mask passes within ATOL,
a wrong mask (all ones instead of the tree) fails it by far, and the harness reports that as a mismatch."""

import numpy as np
import pytest

pytestmark = [pytest.mark.interop, pytest.mark.filterwarnings("ignore::RuntimeWarning")]


def test_wrong_mask_fails_the_attention_check():
    torch = pytest.importorskip("torch")
    import jax.numpy as jnp

    from jaxspec.interop import harness
    from jaxspec.interop.ops_attention import ATOL
    from jaxspec.interop.registry import OPS

    d = OPS["paged_attention"]
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**31))
    inputs = harness.make_inputs("paged_attention", rng, d.configs[0])
    assert harness.compare("paged_attention", implementation="reference", **inputs).ok

    orig = d.run_original({k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()},
                          "cpu")["out"].numpy()
    wrong = dict(inputs, qmask=np.ones_like(inputs["qmask"]))
    got = np.asarray(d.run_jaxspec(harness.jaxspec_fn("paged_attention"),
                                   {k: (jnp.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in wrong.items()},
                                   {"implementation": "reference"})["out"])
    assert np.abs(got - orig).max() > 10 * ATOL  # the tree mask matters at this tolerance
