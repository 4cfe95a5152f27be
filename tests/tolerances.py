"""The suite's two kinds of float comparison, each stated once, with the reason for its tolerance.

`assert_same_math`: two float32 computation *orders* of the same math (a scanned stack against
the list of its layers, sharded against unsharded, pipelined against sequential, a decode step
against the full forward, microbatches against the whole batch, grouped against replicated heads,
a fused kernel against the separate ops). Nothing but the order of the float32 roundings
differs, so the difference scales with the compared tensor: atol = SAME_MATH_K * max|expected|.

`assert_matches_reference`: a result against a formula (NumPy or jnp written out) or a fixture
(numbers Praxis wrote). The tolerance the test states is the claim; it is kept exactly.

Bitwise claims (a resumed run equals the uninterrupted one, an iterator's state) are neither:
they stay `np.testing.assert_array_equal`.
"""

import jax
import jax.numpy as jnp
import numpy as np

# Why k = 1e-5. float32's eps is 2**-23 = 1.2e-7. Summing N terms in another order moves the sum
# by about sqrt(N) * eps * (the terms' size), N * eps at worst, and XLA:CPU picks its orders per
# CPU model (an AMD EPYC and an Intel Xeon vectorise the same reduction differently). A test's
# tensor comes out of a few such reductions in a row (matmuls over tens to hundreds of terms, a
# softmax, a backward pass through several layers), each adding a few eps of the scale: 1e-5
# (~84 eps) covers that. Issue 58's failure, a scanned MoE stack's gradient 6.6e-6 off the list
# stack's near zero in a tensor reaching 14.7 (4.5e-7 of the scale, ~4 eps), passes with 20x
# margin; a real bug (a wrong element, a term missing or added twice) is off by a sizeable part
# of the scale, 1e-3 or more, and fails by 100x. An absolute atol (1e-6) cannot do both: it is
# a coin toss for a tensor of scale 10 and no check at all for one of scale 1e-4.
SAME_MATH_K = 1e-5
# The relative part only adds slack at the largest elements, where k already bounds the error.
SAME_MATH_RTOL = 1e-5


def _as_array(x) -> np.ndarray:
    x = np.asarray(x)
    return x.astype(np.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x


def _scale(expected: np.ndarray) -> float:
    """max|expected| over its finite entries (0 for none)."""
    if not np.issubdtype(expected.dtype, np.number):
        return 0.0
    finite = np.abs(expected[np.isfinite(expected)])
    return float(finite.max()) if finite.size else 0.0


def assert_same_math(actual, expected, *, rtol: float = SAME_MATH_RTOL, k: float = SAME_MATH_K, err_msg: str = ""):
    """`actual` and `expected` compute the same math in two float32 orders: element-wise
    |actual - expected| <= k * max|expected| + rtol * |expected|.

    One array (or a scalar, or a list of numbers: one tensor); for a pytree, compare leaf by
    leaf with `assert_same_math_tree`."""
    actual, expected = _as_array(actual), _as_array(expected)
    scale = _scale(expected)
    atol = k * scale
    why = f"same math in another float32 order: atol = k {k:g} x max|expected| {scale:.4g} = {atol:.3g}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=f"{err_msg} ({why})".strip())


def assert_same_math_tree(actual, expected, *, rtol: float = SAME_MATH_RTOL, k: float = SAME_MATH_K, err_msg: str = ""):
    """`assert_same_math` for pytrees with the same leaves at the same paths (static fields may
    differ: a chunked and an unchunked model's gradients compare), each leaf against its own
    scale: a bias's gradient is not held to a weight matrix's magnitude, nor the other way round."""
    leaves = jax.tree_util.tree_leaves_with_path(actual), jax.tree_util.tree_leaves_with_path(expected)
    paths = [[jax.tree_util.keystr(path) for path, _ in side] for side in leaves]
    assert paths[0] == paths[1], f"{err_msg} tree structures differ: leaves {paths[0]} vs {paths[1]}".strip()
    for path, (_, a), (_, b) in zip(paths[0], *leaves):
        assert_same_math(a, b, rtol=rtol, k=k, err_msg=f"{err_msg} leaf {path}".strip())


def assert_matches_reference(actual, expected, *, rtol: float, atol: float, err_msg: str = ""):
    """`actual` against a reference: a formula written out (NumPy, often in float64, or jnp) or
    a fixture (numbers Praxis wrote). The stated rtol / atol are the claim, kept exactly:
    element-wise |actual - expected| <= atol + rtol * |expected| (np.testing.assert_allclose's own
    rule, nothing added: both tolerances must be given, 0 included)."""
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=err_msg)
