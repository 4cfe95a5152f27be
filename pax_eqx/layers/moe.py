"""The Mixture-of-Experts feed-forward layer (praxis.layers.transformers.TransformerFeedForwardMoe's
routed part; the norm, residual and dropout around it stay the Transformer layer's business).

    x [B, T, M] -> G groups of S tokens [G, S, M]        (num_groups; 0: one group per batch row)
    logits = (x * jitter) @ gate                          [G, S, E], float32
    routing = top-2 / top-k gating (moe_routing)          combine, dispatch [G, S, E, C]
    expert_in  = einsum(gsec,gsm->egcm, dispatch, x)      tokens to their experts' buffers
    hidden     = act(expert_in @ wi[e]) (* expert_in @ wi_gate[e], gated)     [E, G, C, H]
    expert_out = einsum(egch,ehm->egcm, hidden, wo)
    y          = einsum(gsec,egcm->gsm, combine, expert_out)   back, weighted by the gates

Every expert weight has a leading "expert" logical axis; with that axis sharded, the dispatch
and combine einsums are where XLA puts the all-to-alls (tokens are sharded by group, experts by
expert). Padded tokens are never routed and their output is zero (Praxis zeroes it too).

Dropless (`dropless=True`, no capacity, nothing dropped): every token goes through its k
experts. It is computed densely -- every expert on every token, `einsum(gsm,emh->egsh)`, then
combined with the [G, S, E] gates, which are zero outside a token's k experts -- which is
Praxis' own `dense_top2` path. Why this and not a sort + `lax.ragged_dot` (MegaBlocks): it is
exact, has no [G, S, E, S] dispatch tensors (capacity = S would), shards over the expert axis
(a reduction over experts instead of all-to-alls) and is plain XLA, at the price of E/k times
the expert FLOPs; at CPU sizes that is nothing, and a token-sorted ragged matmul is the
replacement when a large dropless model needs it.

Randomness (TRAIN mode only, from the Context's key): router jitter (Switch: the router's
input, not the experts', is multiplied by U(1 - eps, 1 + eps)) and the sampled second expert
(second_expert_policy="sampling"). EVAL/DECODE need no key: no jitter, and the second expert
is the most probable one (the sampling distribution's mode) -- Praxis samples in every mode.

Side outputs, under the layer's scope: aux losses `load_balance_loss` (weighted by
load_balance_loss_weight; not added at 0) and `router_z_loss` (only when its weight > 0);
summaries `load_balance_loss` and `router_z_loss` (unweighted), `dropped_fraction`,
`router_entropy` and `expert_load_e{i}` -- one scalar per expert rather than an [E] vector,
because the summary writer turns a leading axis into one scalar per *layer* in a scanned stack
(`<name>/<layer>`) and would average a [layers, E] load over the experts, losing it.
"""

from __future__ import annotations

import typing
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.layers.activations import Activation, ActivationConfig
from pax_eqx.layers.base import Context
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.moe_routing import Routing, capacity, router_z_loss, topk_gating
from pax_eqx.layers.stochastics import Dropout, DropoutConfig

SecondExpertPolicy = Literal["all", "sampling"]

_DEFAULT_CAPACITY_FACTOR = 2.0
_DEFAULT_MIN_CAPACITY = 1


