"""Mixture-of-Experts routing: GShard top-2 and softmax-top-k gating, as pure functions.

Praxis: `gshard_utils.top2_gating_on_logits` / `topk_gating_on_logits` (GShard, Lepikhin et al.
2020, Algorithm 2). Tokens come in G groups of S tokens (`[G, S, E]` router logits); each group
is routed on its own, so a group is the unit whose tokens compete for an expert's capacity.

    probs = softmax(logits)                                    [G, S, E], float32
    slot 1: e1 = argmax(probs)          slot i > 1: argmax over the experts not yet chosen
            (top-2 with second_expert_policy="sampling": e2 is drawn from softmax(logits)
            without e1, by the Gumbel-max trick on `key`)
    gates   g_i = probs[e_i] / (sum_j probs[e_j] + 1e-9)      (renormalize=True; Mixtral, GShard)
    position of a token in expert e's buffer, slot by slot: every slot-1 assignment first (in
    token order), then the slot-2 ones after all kept slot-1 ones, ...; an assignment whose
    position is >= capacity C is dropped (that slot of the token goes to no expert; its gate
    is not renormalised over the kept ones, as Praxis' legacy_mtf_behavior=True).

`combine[g, s, e, c]` is the gate with which token s's output is read back from slot c of
expert e, `dispatch` the same pattern as booleans. The layer then moves tokens with einsums
(`gsec,gsm->egcm` in, `gsec,egcm->gsm` out), which XLA turns into all-to-alls when the expert
axis is sharded. Padded tokens are never routed: they take no capacity and get no gate.

The aux losses are functions of their own so a layer can weight and name them:
`load_balance_loss` (GShard's, in Praxis' legacy_mtf form) and `router_z_loss` (ST-MoE,
Zoph et al. 2022; not in Praxis).

Why dispatch is built from the kept assignments and not, as Praxis does, from `combine != 0`: a
gate that underflows to 0 would otherwise hold a buffer slot without being dispatched. The
outputs are the same (such a slot is combined with weight 0).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray

SECOND_EXPERT_POLICIES = ("all", "sampling")

_GATE_EPS = 1e-9  # Praxis' renormalisation epsilon


def capacity(group_size: int, num_experts: int, capacity_factor: float, min_capacity: int = 1) -> int:
    """Slots per expert per group, as Praxis computes it (a Python int: shapes are static).

    auto = floor(group_size * capacity_factor / num_experts); when auto exceeds min_capacity
    (Praxis' expert_capacity_dim) it is rounded up to a multiple of 4 (no padding on TPU),
    otherwise min_capacity is used as given. capacity_factor is Praxis'
    `unadjusted_expert_capacity_factor`: the experts' total capacity over the group's tokens,
    so 2.0 fits every top-2 assignment of a perfectly balanced router.
    """
    auto = int(group_size * capacity_factor / num_experts)
    if min_capacity < auto:
        return ((auto + 3) // 4) * 4
    return min_capacity


class RoutingStats(eqx.Module):
    """What the router did, for metrics (none of it is differentiated).

    dropped_fraction: the assignments (token x slot, padding excluded) that found their
      expert full, over all assignments.
    dropped_fraction_per_slot: the same per slot (Praxis' over_capacity_{1,2}_ratio).
    expert_load: the fraction of the router's assignments (every slot, before capacity,
      padding excluded) that chose each expert; 1/E each when balanced, sums to 1.
    router_entropy: the mean over (non-padded) tokens of the entropy of softmax(logits), in
      nats; log(E) is a router that has not decided, 0 one that is sure.
    """

    dropped_fraction: Float[Array, ""]
    dropped_fraction_per_slot: Float[Array, " k"]
    expert_load: Float[Array, " experts"]
    router_entropy: Float[Array, ""]


class Routing(eqx.Module):
    """One routing decision for G groups of S tokens (see the module docstring).

    combine / dispatch: [G, S, E, C] with a capacity; None on the dropless path.
    expert_gates: [G, S, E], each token's weight on each expert's output after capacity
      (zero for experts it does not use or was dropped from): `combine` summed over C.
    indices: [G, S, k] the chosen experts, slot by slot (padding: whatever argmax gave; its
      gates are zero).
    aux_loss: GShard's load-balancing loss (`load_balance_loss`), unweighted.
    """

    combine: Float[Array, "groups group_size experts capacity"] | None
    dispatch: Bool[Array, "groups group_size experts capacity"] | None
    expert_gates: Float[Array, "groups group_size experts"]
    indices: Int[Array, "groups group_size k"]
    aux_loss: Float[Array, ""]
    stats: RoutingStats


def load_balance_loss(
    probs: Float[Array, "groups group_size experts"],
    top1: Float[Array, "groups group_size experts"],
    paddings: Float[Array, "groups group_size"] | None = None,
) -> Float[Array, ""]:
    """GShard's auxiliary load-balancing loss (Praxis, legacy_mtf_behavior=True):

        density[g, e]       = mean_s top1[g, s, e]                (the top-1 choice, before capacity)
        density_proxy[g, e] = mean_s probs[g, s, e] * (1 - paddings[g, s])
        loss                = mean_{g, e} density * density_proxy * E^2

    1.0 for a uniform router. `top1` is the one-hot top-1 choice, zero at padding; the means are
    over all S positions, padding included (Praxis' legacy form).
    """
    num_experts = probs.shape[-1]
    if paddings is not None:
        probs = probs * (1.0 - paddings.astype(jnp.float32))[..., None]
    density = jnp.mean(top1.astype(jnp.float32), axis=-2)
    proxy = jnp.mean(probs.astype(jnp.float32), axis=-2)
    return jnp.mean(density * proxy) * (num_experts * num_experts)


def router_z_loss(
    logits: Float[Array, "groups group_size experts"], paddings: Float[Array, "groups group_size"] | None = None
) -> Float[Array, ""]:
    """ST-MoE's router z-loss: the mean over tokens of logsumexp(logits)^2, which keeps the
    router's logits small (bf16-safe) without changing its softmax. Padded tokens are not
    routed, so they are left out of the mean."""
    z = jnp.square(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1))
    return _token_mean(z, paddings)


def router_entropy(
    logits: Float[Array, "groups group_size experts"], paddings: Float[Array, "groups group_size"] | None = None
) -> Float[Array, ""]:
    """The mean over (non-padded) tokens of the entropy of softmax(logits), in nats."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return _token_mean(-jnp.sum(jnp.exp(logp) * logp, axis=-1), paddings)


def _token_mean(
    values: Float[Array, "groups group_size"], paddings: Float[Array, "groups group_size"] | None
) -> Float[Array, ""]:
    if paddings is None:
        return jnp.mean(values)
    keep = 1.0 - paddings.astype(jnp.float32)
    return jnp.sum(values * keep) / jnp.maximum(jnp.sum(keep), 1.0)


def top2_gating(
    logits: Float[Array, "groups group_size experts"],
    paddings: Float[Array, "groups group_size"] | None,
    capacity: int | None,
    *,
    second_expert_policy: str = "all",
    key: PRNGKeyArray | None = None,
    renormalize: bool = True,
) -> Routing:
    """GShard top-2 gating (Praxis' top2_gating_on_logits with legacy_mtf_behavior=True).

    second_expert_policy: "all" takes the second-best expert; "sampling" draws it from the
      softmax over the other experts with Gumbel-max: argmax(logits' + G) where logits' has
      the top-1 expert's logit at -0.7 * float32 max and G = -log(-log(U)),
      U = jax.random.uniform(key, logits.shape). Needs `key`.
    capacity: slots per expert per group (`capacity(...)`), or None for no capacity (dropless:
      no `combine`/`dispatch`, only `expert_gates`).
    renormalize: divide the two gates by their sum (+1e-9), as GShard does.
    """
    return topk_gating(
        logits, paddings, capacity, k=2, second_expert_policy=second_expert_policy, key=key, renormalize=renormalize
    )


def topk_gating(
    logits: Float[Array, "groups group_size experts"],
    paddings: Float[Array, "groups group_size"] | None,
    capacity: int | None,
    *,
    k: int,
    second_expert_policy: str = "all",
    key: PRNGKeyArray | None = None,
    renormalize: bool = True,
) -> Routing:
    """Softmax-then-top-k gating (Praxis' topk_gating_on_logits; Mixtral with renormalize=True,
    DeepSeek's unnormalised gates and Switch's top-1 with renormalize=False).

    Experts are picked slot by slot, each the most probable one not yet chosen; positions in
    the expert buffers are assigned slot by slot as in `top2_gating` (k=2 with policy "all" is
    exactly GShard top-2). second_expert_policy="sampling" needs k=2. capacity=None: no
    capacity, nothing is dropped (`combine` and `dispatch` are None).
    """
    if second_expert_policy not in SECOND_EXPERT_POLICIES:
        raise ValueError(f"second_expert_policy={second_expert_policy!r} is not one of {SECOND_EXPERT_POLICIES}.")
    if second_expert_policy == "sampling" and (k != 2 or key is None):
        raise ValueError(f"second_expert_policy='sampling' needs k=2 and a key; got k={k}, key={key}.")
    num_groups, group_size, num_experts = logits.shape
    if not 1 <= k <= num_experts:
        raise ValueError(f"k={k} must be between 1 and the number of experts, {num_experts}.")
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    nonpad = jnp.ones((num_groups, group_size), jnp.float32)
    if paddings is not None:
        nonpad = 1.0 - paddings.astype(jnp.float32)

    # Slot by slot: the chosen expert, its one-hot mask (zero at padding) and its gate.
    chosen = jnp.zeros(probs.shape, bool)
    indices, masks, gates = [], [], []
    for slot in range(k):
        if slot == 1 and second_expert_policy == "sampling":
            uniform = jax.random.uniform(key, logits.shape, jnp.float32)
            very_negative = -0.7 * jnp.finfo(jnp.float32).max
            index = jnp.argmax(jnp.where(chosen, very_negative, logits) - jnp.log(-jnp.log(uniform)), axis=-1)
        else:
            # probs >= 0, so -1 marks the experts already chosen (ties, e.g. underflowed
            # probabilities, then go to the lowest index not yet chosen).
            index = jnp.argmax(jnp.where(chosen, -1.0, probs), axis=-1)
        one_hot = jax.nn.one_hot(index, num_experts, dtype=jnp.float32)
        chosen = chosen | (one_hot > 0)
        indices.append(index)
        masks.append(one_hot * nonpad[..., None])
        gates.append(jnp.sum(probs * masks[-1], axis=-1))
    if renormalize:
        denom = sum(gates) + _GATE_EPS
        gates = [g / denom for g in gates]

    aux_loss = load_balance_loss(probs, masks[0], paddings)
    assigned = jnp.maximum(jnp.sum(nonpad), 1.0)
    load = sum(jnp.sum(m, axis=(0, 1)) for m in masks) / (assigned * k)
    entropy = router_entropy(logits, paddings)
    index_array = jnp.stack(indices, axis=-1)

    if capacity is None:
        expert_gates = sum(g[..., None] * m for g, m in zip(gates, masks))
        stats = RoutingStats(jnp.zeros((), jnp.float32), jnp.zeros((k,), jnp.float32), load, entropy)
        return Routing(None, None, expert_gates, index_array, aux_loss, stats)

    # Positions: an exclusive cumsum over the group of each slot's mask, offset by the
    # assignments kept in earlier slots (Praxis: all top-1 first, then top-2, ...).
    combine = jnp.zeros((num_groups, group_size, num_experts, capacity), jnp.float32)
    dispatch = jnp.zeros(combine.shape, bool)
    taken = jnp.zeros((num_groups, 1, num_experts), jnp.float32)
    dropped = []
    for mask, gate in zip(masks, gates):
        position = jnp.cumsum(mask, axis=-2) - mask + taken  # [G, S, E]
        kept = mask * (position < capacity)
        dropped.append(jnp.sum(mask - kept))
        taken = taken + jnp.sum(kept, axis=-2, keepdims=True)
        slot = jax.nn.one_hot(jnp.sum(position * kept, axis=-1).astype(jnp.int32), capacity, dtype=jnp.float32)
        placed = kept[..., None] * slot[:, :, None, :]  # [G, S, E, C]
        combine = combine + gate[..., None, None] * placed
        dispatch = dispatch | (placed > 0)
    stats = RoutingStats(
        dropped_fraction=sum(dropped) / (assigned * k),
        dropped_fraction_per_slot=jnp.stack(dropped) / assigned,
        expert_load=load,
        router_entropy=entropy,
    )
    return Routing(combine, dispatch, jnp.sum(combine, axis=-1), index_array, aux_loss, stats)
