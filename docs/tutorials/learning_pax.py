"""Learning Pax, redone in pax_eqx: Layer, Model, Task, experiment config, registry, job dir.

Run it:  python docs/tutorials/learning_pax.py   (tests/test_tutorials.py runs it too, so it
cannot rot; it takes a few seconds on a CPU.)

Pax's "Learning Pax" page introduces the pieces every Pax user meets -- a Layer, a Model, a Task,
HParams, an Experiment and its registry -- and then sends you to run one. This file walks the
same pieces in the same order, each with a few lines of running code at tiny sizes, and ends by
training the experiment it built with `python -m pax_eqx.train` (called in-process) and
looking at the job dir it writes. Each section opens with what a Pax user knows, then what
changed in pax_eqx and why.

The one change behind all the others: Pax keeps params, non-trainable variables, summaries and
PRNG streams in hidden Flax collections, and its objects (layers, tasks, experiments) are
classes with mutable hyperparameters. In pax_eqx everything is a value: a layer is an immutable
`equinox.Module` built from a frozen config, whatever else a call reads or writes travels in a
`layers.Context`, and a train step is a pure function `state, batch -> state, outputs`.
docs/pax_to_pax_eqx.md maps every Pax call to its pax_eqx form; docs/tutorials/layer_basics.py
redoes Pax's Layer Basics notebook in detail.
"""

import json
import pathlib
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

import pax_eqx.train
from experiments import registry
from pax_eqx import layers
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.config import ConfigError, config
from pax_eqx.data import DataConfig, DigitsSource, InputConfig, build_input, build_tokenizer
from pax_eqx.experiment import ExperimentConfig, TrainConfig
from pax_eqx.learners import LearnerConfig, SgdConfig
from pax_eqx.metrics import HostAccumulator, Metrics, weighted_mean
from pax_eqx.models import Batch, Model, ModelConfig
from pax_eqx.tasks.task import Task

# %% [markdown]
# ## Learning JAX
#
# Pax's table of key JAX functions still holds, with two changes: `pjit` has been folded into
# `jax.jit` (give it `in_shardings` / `out_shardings`, or arrays that carry a `NamedSharding`),
# and `pmap` is not used: one SPMD program over a device mesh does data, FSDP and tensor
# parallelism alike (docs/sharding.md). `grad`, `jit` and `vmap` are used as they are.


# %%
def squared_norm(w: Float[Array, " n"]) -> Float[Array, ""]:
    return jnp.sum(w**2)


w = jnp.arange(3.0)
np.testing.assert_allclose(jax.grad(squared_norm)(w), 2 * w)  # d/dw |w|^2 = 2w
batched = jax.jit(jax.vmap(squared_norm))(jnp.stack([w, 2 * w]))  # one program, a batch of inputs
np.testing.assert_allclose(batched, [5.0, 20.0])
print("vmap(squared_norm):", batched.tolist())

# %% [markdown]
# ## Learning Flax -> learning Equinox
#
# Pax layers are Flax `nn.Module`s whose variables live outside the object, in collections
# handed to `init` / `apply`. A pax_eqx layer is an `equinox.Module`: a frozen dataclass that is
# also a pytree, whose array fields *are* its weights. `jax.grad` of a function of the module
# differentiates with respect to those arrays; `eqx.filter(module, eqx.is_array)` is Pax's
# `initial_vars['params']`. Nothing else from Flax is needed.
#
# ## Pax Elements
#
# ### Layer
#
# A Pax layer has three parts: `HParams`, `setup` and `__call__`. In pax_eqx:
#
#   Pax                                   pax_eqx
#   class HParams / pax_fiddle.Config     a frozen `@config` dataclass (`layers.BatchNormConfig`)
#   setup(): create_variable/create_child the module's `__init__`, called by `cfg.build(key)`
#   __call__(inputs)                      `__call__(x)`, or `__call__(x, ctx)` when it needs a
#                                         key, state, summaries, aux losses or the mode
#   layer.init(rngs, x)                   `layers.init(cfg, key)` -> (module, non-trainable state)
#   layer.apply(vars, x, mutable=True)    `layers.apply(module, x, state=..., mutable=True)`
#
# A deterministic stateless layer is a plain function of its input: `y = layer(x)`.

# %%
x = jnp.asarray(np.random.default_rng(0).normal(2.0, 3.0, (4, 3)), jnp.float32)

linear = layers.LinearConfig(input_dims=3, output_dims=2).build(jax.random.key(0))
np.testing.assert_allclose(linear(x), x @ linear.w, rtol=1e-6)
print("linear.w shape:", linear.w.shape)

