"""MoE routing (GShard top-2, softmax-top-k, capacity, aux losses) against NumPy loops written
from Praxis' algorithm: token by token, slot by slot, an expert's buffer filling up in order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from layer_reference import jit, key, softmax

from pax_eqx.layers.moe_routing import (
    capacity,
    load_balance_loss,
    router_entropy,
    router_z_loss,
    top2_gating,
    topk_gating,
)


def reference_routing(logits, paddings, cap, k, *, uniform=None, renormalize=True):
    """NumPy GShard/top-k routing, one token at a time.

    Returns (combine [G,S,E,C] or None, expert_gates [G,S,E], indices [G,S,k], dropped per slot).
    `uniform`: the U(0,1) draws of the sampled second expert (None: the second-best expert).
    With cap None nothing is dropped and combine is None.
    """
    logits = np.asarray(logits, np.float64)
    g_dim, s_dim, e_dim = logits.shape
    pad = np.zeros((g_dim, s_dim)) if paddings is None else np.asarray(paddings)
    probs = softmax(logits)
    indices = np.zeros((g_dim, s_dim, k), int)
    gates = np.zeros((g_dim, s_dim, k))
    for g in range(g_dim):
        for s in range(s_dim):
            chosen = []
            for i in range(k):
                if i == 1 and uniform is not None:
                    noisy = logits[g, s] - np.log(-np.log(np.asarray(uniform, np.float64)[g, s]))
                    noisy[chosen] = -np.inf
                    e = int(np.argmax(noisy))
                else:
                    p = probs[g, s].copy()
                    p[chosen] = -1.0
                    e = int(np.argmax(p))
                chosen.append(e)
            indices[g, s] = chosen
            if pad[g, s]:
                continue
            gates[g, s] = probs[g, s, chosen]
            if renormalize:
                gates[g, s] /= gates[g, s].sum() + 1e-9
    expert_gates = np.zeros((g_dim, s_dim, e_dim))
    dropped = np.zeros(k)
    combine = None if cap is None else np.zeros((g_dim, s_dim, e_dim, cap))
    for g in range(g_dim):
        filled = np.zeros(e_dim, int)  # the next free slot of each expert's buffer
        for i in range(k):  # every slot-1 assignment first, then slot 2, ...
            for s in range(s_dim):
                if pad[g, s]:
                    continue
                e = indices[g, s, i]
                if cap is not None:
                    if filled[e] >= cap:
                        dropped[i] += 1
                        continue
                    combine[g, s, e, filled[e]] = gates[g, s, i]
                    filled[e] += 1
                expert_gates[g, s, e] += gates[g, s, i]
    return combine, expert_gates, indices, dropped


def reference_load_balance_loss(logits, paddings=None):
    """GShard: mean_{g,e}(mean_s top1 * mean_s probs * nonpad) * E^2, padding in the means."""
    probs = softmax(np.asarray(logits, np.float64))
    e_dim = probs.shape[-1]
    nonpad = np.ones(probs.shape[:2]) if paddings is None else 1.0 - np.asarray(paddings)
    top1 = np.eye(e_dim)[probs.argmax(-1)] * nonpad[..., None]
    density = top1.mean(axis=1)
    proxy = (probs * nonpad[..., None]).mean(axis=1)
    return float((density * proxy).mean() * e_dim**2)


def _logits(shape, seed=0, scale=1.0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale


def _praxis_capacity(s, e, cf, c_dim):
    auto = int(s * cf / e)
    if c_dim < auto:
        c_dim = ((auto + 3) // 4) * 4
    return c_dim


@pytest.mark.parametrize(
    "group_size, experts, factor, minimum, expected",
    [
        (16, 4, 2.0, 1, 8),  # auto 8, already a multiple of 4
        (10, 4, 2.0, 1, 8),  # auto 5 -> 8
        (100, 8, 1.25, 1, 16),  # floor(15.625) = 15 -> 16
        (3, 8, 2.0, 1, 1),  # auto 0: the minimum
        (6, 4, 1.0, 1, 1),  # auto 1 is not above the minimum: used as given
        (100, 8, 1.25, 20, 20),  # a larger minimum is not rounded
        (24, 4, 1.0, 5, 8),  # auto 6 > 5 -> 8
    ],
)
def test_capacity_formula(group_size, experts, factor, minimum, expected):
    assert capacity(group_size, experts, factor, minimum) == expected
    assert capacity(group_size, experts, factor, minimum) == _praxis_capacity(group_size, experts, factor, minimum)


_top2 = jit(top2_gating)
_topk = jit(topk_gating)
_z_loss = jit(router_z_loss)
_entropy = jit(router_entropy)
_balance = jit(load_balance_loss)


def _check(routing, ref, *, padded=None):
    combine, expert_gates, indices, dropped = ref
    valid = np.ones(indices.shape[:2], bool) if padded is None else ~np.asarray(padded, bool)
    np.testing.assert_array_equal(np.asarray(routing.indices)[valid], indices[valid])
    np.testing.assert_allclose(routing.expert_gates, expert_gates, rtol=1e-5, atol=1e-7)
    if combine is None:
        assert routing.combine is None and routing.dispatch is None
    else:
        np.testing.assert_allclose(routing.combine, combine, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(routing.dispatch, combine > 0)
        tokens = max(int(valid.sum()), 1)
        np.testing.assert_allclose(routing.stats.dropped_fraction_per_slot, dropped / tokens, rtol=1e-6)
        np.testing.assert_allclose(routing.stats.dropped_fraction, dropped.sum() / (tokens * len(dropped)), rtol=1e-6)


def test_top2_matches_reference_with_drops_and_padding():
    """G=2 groups of 12 tokens over 4 experts with capacity 2: many assignments overflow."""
    logits = _logits((2, 12, 4), seed=1, scale=2.0)
    paddings = np.zeros((2, 12), np.float32)
    paddings[1, 8:] = 1.0
    ref = reference_routing(logits, paddings, 2, 2)
    assert ref[3].sum() > 0  # the case really drops
    routing = _top2(jnp.asarray(logits), jnp.asarray(paddings), 2)
    _check(routing, ref, padded=paddings)
    # Each expert's buffer is filled from slot 0 with no gaps, and never beyond capacity.
    occupied = np.asarray(routing.dispatch).sum(axis=1)  # [G, E, C]
    assert occupied.max() <= 1
    assert np.all(np.diff(occupied, axis=-1) <= 0)
    # expert load: the router's choices before capacity, padding excluded.
    _, _, indices, _ = ref
    valid = paddings == 0
    load = np.bincount(indices[valid].ravel(), minlength=4) / (valid.sum() * 2)
    np.testing.assert_allclose(routing.stats.expert_load, load, rtol=1e-6)
    np.testing.assert_allclose(routing.aux_loss, reference_load_balance_loss(logits, paddings), rtol=1e-5)


def test_top2_large_capacity_drops_nothing_and_gates_sum_to_one():
    logits = _logits((1, 8, 4), seed=2)
    routing = _top2(jnp.asarray(logits), None, 8)
    ref = reference_routing(logits, None, 8, 2)
    _check(routing, ref)
    assert float(routing.stats.dropped_fraction) == 0.0
    np.testing.assert_allclose(np.asarray(routing.combine).sum(axis=(2, 3)), 1.0, rtol=1e-6)
    assert np.all(np.asarray(routing.dispatch).sum(axis=(2, 3)) == 2)


def test_top2_second_slot_queues_behind_every_first_slot():
    """Expert 0 is token 1's and 2's first choice and token 0's second: with capacity 2, token
    0's assignment comes after both first-slot ones and is dropped, though token 0 is first."""
    big, mid, low = 4.0, 2.0, 0.0
    logits = np.array(
        [
            [mid, big, low, low],  # token 0: e1 = 1, e2 = 0
            [big, low, mid, low],  # token 1: e1 = 0, e2 = 2
            [big, low, low, mid],  # token 2: e1 = 0, e2 = 3
            [low, mid, low, big],  # token 3: e1 = 3, e2 = 1
        ],
        np.float32,
    )[None]
    routing = _top2(jnp.asarray(logits), None, 2)
    np.testing.assert_array_equal(routing.indices[0], [[1, 0], [0, 2], [0, 3], [3, 1]])
    dispatch = np.asarray(routing.dispatch)[0]
    where = {(int(s), int(e)): int(np.argmax(dispatch[s, e])) for s, e in zip(*np.nonzero(dispatch.any(-1)))}
    assert where == {(0, 1): 0, (1, 0): 0, (2, 0): 1, (3, 3): 0, (1, 2): 0, (2, 3): 1, (3, 1): 1}
    assert not np.asarray(routing.dispatch)[0, 0, 0].any()  # token 0's second expert was full
    np.testing.assert_allclose(routing.stats.dropped_fraction_per_slot, [0.0, 0.25])
    # The dropped slot's gate is not renormalised onto the kept one (Praxis' legacy behaviour).
    probs = softmax(logits[0, 0].astype(np.float64))
    np.testing.assert_allclose(routing.expert_gates[0, 0, 1], probs[1] / (probs[1] + probs[0]), rtol=1e-6)
    _check(routing, reference_routing(logits, None, 2, 2))


