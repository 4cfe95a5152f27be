"""Pax Layer Basics, redone in pax_eqx.

Run it:  python docs/tutorials/layer_basics.py   (tests/test_tutorials.py runs it too, so it
cannot rot.)

This follows Pax's "Layer Basics" notebook step by step: a Linear layer, a Bias layer, and a
FeedForward layer with a child template, a non-trainable moving mean, a summary, randomness and
an aux loss; then init and apply, with and without `mutable=True`. Each Pax call is named next to
its pax_eqx form; docs/pax_to_pax_eqx.md has the full table.

The one idea to hold on to: Pax hides four things in Flax collections (params, non-trainable
variables, summaries/aux losses, randomness). pax_eqx passes them in the open:

- a layer is an `equinox.Module`, an immutable pytree: its trainable weights are its array fields
  (Pax's `self.theta.w` is `self.w`), its children are module fields;
- it is built from a frozen *config*, Pax's template (`pax_fiddle.Config`): `cfg.build(key)`;
- anything else a call reads or writes -- a PRNG key, non-trainable variables, summaries, aux
  losses, the train/eval mode -- travels in a `layers.Context`: `y, ctx = layer(x, ctx)`.
  A layer that needs none of them is just `y = layer(x)`.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from pax_eqx import layers
from pax_eqx.config import Config, ConfigError, config

# ## Layer definition
#
# Pax splits a layer's fields into hyperparameters, child layers and templates, and declares
# variables in `setup`. In pax_eqx:
#
# - hyperparameters and templates are fields of the layer's *config* (a frozen, keyword-only
#   dataclass made by `@config`; a typo in a field name fails at once, with a suggestion);
# - what the *parent* decides (a child's sizes, say) is not a field of the child's config but
#   an argument of its `build`: a config holds only what its user chooses, so no value can be
#   set on a template and then silently overwritten;
# - `setup` is the module's `__init__(cfg, *, key)`: it creates the weights (Pax:
#   `create_variable`) and builds children from templates (Pax: `create_child`);
# - `__call__` is the forward pass.
#
# Weight shapes are written into the code, as Pax requires (no shape inference). Each weight
# dimension also gets a logical axis name in `param_axes()`, which the sharding rules map onto
# the device mesh (Pax: WeightHParams' `tensor_split_dims_mapping`).


@config
class LinearConfig(Config):
    """Hyperparameters of Linear; `params_init` is Pax's `params_init` (Xavier uniform). Its sizes
    are `build` arguments: as a template, they are whatever the owning layer needs."""

    params_init: layers.WeightInit = layers.WeightInit()

    def build(self, key: PRNGKeyArray, *, input_dims: int, output_dims: int) -> "Linear":
        return Linear(self, key=key, input_dims=input_dims, output_dims=output_dims)


class Linear(eqx.Module):
    """A simple linear layer: y = x @ w."""

    w: Float[Array, "input_dims output_dims"]

    def __init__(self, cfg: LinearConfig, *, key: PRNGKeyArray, input_dims: int, output_dims: int):
        # Pax: self.create_variable('w', WeightHParams(shape=[in, out], init=self.params_init))
        self.w = cfg.params_init(key, (input_dims, output_dims))

    def __call__(self, inputs: Float[Array, "*batch input_dims"]) -> Float[Array, "*batch output_dims"]:
        return jnp.matmul(inputs, self.w)  # Pax: self.theta.w

    def param_axes(self) -> dict:
        return {"w": ("embed", "mlp")}


@config
class BiasConfig(Config):
    dims: int = 0

    def build(self, key: PRNGKeyArray | None = None) -> "Bias":
        return Bias(self)


class Bias(eqx.Module):
    """A simple bias layer: y = x + b, b initialised to zero (Pax: WeightInit.Constant(0.0))."""

    b: Float[Array, " dims"]

    def __init__(self, cfg: BiasConfig):
        self.b = jnp.zeros((cfg.dims,))

    def __call__(self, inputs: Float[Array, "*batch dims"]) -> Float[Array, "*batch dims"]:
        return inputs + self.b

    def param_axes(self) -> dict:
        return {"b": ("mlp",)}


# ## FeedForward: templates, a non-trainable variable, a summary, randomness and an aux loss
#
# As in the notebook, the forward pass does a few things a real FeedForward would not, to show
# each mechanism once. Every Context method returns a *new* Context (nothing is mutated), so
# each line is `..., ctx = ...`:
#
#   Pax                                        pax_eqx
#   self.add_summary('inputs_mean', v)         ctx = ctx.add_summary("inputs_mean", v)
#   self.next_prng_key()                       key, ctx = ctx.next_key()
#   self.add_aux_loss('dummy_aux_loss', v)     ctx = ctx.add_aux_loss("dummy_aux_loss", v)
#   self.get_var('moving_mean')                ctx.get_var(self.moving_mean)
#   self.update_var('moving_mean', v)          ctx = ctx.update_var(self.moving_mean, v)
#
# The moving mean is declared with `layers.variable(init, mean_sync=True)`: Pax's
# `create_variable(..., trainable=False)` with `REQUIRES_MEAN_SYNC`. It is not a parameter
# (gradients and optimizers never see it); its value lives in the state.


# [feedforward-start]
@config
class FeedForwardConfig(Config):
    input_dims: int = 0
    output_dims: int = 0
    has_bias: bool = True
    linear_tpl: LinearConfig = LinearConfig()  # a template: the child's config, less its sizes
    activation_tpl: layers.ActivationConfig = layers.ActivationConfig(name="relu")

    def build(self, key: PRNGKeyArray) -> "FeedForward":
        return FeedForward(self, key=key)


class FeedForward(eqx.Module):
    linear: Linear
    bias: Bias | None
    activation: layers.Activation
    moving_mean: layers.Variable

    def __init__(self, cfg: FeedForwardConfig, *, key: PRNGKeyArray):
        # Pax: self.create_child('linear', linear_tpl), after setting the template's dims.
        self.linear = cfg.linear_tpl.build(key, input_dims=cfg.input_dims, output_dims=cfg.output_dims)
        self.bias = BiasConfig(dims=cfg.output_dims).build() if cfg.has_bias else None
        self.activation = cfg.activation_tpl.build()
        self.moving_mean = layers.variable(jnp.zeros((cfg.output_dims,)), mean_sync=True)

    def __call__(self, inputs: Float[Array, "*b i"], ctx: layers.Context) -> tuple[Array, layers.Context]:
        ctx = ctx.add_summary("inputs_mean", jnp.mean(inputs))
        prng_key, ctx = ctx.next_key()
        inputs_with_noise = inputs + jax.random.uniform(prng_key, inputs.shape, inputs.dtype)
        projected_inputs = self.linear(inputs_with_noise)
        if self.bias is not None:
            projected_inputs = self.bias(projected_inputs)
        output = self.activation(projected_inputs)
        ctx = ctx.add_aux_loss("dummy_aux_loss", jnp.mean(output))
        ctx = ctx.update_var(self.moving_mean, ctx.get_var(self.moving_mean) + 1.0)
        return output, ctx


# [feedforward-end]


# ## Instantiate a layer
#
# Pax: `ffn_cfg = pax_fiddle.Config(FeedForward, name='ffn', input_dims=1, output_dims=2)` and
# `instantiate(ffn_cfg)`. Here the config is the template, and `layers.init(cfg, key)` (Pax:
# `ffn.init`) builds the module and returns its initial non-trainable state next to it. The
# trainable weights are already in the module: there is no separate `initial_vars['params']`.

ffn_cfg = FeedForwardConfig(input_dims=1, output_dims=2)
print("config:", ffn_cfg)

# Templates are data: change a child's hyperparameter without touching the class.
print("with GELU:", ffn_cfg.replace(activation_tpl=layers.ActivationConfig(name="gelu")).activation_tpl)

# A typo fails immediately, naming the field and the likely fix.
try:
    FeedForwardConfig(input_dims=1, output_dim=2)
except ConfigError as error:
    print("typo:", error)

npy_inputs = np.random.default_rng(0).normal(1.0, 0.5, [2, 2, ffn_cfg.input_dims]).astype(np.float32)
inputs = jnp.asarray(npy_inputs)

prng_key = jax.random.key(1)
prng_key, init_key, noise_key = jax.random.split(prng_key, 3)
ffn, initial_state = layers.init(ffn_cfg, init_key)

# What Pax calls initial_vars: the 'params' collection is the module's arrays ...
params = eqx.filter(ffn, eqx.is_array)
print("params:", {jax.tree_util.keystr(path): a.shape for path, a in jax.tree_util.tree_leaves_with_path(params)})
print("linear.w:", np.round(np.asarray(ffn.linear.w, np.float64), 4).tolist())
# ... and the 'non_trainable' collection is the state.
print("moving_mean (initial):", np.asarray(initial_state.get(ffn.moving_mean)).tolist())
print("mean-synced variables:", sorted(layers.mean_sync_markers(ffn)))

# ## layer.apply
#
# Pax: `ffn.apply(initial_vars, inputs, rngs={RANDOM: noise_key})`. `layers.apply` builds the
# Context (key, state, mode), calls the layer, and by default returns only the output.

outputs = layers.apply(ffn, inputs, state=initial_state, key=noise_key)
print("outputs:", np.round(np.asarray(outputs, np.float64), 4).tolist())

# ## layer.apply(..., mutable=True)
#
# With `mutable=True` the final Context comes back too: its `state` holds the updated
# non-trainable variables, `summaries` and `aux_losses` the side outputs (named by scope, as
# Pax's collections are by layer path). The state passed in is left as it was.

outputs, ctx = layers.apply(ffn, inputs, state=initial_state, key=noise_key, mutable=True)
print("outputs (mutable):", np.round(np.asarray(outputs, np.float64), 4).tolist())
print("moving_mean (updated):", np.asarray(ctx.get_var(ffn.moving_mean)).tolist())
print("summaries:", {k: round(float(v), 4) for k, v in ctx.summaries.items()})
print("aux_losses:", {k: round(float(v), 4) for k, v in ctx.aux_losses.items()})

# ## A training step: jit, grad, and threading the state
#
# The state goes in and comes out like any other value, so a step is a pure function that
# `jax.jit` compiles once. Aux losses join the loss; the moving mean is not differentiated.


@eqx.filter_jit
def loss_and_state(ffn: FeedForward, state: eqx.nn.State, inputs: Array, key: PRNGKeyArray):
    outputs, ctx = layers.apply(ffn, inputs, state=state, key=key, mutable=True)
    loss = jnp.mean(outputs**2) + sum(ctx.aux_losses.values())
    return loss, ctx.state


state = initial_state
for _ in range(3):
    prng_key, step_key = jax.random.split(prng_key)
    grads, state = eqx.filter_grad(loss_and_state, has_aux=True)(ffn, state, inputs, step_key)
    ffn = eqx.apply_updates(ffn, jax.tree.map(lambda g: -0.1 * g, grads))  # plain SGD (optax in pax_eqx.learners)
print("moving_mean after 3 steps:", np.asarray(state.get(ffn.moving_mean)).tolist())
print("gradient leaves:", [g.shape for g in jax.tree.leaves(grads)])