# %% [markdown]
# BatchNorm is the other kind: it reads and writes non-trainable moving statistics (Pax's
# `trainable=False` variables with REQUIRES_MEAN_SYNC) and behaves differently in training and
# in eval. Both come through the Context. `layers.init` returns the module *and* its initial
# state; a call returns its output and a new Context whose `state` holds the updated
# statistics. Nothing is mutated: `state` is still the initial one afterwards.

# %%
bn_cfg = layers.BatchNormConfig(dims=3, decay=0.9)
bn, state = layers.init(bn_cfg, jax.random.key(0))

ctx = layers.Context(state=state, mode=layers.Mode.TRAIN)
y_train, ctx = bn(x, ctx)  # Pax: bn.apply(vars, x, mutable=[NON_TRAINABLE])

mean, var = np.asarray(x).mean(0), np.asarray(x).var(0)  # the batch statistics
np.testing.assert_allclose(y_train, (x - mean) / np.sqrt(var + bn_cfg.epsilon), rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(ctx.get_var(bn.moving_mean), 0.9 * 0.0 + 0.1 * mean, rtol=1e-5)
np.testing.assert_allclose(ctx.get_var(bn.moving_variance), 0.9 * 1.0 + 0.1 * var, rtol=1e-5)
np.testing.assert_array_equal(state.get(bn.moving_mean), [0.0, 0.0, 0.0])  # the input state is untouched
print("moving_mean after one training call:", np.round(np.asarray(ctx.get_var(bn.moving_mean), np.float64), 4).tolist())

# In eval the moving statistics normalise, and the state comes back unchanged. `layers.apply`
# builds the Context for you (Pax: `layer.apply(vars, x)`).
y_eval = layers.apply(bn, x, state=ctx.state, mode=layers.Mode.EVAL)
moving_mean, moving_var = 0.1 * mean, 0.9 + 0.1 * var
np.testing.assert_allclose(y_eval, (x - moving_mean) / np.sqrt(moving_var + bn_cfg.epsilon), rtol=1e-4, atol=1e-5)

# Randomness is a key in the Context, split where it is consumed (Pax: `next_prng_key()` from
# the `rngs` passed to apply). Dropout keeps an element with probability 1 - rate and scales it
# by 1 / (1 - rate); in eval it is the identity and needs no key.
dropout = layers.DropoutConfig(rate=0.5).build()
y_drop, _ = dropout(x, layers.Context(key=jax.random.key(2), mode=layers.Mode.TRAIN))
assert np.all((np.asarray(y_drop) == 0) | np.isclose(y_drop, 2 * x))
np.testing.assert_array_equal(dropout(x, layers.Context(mode=layers.Mode.EVAL))[0], x)

# %% [markdown]
# ### Model
#
# Pax's BaseModel answers `compute_predictions(input_batch)` and
# `compute_loss(predictions, input_batch)`, the latter returning `WeightedScalars` (each metric a
# `(value, weight)` pair), and optionally `decode`. pax_eqx keeps exactly this contract, in pure
# form (`pax_eqx.models.Model`):
#
#     predictions, ctx = model.compute_predictions(batch, ctx)   # ctx: key, state, summaries, mode
#     metrics = model.compute_loss(predictions, batch)           # {name: Weighted(value, weight)}
#
# `LanguageModel`, `ClassificationModel` and `SequenceModel` are the library's families (decoding,
# Pax's `decode`, is there for the models whose config says `decodes = True`). A family
# of your own is a `ModelConfig` (the template; `build(key)` makes the model) and a `Model`. The
# one below is a softmax regression on normalised pixels: BatchNorm over the 64 inputs, then a
# linear map to 10 logits. Padded rows (weight 0) are left out of the batch statistics and
# of every metric: each metric is a mean over the real rows, weighted by how many there were,
# so merging microbatches, eval batches or hosts by weight is exact.


# %%
@config
class PixelClassifierConfig(ModelConfig):
    """num_pixels: features per example. num_classes: classes. norm_decay: BatchNorm's decay."""

    num_pixels: int = 64
    num_classes: int = 10
    norm_decay: float = 0.9

    def build(self, key: PRNGKeyArray) -> "PixelClassifier":
        return PixelClassifier(self, key=key)


class PixelClassifier(Model):
    norm: layers.BatchNorm
    proj: layers.Linear

    input_keys = ("inputs", "labels", "weights")  # the batch keys it reads; the Task checks them
    loss_name = "avg_xent"  # what training minimises unless the task names other losses

    def __init__(self, cfg: PixelClassifierConfig, *, key: PRNGKeyArray):
        self.norm = layers.BatchNormConfig(dims=cfg.num_pixels, decay=cfg.norm_decay).build()
        self.proj = layers.LinearConfig(input_dims=cfg.num_pixels, output_dims=cfg.num_classes).build(key)

    def compute_predictions(self, batch: Batch, ctx: layers.Context) -> tuple[Array, layers.Context]:
        paddings = 1.0 - jnp.asarray(batch["weights"], jnp.float32)
        h, ctx = layers.call(self.norm, jnp.asarray(batch["inputs"], ctx.dtype), ctx, "norm", paddings=paddings)
        logits = self.proj(h)
        if ctx.is_training:  # the mode is an argument (the Context's), never a global
            ctx = ctx.add_summary("logits_rms", jnp.sqrt(jnp.mean(logits**2)))  # Pax: add_summary
        return logits, ctx

    def compute_loss(self, predictions: Array, batch: Batch) -> Metrics:
        labels, weights = jnp.asarray(batch["labels"]), jnp.asarray(batch["weights"], jnp.float32)
        logits = predictions.astype(jnp.float32)
        xent = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=-1)[:, 0]
        correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        num = jnp.sum(weights)
        return {
            "avg_xent": weighted_mean(jnp.sum(xent * weights), num),
            "accuracy": weighted_mean(jnp.sum(correct * weights), num),
        }