def test_overflow_every_token_wants_the_same_experts():
    """All 8 tokens prefer expert 0 then 1; capacity 4 keeps the first four of each slot."""
    logits = np.tile(np.array([3.0, 2.0, 0.0, -1.0], np.float32), (1, 8, 1))
    logits = logits + _logits((1, 8, 4), seed=3, scale=0.01)
    routing = _top2(jnp.asarray(logits), None, 4)
    kept = np.asarray(routing.dispatch)[0].any(-1)  # [S, E]
    np.testing.assert_array_equal(kept[:, 0], [1, 1, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(kept[:, 1], [1, 1, 1, 1, 0, 0, 0, 0])
    assert not kept[:, 2:].any()
    np.testing.assert_allclose(routing.stats.dropped_fraction_per_slot, [0.5, 0.5])
    np.testing.assert_allclose(routing.stats.dropped_fraction, 0.5)
    assert np.all(np.asarray(routing.combine)[0, 4:] == 0)  # dropped tokens get no expert at all


def test_padding_takes_no_capacity():
    """Padded tokens in front all prefer expert 0; the real tokens behind them still get
    expert 0's buffer from slot 0, and the padded ones get nothing."""
    logits = np.tile(np.array([3.0, 1.0, 0.0, -1.0], np.float32), (1, 6, 1))
    paddings = np.array([[1, 1, 1, 0, 0, 0]], np.float32)
    routing = _top2(jnp.asarray(logits), jnp.asarray(paddings), 2)
    dispatch = np.asarray(routing.dispatch)[0]
    assert not dispatch[:3].any() and np.all(np.asarray(routing.combine)[0, :3] == 0)
    assert dispatch[3, 0, 0] and dispatch[4, 0, 1] and not dispatch[5, 0].any()
    np.testing.assert_allclose(routing.stats.dropped_fraction_per_slot, [1 / 3, 1 / 3])
    np.testing.assert_allclose(routing.stats.expert_load, [0.5, 0.5, 0.0, 0.0])


@pytest.mark.parametrize("renormalize", [True, False])
def test_topk_matches_reference(renormalize):
    logits = _logits((2, 10, 6), seed=4, scale=1.5)
    paddings = np.zeros((2, 10), np.float32)
    paddings[0, -3:] = 1.0
    routing = _topk(jnp.asarray(logits), jnp.asarray(paddings), 4, k=3, renormalize=renormalize)
    ref = reference_routing(logits, paddings, 4, 3, renormalize=renormalize)
    _check(routing, ref, padded=paddings)
    sums = np.asarray(routing.expert_gates).sum(-1)[paddings == 0]
    if renormalize:
        assert np.all(sums <= 1.0 + 1e-6)
    else:
        assert np.all(sums < 1.0)  # three softmax probabilities out of six


def test_top1_is_switch_routing():
    logits = _logits((1, 12, 4), seed=5)
    routing = _topk(jnp.asarray(logits), None, 4, k=1, renormalize=False)
    _check(routing, reference_routing(logits, None, 4, 1, renormalize=False))


def test_dropless_gates_every_token_through_its_k_experts():
    logits = _logits((2, 9, 5), seed=6, scale=2.0)
    paddings = np.zeros((2, 9), np.float32)
    paddings[1, 0] = 1.0
    routing = _topk(jnp.asarray(logits), jnp.asarray(paddings), None, k=2)
    ref = reference_routing(logits, paddings, None, 2)
    _check(routing, ref, padded=paddings)
    assert np.all(np.count_nonzero(np.asarray(routing.expert_gates)[paddings == 0], axis=-1) == 2)
    assert float(routing.stats.dropped_fraction) == 0.0


def test_sampling_second_expert_against_the_same_gumbel_noise():
    logits = _logits((2, 16, 4), seed=7)
    k = key(3)
    uniform = np.asarray(jax.random.uniform(k, logits.shape, jnp.float32))
    routing = _top2(jnp.asarray(logits), None, 8, second_expert_policy="sampling", key=k)
    _check(routing, reference_routing(logits, None, 8, 2, uniform=uniform))
    indices = np.asarray(routing.indices)
    assert np.all(indices[..., 0] == logits.argmax(-1))
    assert np.all(indices[..., 0] != indices[..., 1])
    greedy = np.asarray(_top2(jnp.asarray(logits), None, 8).indices)
    assert np.any(greedy[..., 1] != indices[..., 1])  # it really samples


def test_sampling_second_expert_follows_the_softmax_of_the_others():
    probs = np.array([0.4, 0.3, 0.2, 0.1])
    logits = np.tile(np.log(probs).astype(np.float32), (1, 4000, 1))
    routing = _top2(jnp.asarray(logits), None, None, second_expert_policy="sampling", key=key(5))
    second = np.asarray(routing.indices)[0, :, 1]
    frequency = np.bincount(second, minlength=4) / second.size
    np.testing.assert_allclose(frequency, [0.0, 0.5, 1 / 3, 1 / 6], atol=0.03)


def test_load_balance_loss_formula():
    logits = _logits((3, 7, 5), seed=8, scale=2.0)
    paddings = (np.random.default_rng(9).random((3, 7)) < 0.3).astype(np.float32)
    probs = softmax(logits.astype(np.float64))
    top1 = np.eye(5)[probs.argmax(-1)] * (1.0 - paddings[..., None])
    probs, top1 = jnp.asarray(probs, jnp.float32), jnp.asarray(top1, jnp.float32)
    np.testing.assert_allclose(
        _balance(probs, top1, jnp.asarray(paddings)), reference_load_balance_loss(logits, paddings), rtol=1e-5
    )
    # A router with uniform probabilities scores exactly 1, whatever its argmax does.
    uniform = jnp.full((2, 6, 4), 0.25)
    top1 = jnp.asarray(np.eye(4)[np.zeros((2, 6), int)], jnp.float32)
    np.testing.assert_allclose(_balance(uniform, top1), 1.0, rtol=1e-6)


def test_router_z_loss_and_entropy_formulas():
    logits = _logits((2, 5, 4), seed=10, scale=3.0)
    paddings = np.zeros((2, 5), np.float32)
    paddings[0, 3:] = 1.0
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x).sum(-1))
    p = softmax(x)
    entropy = -(p * np.log(p)).sum(-1)
    keep = paddings == 0
    np.testing.assert_allclose(_z_loss(jnp.asarray(logits)), np.mean(lse**2), rtol=1e-5)
    np.testing.assert_allclose(_z_loss(jnp.asarray(logits), jnp.asarray(paddings)), np.mean(lse[keep] ** 2), rtol=1e-5)
    np.testing.assert_allclose(_entropy(jnp.asarray(logits), jnp.asarray(paddings)), entropy[keep].mean(), rtol=1e-5)
    np.testing.assert_allclose(_entropy(jnp.zeros((1, 3, 8))), np.log(8), rtol=1e-6)


def test_gates_are_differentiable_through_the_router():
    logits = jnp.asarray(_logits((1, 8, 4), seed=11))
    target = jnp.asarray(_logits((1, 8, 4, 4), seed=12))
    grad = jit(jax.grad(lambda lg, t: jnp.sum(top2_gating(lg, None, 4).combine * t)))(logits, target)
    assert np.all(np.isfinite(grad)) and np.any(np.asarray(grad) != 0)


def test_bad_arguments():
    logits = jnp.zeros((1, 4, 3))
    with pytest.raises(ValueError, match="sampling"):
        top2_gating(logits, None, 2, second_expert_policy="sampling")
    with pytest.raises(ValueError, match="not one of"):
        top2_gating(logits, None, 2, second_expert_policy="random")
    with pytest.raises(ValueError, match="k=4"):
        topk_gating(logits, None, 2, k=4)