@config
class MoEFeedForwardConfig(Config):
    """A sparse feed-forward block: a router and `num_experts` two-layer experts.

    Its sizes (model_dims, hidden_dims: each expert's width) and init are the owner's, arguments
    of `build`.

    num_experts: E, the experts in the layer.
    num_groups: G, how many groups the batch's tokens are routed in (each group's tokens compete
      for capacity on their own). 0: one group per batch row (G = batch, S = time), which
      follows the batch's data sharding; Praxis sets it to the number of devices.
    top_k: experts per token. 2 is GShard's top-2 gating; any k is softmax-then-top-k.
    second_expert_policy: top_k=2 only: "all" takes the second-best expert, "sampling" draws
      it from the softmax over the other experts (TRAIN mode; EVAL takes the best).
    capacity_factor: the experts' total capacity over a group's tokens (Praxis'
      unadjusted_expert_capacity_factor): C = floor(S * capacity_factor / E) rounded up to a
      multiple of 4. Assignments over capacity are dropped.
    min_capacity: C is at least this (Praxis' expert_capacity_dim).
    dropless: no capacity; every token uses all its k experts (computed densely, see the
      module docstring; capacity_factor and min_capacity then do nothing and must stay at
      their defaults).
    renormalize: divide the k gates by their sum (GShard, Mixtral). False keeps the raw
      softmax probabilities (Switch's top-1, DeepSeek); top_k=1 requires False, since
      renormalised the gate would be 1 and the router would learn from the aux loss only.
    load_balance_loss_weight: GShard's load-balancing loss's weight (Praxis:
      moe_load_balance_loss_weight, default 1.0; GLaM 0.01). 0: not added.
    z_loss_weight: ST-MoE's router z-loss weight (1e-3 there); 0: not added.
    jitter_eps: router input noise U(1 - eps, 1 + eps) in training (Switch: 0.01); 0: none.
    gating_logit_cap: cap * tanh(logits / cap) on the router logits (Praxis); 0: none.
    activation: the experts' activation; gated=True gives act(x @ wi_gate) * (x @ wi).
    """

    num_experts: int = 8
    num_groups: int = 0
    top_k: int = 2
    second_expert_policy: SecondExpertPolicy = "all"
    capacity_factor: float = _DEFAULT_CAPACITY_FACTOR
    min_capacity: int = _DEFAULT_MIN_CAPACITY
    dropless: bool = False
    renormalize: bool = True
    load_balance_loss_weight: float = 1.0
    z_loss_weight: float = 0.0
    jitter_eps: float = 0.0
    gating_logit_cap: float = 0.0
    activation: ActivationConfig = ActivationConfig(name="relu")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "num_experts", ge=1)
        check_range(self, "num_groups", ge=0, note="0 = one group per batch row")
        check_range(self, "top_k", ge=1, le=self.num_experts, note=f"at most num_experts={self.num_experts}")
        policies = typing.get_args(SecondExpertPolicy)
        if self.second_expert_policy not in policies:
            raise ConfigError(
                f"MoEFeedForwardConfig.second_expert_policy={self.second_expert_policy!r} is not one of {policies}."
            )
        if self.second_expert_policy != "all" and self.top_k != 2:
            raise ConfigError(
                f"MoEFeedForwardConfig.second_expert_policy={self.second_expert_policy!r} needs top_k=2 (GShard "
                f"top-2 gating), got top_k={self.top_k}; use second_expert_policy='all' or top_k=2."
            )
        check_range(self, "capacity_factor", gt=0)
        check_range(self, "min_capacity", ge=1)
        if self.dropless:
            for name, default in (
                ("capacity_factor", _DEFAULT_CAPACITY_FACTOR),
                ("min_capacity", _DEFAULT_MIN_CAPACITY),
            ):
                if getattr(self, name) != default:
                    raise ConfigError(
                        f"MoEFeedForwardConfig.{name}={getattr(self, name)} has no effect with dropless=True (no "
                        f"capacity); leave it at {default} or set dropless=False."
                    )
        if self.top_k == 1 and self.renormalize:
            raise ConfigError(
                "MoEFeedForwardConfig.renormalize=True with top_k=1 makes every gate 1, so the router learns "
                "from the aux losses only; set renormalize=False (Switch: the gate is the expert's probability)."
            )
        check_range(self, ("load_balance_loss_weight", "z_loss_weight", "gating_logit_cap"), ge=0, note="0 = off")
        check_range(self, "jitter_eps", ge=0, lt=1, note="0 = no jitter")

    def build(
        self,
        key: PRNGKeyArray,
        *,
        model_dims: int,
        hidden_dims: int,
        init: WeightInit = WeightInit(),
        relu_dropout_prob: float = 0.0,
    ) -> MoEFeedForward:
        """The layer at width `model_dims` with experts of width `hidden_dims`, every weight
        (router included) from `init`; `relu_dropout_prob` is dropout on the experts' hidden
        activations (the owning Transformer's relu_dropout_prob)."""
        if model_dims <= 0 or hidden_dims <= 0:
            raise ConfigError(
                f"MoEFeedForwardConfig.build needs model_dims, hidden_dims > 0; got {model_dims}, {hidden_dims}."
            )
        return MoEFeedForward(
            self, key=key, model_dims=model_dims, hidden_dims=hidden_dims, init=init,
            relu_dropout_prob=relu_dropout_prob,
        )  # fmt: skip