model_cfg = PixelClassifierConfig()
model, model_state = layers.init(model_cfg, jax.random.key(1))

# The digits through Pax's input contract (`pax_eqx.data`: Pax's BaseInput, on grain): 64 pixel
# intensities, a label and a weight per example. The same data feeds the Task and the experiment.
data = DataConfig(
    source=DigitsSource(),
    train=InputConfig(batch_size=64),
    eval=InputConfig(batch_size=64, shuffle=False, repeat=False, reset_for_eval=True),
)
tokenizer = build_tokenizer(data)  # digits need none

# A batch of 4 digits with one padded row: its inputs and label are junk, and it weighs nothing.
four = build_input(data.replace(train=InputConfig(batch_size=4, shuffle=False)), "train", tokenizer)
batch = dict(four.get_next())
batch["weights"] = np.array([1.0, 1.0, 1.0, 0.0], np.float32)
batch["inputs"][3], batch["labels"][3] = 100.0, 7

logits, ctx = model.compute_predictions(batch, layers.Context(state=model_state, mode=layers.Mode.TRAIN))
metrics = model.compute_loss(logits, batch)


def reference_logits(w: Array, batch: Batch) -> Array:
    """BatchNorm over the real rows (gamma = 0 and beta = 0 at init), then the projection."""
    real = np.asarray(batch["inputs"])[np.asarray(batch["weights"]) > 0]
    normalised = (batch["inputs"] - real.mean(0)) / np.sqrt(real.var(0) + 1e-3)  # BatchNorm's epsilon
    return normalised @ w


def reference_xent(logits: Array, batch: Batch) -> Array:
    """The mean cross-entropy of the real rows."""
    log_p = jax.nn.log_softmax(logits)
    xent = -log_p[jnp.arange(len(batch["labels"])), batch["labels"]]
    return jnp.sum(xent * batch["weights"]) / jnp.sum(batch["weights"])


