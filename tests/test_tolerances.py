"""tests/tolerances.py: the same-math comparison scales with the tensor, the reference one keeps
its stated tolerance."""

import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import SAME_MATH_K, assert_matches_reference, assert_same_math, assert_same_math_tree


def _issue_58_gradient():
    """384 values reaching +-14.7, one of them -0.0073977 (the list stack's gradient in issue 58)."""
    g = np.random.default_rng(58).uniform(-14.7, 14.7, 384).astype(np.float32)
    g[0], g[1], g[7] = 14.7, -14.7, -0.0073977
    return g


def test_issue_58_reordering_passes():
    expected = _issue_58_gradient()
    actual = expected.copy()
    actual[7] = -0.0073912  # the scanned stack's: 6.6e-6 off, ~4 float32 eps of the scale
    with pytest.raises(AssertionError):  # what the test asked before: rtol=1e-4, atol=1e-6
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-6)
    assert_same_math(actual, expected)
    assert_same_math(jnp.asarray(actual), jnp.asarray(expected))
    # with margin: 10x the issue's error still passes
    actual[7] = expected[7] + 10 * 6.6e-6
    assert_same_math(actual, expected)


@pytest.mark.parametrize("relative", [1e-3, 1e-4])
def test_a_real_difference_fails(relative):
    """A wrong element, off by 1e-3 (or 1e-4) of the scale, wherever it sits."""
    expected = _issue_58_gradient()
    for index in (7, 0, 100):
        actual = expected.copy()
        actual[index] += relative * 14.7
        with pytest.raises(AssertionError, match="same math"):
            assert_same_math(actual, expected, err_msg="grad")


def test_a_wrong_result_of_the_right_shape_fails():
    """Bugs a reordering never makes: a transposed matrix, a row off by one, one term missing."""
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(16, 64)).astype(np.float32), rng.normal(size=(64, 16)).astype(np.float32)
    expected = x @ w
    for wrong in (expected.T, np.roll(expected, 1, axis=0), expected - x[:, :1] * w[:1]):
        with pytest.raises(AssertionError, match="same math"):
            assert_same_math(wrong, expected)
    assert_same_math((x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32), expected)  # another order


def test_the_tolerance_scales_with_the_tensor():
    """The same relative error passes at every scale, and a small tensor is held to its own."""
    expected = _issue_58_gradient()
    for scale in (1e-4, 1.0, 1e4):
        assert_same_math(expected * scale + 0.5 * SAME_MATH_K * 14.7 * scale, expected * scale)
        with pytest.raises(AssertionError):
            assert_same_math(expected * scale + 3 * SAME_MATH_K * 14.7 * scale, expected * scale)
    with pytest.raises(AssertionError):  # 1e-6 is 1% of a tensor reaching 1e-4
        assert_same_math(expected * 1e-4 / 14.7 + 1e-6, expected * 1e-4 / 14.7)


def test_trees_scale_each_leaf_by_its_own_magnitude():
    expected = {"w": np.full((3, 4), 100.0, np.float32), "b": np.full((4,), 1e-3, np.float32)}
    assert_same_math_tree({"w": expected["w"] + 1e-4, "b": expected["b"] + 1e-9}, expected)
    # 1e-5 is nothing next to w's 100, but 1% of b's 1e-3: the leaf is named
    with pytest.raises(AssertionError, match=r"leaf \['b'\]"):
        assert_same_math_tree({"w": expected["w"], "b": expected["b"] + 1e-5}, expected)
    with pytest.raises(AssertionError, match="structures differ"):
        assert_same_math_tree({"w": expected["w"]}, expected)


def test_zeros_and_non_finite_values():
    assert_same_math(np.zeros(3), np.zeros(3))
    with pytest.raises(AssertionError):  # nothing to scale by: zeros must come out zeros
        assert_same_math(np.full(3, 1e-12), np.zeros(3))
    with_inf = np.array([np.inf, -2.0, np.nan])
    assert_same_math(with_inf, with_inf)  # the scale is the finite entries' (2.0)
    with pytest.raises(AssertionError):
        assert_same_math(np.array([np.inf, -2.001, np.nan]), with_inf)


def test_reference_keeps_the_stated_tolerance_exactly():
    expected = _issue_58_gradient()
    actual = expected.copy()
    actual[7] += 0.9e-6
    assert_matches_reference(actual, expected, rtol=0, atol=1e-6)
    actual[7] += 0.2e-6  # 1.1e-6 off: the scale of the tensor buys nothing
    with pytest.raises(AssertionError):
        assert_matches_reference(actual, expected, rtol=0, atol=1e-6, err_msg="against Praxis")
    with pytest.raises(TypeError):  # the tolerance is always stated
        assert_matches_reference(actual, expected)