class MoEFeedForward(eqx.Module):
    gate: Float[Array, "embed experts"]
    wi: Float[Array, "experts embed mlp"]
    wi_gate: Float[Array, "experts embed mlp"] | None
    wo: Float[Array, "experts mlp embed"]
    activation: Activation
    relu_dropout: Dropout
    num_groups: int = eqx.field(static=True)
    top_k: int = eqx.field(static=True)
    second_expert_policy: str = eqx.field(static=True)
    capacity_factor: float | None = eqx.field(static=True)  # None: dropless
    min_capacity: int = eqx.field(static=True)
    renormalize: bool = eqx.field(static=True)
    load_balance_loss_weight: float = eqx.field(static=True)
    z_loss_weight: float = eqx.field(static=True)
    jitter_eps: float = eqx.field(static=True)
    gating_logit_cap: float = eqx.field(static=True)

    def __init__(
        self,
        cfg: MoEFeedForwardConfig,
        *,
        key: PRNGKeyArray,
        model_dims: int,
        hidden_dims: int,
        init: WeightInit,
        relu_dropout_prob: float,
    ):
        """Made by `MoEFeedForwardConfig.build`."""
        k_gate, k_wi, k_wi_gate, k_wo = jax.random.split(key, 4)
        e = cfg.num_experts
        self.gate = init(k_gate, (model_dims, e))
        self.wi = init(k_wi, (e, model_dims, hidden_dims))
        self.wi_gate = init(k_wi_gate, (e, model_dims, hidden_dims)) if cfg.activation.gated else None
        self.wo = init(k_wo, (e, hidden_dims, model_dims))
        self.activation = cfg.activation.build()
        self.relu_dropout = DropoutConfig(rate=relu_dropout_prob).build()
        self.num_groups = cfg.num_groups
        self.top_k = cfg.top_k
        self.second_expert_policy = cfg.second_expert_policy
        self.capacity_factor = None if cfg.dropless else cfg.capacity_factor
        self.min_capacity = cfg.min_capacity
        self.renormalize = cfg.renormalize
        self.load_balance_loss_weight = cfg.load_balance_loss_weight
        self.z_loss_weight = cfg.z_loss_weight
        self.jitter_eps = cfg.jitter_eps
        self.gating_logit_cap = cfg.gating_logit_cap

    @property
    def num_experts(self) -> int:
        return self.gate.shape[-1]

    def param_axes(self) -> dict[str, tuple[str | None, ...]]:
        """The router's expert axis is never sharded (it is small and every token needs all of
        it); the experts' leading axis is "expert", which the sharding rules map to a mesh axis."""
        return {
            "gate": ("embed", None),
            "wi": ("expert", "embed", "mlp"),
            "wi_gate": ("expert", "embed", "mlp"),
            "wo": ("expert", "mlp", "embed"),
        }

    def group_shape(self, batch: int, time: int) -> tuple[int, int]:
        """(G, S) for a [batch, time] input; ConfigError if num_groups does not divide its tokens."""
        groups = self.num_groups or batch
        if (batch * time) % groups:
            raise ConfigError(
                f"MoEFeedForwardConfig.num_groups={self.num_groups} does not divide the {batch * time} tokens of a "
                f"[{batch}, {time}] input; use a divisor of batch * time, or 0 (one group per batch row)."
            )
        return groups, batch * time // groups

    def route(
        self,
        x: Float[Array, "groups group_size embed"],
        ctx: Context | None,
        paddings: Float[Array, "groups group_size"] | None = None,
    ) -> tuple[Routing, Float[Array, "groups group_size experts"], Context | None]:
        """The routing of grouped tokens, their router logits, and the context (its key used for
        jitter and sampling in TRAIN mode)."""
        training = ctx is not None and ctx.is_training
        router_in = x.astype(jnp.float32)
        if self.jitter_eps > 0 and training:
            key, ctx = ctx.next_key()
            eps = self.jitter_eps
            router_in = router_in * jax.random.uniform(key, router_in.shape, jnp.float32, 1.0 - eps, 1.0 + eps)
        logits = jnp.einsum("gsm,me->gse", router_in, self.gate)
        if self.gating_logit_cap > 0:
            logits = self.gating_logit_cap * jnp.tanh(logits / self.gating_logit_cap)
        policy, key = "all", None
        if self.second_expert_policy == "sampling" and training:
            policy = "sampling"
            key, ctx = ctx.next_key()
        group_size = x.shape[1]
        cap = None
        if self.capacity_factor is not None:
            cap = capacity(group_size, self.num_experts, self.capacity_factor, self.min_capacity)
        routing = topk_gating(
            logits, paddings, cap, k=self.top_k, second_expert_policy=policy, key=key, renormalize=self.renormalize
        )
        return routing, logits, ctx

    def __call__(
        self,
        x: Float[Array, "batch time embed"],
        ctx: Context | None,
        *,
        paddings: Float[Array, "batch time"] | None = None,
    ) -> tuple[Float[Array, "batch time embed"], Context | None]:
        """Routes every (non-padded) token to its experts and sums their outputs by the gates.

        paddings: 1.0 at padded positions (never routed; output 0). ctx None (a decode step):
        EVAL behaviour and no side outputs. Output in x's dtype; the router runs in float32.
        """
        batch, time, model_dims = x.shape
        groups, group_size = self.group_shape(batch, time)
        xg = x.reshape(groups, group_size, model_dims)
        pg = None if paddings is None else paddings.reshape(groups, group_size)
        routing, logits, ctx = self.route(xg, ctx, pg)
        if routing.combine is None:
            y, ctx = self._dense(xg, routing.expert_gates.astype(x.dtype), ctx)
        else:
            y, ctx = self._dispatched(xg, routing, ctx)
        y = y.reshape(batch, time, model_dims)
        if paddings is not None:
            y = y * (1.0 - paddings.astype(y.dtype))[..., None]
        if ctx is not None:
            ctx = self._side_outputs(ctx, routing, logits, pg)
        return y, ctx

    def _experts(
        self, h: Float[Array, "experts groups slots embed"], ctx: Context | None
    ) -> tuple[Float[Array, "experts groups slots embed"], Context | None]:
        """Each expert's feed-forward on its own tokens (slots: its buffer, or every token)."""
        hidden = jnp.einsum("egcm,emh->egch", h, self.wi.astype(h.dtype))
        if self.wi_gate is None:
            hidden = self.activation(hidden)
        else:
            hidden = self.activation(jnp.einsum("egcm,emh->egch", h, self.wi_gate.astype(h.dtype))) * hidden
        if ctx is not None:
            hidden, ctx = self.relu_dropout(hidden, ctx)
        return jnp.einsum("egch,ehm->egcm", hidden, self.wo.astype(h.dtype)), ctx

    def _dispatched(
        self, xg: Float[Array, "groups group_size embed"], routing: Routing, ctx: Context | None
    ) -> tuple[Float[Array, "groups group_size embed"], Context | None]:
        dispatch = routing.dispatch.astype(xg.dtype)
        expert_in = jnp.einsum("gsec,gsm->egcm", dispatch, xg)
        expert_out, ctx = self._experts(expert_in, ctx)
        return jnp.einsum("gsec,egcm->gsm", routing.combine.astype(xg.dtype), expert_out), ctx

    def _dense(
        self, xg: Float[Array, "groups group_size embed"], gates: Float[Array, "groups group_size experts"], ctx
    ) -> tuple[Float[Array, "groups group_size embed"], Context | None]:
        """Dropless: every expert on every token, weighted by the (mostly zero) gates."""
        expert_in = jnp.broadcast_to(xg[None], (self.num_experts,) + xg.shape)
        expert_out, ctx = self._experts(expert_in, ctx)
        return jnp.einsum("gse,egsm->gsm", gates, expert_out), ctx

    def _side_outputs(self, ctx: Context, routing: Routing, logits: Array, paddings: Array | None) -> Context:
        if self.load_balance_loss_weight > 0:
            ctx = ctx.add_aux_loss("load_balance_loss", routing.aux_loss, self.load_balance_loss_weight)
        z_loss = router_z_loss(logits, paddings)  # cheap; dropped by XLA when neither uses it
        if self.z_loss_weight > 0:
            ctx = ctx.add_aux_loss("router_z_loss", z_loss, self.z_loss_weight)
        stats = routing.stats
        ctx = ctx.add_summary("load_balance_loss", routing.aux_loss)
        ctx = ctx.add_summary("router_z_loss", z_loss)
        ctx = ctx.add_summary("dropped_fraction", stats.dropped_fraction)
        ctx = ctx.add_summary("router_entropy", stats.router_entropy)
        for e in range(self.num_experts):
            ctx = ctx.add_summary(f"expert_load_e{e}", stats.expert_load[e])
        return ctx