real = slice(0, 3)  # a padded row's logits are whatever they are; only real rows are checked
np.testing.assert_allclose(logits[real], reference_logits(model.proj.w, batch)[real], rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(metrics["avg_xent"].value, reference_xent(logits, batch), rtol=1e-5)
assert float(metrics["avg_xent"].weight) == 3.0  # three real rows
print("avg_xent of 3 real rows:", round(float(metrics["avg_xent"].value), 4))
print("layer summaries:", sorted(ctx.summaries))

# %% [markdown]
# ### Task
#
# Pax's Task (SingleTask) is a model, a learner (optimizer + schedule) and a metrics
# aggregator. pax_eqx's `Task` is the same triple built once from configs, and what it exposes
# is pure functions of arrays: `init_state(key)` gives a `TrainState` (step, params, non-trainable
# state, optimizer state, PRNG key), and `train_step(state, batch)` returns the next state and
# the step's weighted metrics. You jit it; the library's programs jit it with shardings and
# buffer donation. The Task never reads a batch key: it knows only the model contract.
#
# With plain SGD one step is `params - learning_rate * grad`, checked against `jax.grad` of the
# loss written out by hand.

# %%
learner = LearnerConfig(optimizer=SgdConfig(momentum=0.0), learning_rate=0.5)
task = Task(model_cfg, learner)
train_state = task.init_state(jax.random.PRNGKey(0))
train_step = jax.jit(task.train_step)
eval_step = jax.jit(task.eval_step)

w0 = train_state.params.proj.w
expected_grad = jax.grad(lambda w: reference_xent(reference_logits(w, batch), batch))(w0)
train_state, out = train_step(train_state, batch)
np.testing.assert_allclose(train_state.params.proj.w, w0 - 0.5 * expected_grad, rtol=1e-4, atol=1e-6)
# The non-trainable state came back updated too: the moving mean of the 3 real rows' pixels.
real_rows = np.asarray(batch["inputs"])[:3]
np.testing.assert_allclose(train_state.nt_state.get(model.norm.moving_mean), 0.1 * real_rows.mean(0), atol=1e-6)
assert int(train_state.step) == 1
print("train step metrics:", sorted(out.metrics))

# A few steps on real batches of 64 digits, then the held-out digits, merged by weight.
train_input, eval_input = build_input(data, "train", tokenizer), build_input(data, "eval", tokenizer)
for _ in range(30):
    train_state, out = train_step(train_state, train_input.get_next())
totals = HostAccumulator()
for eval_batch in eval_input:
    totals.add(jax.device_get(eval_step(train_state, eval_batch).metrics))
held_out = totals.result()
assert int(held_out["accuracy"].weight) == 180  # 3 batches of 64, the last padded: each image once
print("eval accuracy after 31 steps:", round(float(held_out["accuracy"].value), 3))

# %% [markdown]
# ### HParam -> config
#
# Pax's HParams (and later Fiddle configs) are mutable, set and overwritten along the way.
# pax_eqx configs are frozen dataclasses made by `@config`: `replace` and `override` return new
# ones, a misspelt field fails at once with a suggestion, and every config round-trips through
# JSON -- which is how the job dir records the run. A config holds only what its user chooses:
# sizes a parent decides (a child's `input_dims`) are `build` arguments, not fields, so no flag
# can be set and then silently overwritten.

# %%
wider = model_cfg.replace(norm_decay=0.99)
assert model_cfg.norm_decay == 0.9 and wider.norm_decay == 0.99  # the original is unchanged
try:
    model_cfg.replace(norm_decy=0.99)
except ConfigError as error:
    print("typo:", error)
assert LearnerConfig.from_json(learner.to_json()) == learner

# %% [markdown]
# ### Experiment
#
# A Pax experiment is a class with constants (NUM_LAYERS, ICI_MESH_SHAPE, ...), a `task()` and a
# `datasets()` method, registered with `@experiment_registry.register`. A pax_eqx experiment is
# one value, an `ExperimentConfig`: model, learner, task, data, train loop, checkpoints, mesh
# and decode settings, all configs. Named experiments are functions returning one. Changing
# an experiment is `replace` (or a `--section.field` flag), not a subclass.


# %%
def learning_pax_digits() -> ExperimentConfig:
    """Learning Pax's softmax regression on the digits: 40 SGD steps, eval and checkpoint every 20."""
    return ExperimentConfig(
        name="learning_pax_digits",
        model=PixelClassifierConfig(),
        learner=LearnerConfig(optimizer=SgdConfig(momentum=0.0), learning_rate=0.5),
        data=data,
        train=TrainConfig(num_steps=40, eval_interval_steps=20, summary_interval_steps=10, sample_at_end=False),
        checkpoint=CheckpointConfig(every_n_steps=20, max_to_keep=2),
    )


exp = learning_pax_digits()
assert exp.override("train.num_steps", 80).train.num_steps == 80  # what --train.num-steps 80 does

# %% [markdown]
# ### The experiment registry
#
# `experiments.registry.register` is Pax's `experiment_registry.register`: it gives the function
# a short name for `--exp` (and, optionally, Pax-style class-name aliases). Registering is
# optional: `--exp` also takes a dotted path to any function returning an ExperimentConfig in a
# module you can import (`--exp mypkg.myexps.tiny`, Pax's
# `--exp=tasks.lm.params.lm_cloud.LmCloudSpmd2BLimitSteps`). README.md, "Write your own
# experiment", shows how a package of your own declares its experiments so the short names work
# from any directory.

# %%
# In a module of experiments this is a decorator, `@registry.register(...)` above the `def`.
registry.register("learning_pax_digits", aliases=("LearningPaxDigits",))(learning_pax_digits)
assert registry.load_experiment("LearningPaxDigits") == exp
assert registry.load_experiment("experiments.digits.digits_mlp").name == "digits_mlp"  # a dotted path
print("registered:", "learning_pax_digits" in registry.names())

# %% [markdown]
# ### Run it: the job dir
#
# `python -m pax_eqx.train --exp learning_pax_digits --job-log-dir DIR` is Pax's
# `python -m paxml.main --exp=... --job_log_dir=...`; here it is called in-process, with
# `pax_eqx.train.main([...])` taking the same arguments. The job dir holds:
#
#   config.json              the resolved experiment (Pax wrote its params to a text file);
#                            eval and decode read it, and check their flags against it
#   command.txt, train.log   each start's command line, code version and packages; its log lines
#   checkpoints/<step>/      orbax checkpoints: the TrainState and the data iterator's position
#   metrics.jsonl            one JSON object per logged step, train and eval, with its wall time
#   summaries/{train,eval}/  TensorBoard event files (Pax's summaries dir)
#   plots/                   loss, accuracy, learning-rate and grad-norm curves (redrawn every eval)
#
# A second run on the same dir resumes from its newest checkpoint: here, from step 40 to 60.

# %%
with tempfile.TemporaryDirectory() as tmp:
    job_dir = pathlib.Path(tmp) / "learning_pax"
    # Pax's ICI_MESH_SHAPE as a flag: data-parallel over every device this process sees (one on a
    # plain CPU, eight fake ones under the tests). The experiment's batches of 64 divide evenly.
    mesh = ["--mesh.ici-mesh-shape", str(jax.device_count()), "1", "1"]
    assert pax_eqx.train.main(["--exp", "learning_pax_digits", "--job-log-dir", str(job_dir), *mesh]) == 0
    written = sorted(p.name for p in job_dir.iterdir())
    checkpoints = sorted(int(p.name) for p in (job_dir / "checkpoints").iterdir() if p.name.isdigit())
    summaries = sorted(p.name for p in (job_dir / "summaries").iterdir())
    recorded = ExperimentConfig.from_json((job_dir / "config.json").read_text())

    resume = ["--exp", "learning_pax_digits", "--job-log-dir", str(job_dir), *mesh, "--train.num-steps", "60"]
    assert pax_eqx.train.main(resume) == 0
    resumed_checkpoints = sorted(int(p.name) for p in (job_dir / "checkpoints").iterdir() if p.name.isdigit())
    records = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]

# config.json is the experiment with the flags applied, your own model's config class included.
assert recorded == exp.override("mesh.ici_mesh_shape", (jax.device_count(), 1, 1))
assert type(recorded.model) is PixelClassifierConfig
print("job dir:", written)
print("checkpoints after 40 steps:", checkpoints)  # every 20 steps
print("checkpoints after resuming to 60:", resumed_checkpoints)  # max_to_keep=2
print("summaries:", summaries)

# metrics.jsonl: a train record every summary interval, an eval record every eval interval;
# an eval record's metrics are over all 180 held-out digits, merged by weight.
train_steps = [r["step"] for r in records if r["split"] == "train"]
eval_records = [r for r in records if r["split"] == "eval"]
assert all(r["num_predictions"] == 180 for r in eval_records)
print("train records at steps:", train_steps)
print("eval records at steps:", [r["step"] for r in eval_records])
print("eval accuracy at step 60:", round(eval_records[-1]["accuracy"], 3))

# %% [markdown]
# ## The Pax code -> the pax_eqx code
#
# Pax is two libraries: Praxis (layers, models, optimizers, inputs, HParams) and PaxML (tasks,
# experiments, train/eval/decode programs, checkpoints, summaries). pax_eqx is one package
# with the same split, as floors that import only downwards:
#
#   Praxis                                  pax_eqx
#   praxis.layers                           pax_eqx.layers (one concept a file)
#   praxis.layers.models                    pax_eqx.models
#   praxis.optimizers, praxis.schedules     pax_eqx.learners (optax underneath)
#   praxis.base_input                       pax_eqx.data (grain underneath)
#   praxis.base_hyperparams, pax_fiddle     pax_eqx.config
#
#   PaxML                                   pax_eqx
#   paxml.tasks_lib.SingleTask              pax_eqx.tasks.Task
#   paxml.base_experiment, the registry     pax_eqx.experiment.ExperimentConfig, experiments.registry
#   paxml.trainer_lib, programs             pax_eqx.programs (pure steps, thin host loops)
#   checkpoints, summaries                  pax_eqx.checkpoint (orbax), pax_eqx.summaries
#   paxml.main                              python -m pax_eqx.train / eval / decode
#
# Pax's worked example, the ResNet, is docs/tutorials/resnet_on_digits.py (a ResNet composed in
# your own code) and the `digits_resnet` experiment. A Paxml checkpoint of a TransformerLm
# imports into a pax_eqx job dir: docs/pax_to_pax_eqx.md, "Migrating a Paxml run".
