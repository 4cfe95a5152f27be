"""Every flag takes effect: a model or learner field the CLI accepts changes what gets built, or
is rejected with an error naming it.

A config field that is parsed, validated and then silently overwritten or ignored (a child's
size its parent decides, Adam's betas under SGD, a decay end for a constant schedule) is worse
than no flag at all: the run says it used a value it did not. So for every leaf field of the
model and learner configs of every registered experiment, this test changes the field and
compares fingerprints of what is built:

- the model: its tree structure and static fields, the shapes and a hash of its parameter values
  (fixed key), and the jaxpr of a training forward + loss on a tiny batch;
- the optimizer: the jaxpr and values of a few `update` steps, and the jaxpr and values of the
  learning-rate schedule over a range of steps.

A change must alter the fingerprint, or be rejected (ValueError / ConfigError) by a message that
names the field. Each field is tried with a few new values in turn: the first value accepted
must take effect; if every value is rejected, the field is one that does nothing in this
combination and says so.

To stay fast, each experiment is first shrunk to tiny sizes (vocabulary, sequence, layers,
widths, heads; kv-head sharing kept), and experiments whose shrunk configs are equal are tested
once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from config_walk import arrays_digest, digest, field_type, jaxpr_text, leaf_paths, new_values

from experiments import registry
from pax_eqx.command_line.choices import choice_fields
from pax_eqx.config import Config, config, switch_variant
from pax_eqx.layers import Context, MLPConfig, Mode, ViTConfig, split_state
from pax_eqx.layers.cnns import CNNConfig
from pax_eqx.learners import LearnerConfig, build_optimizer, learning_rate_fn
from pax_eqx.models import BertModelConfig, ClassificationModelConfig, LanguageModelConfig, SequenceModelConfig
from pax_eqx.models.token_mlp import TokenMlpConfig

BATCH, SEQ = 2, 8

# Learner fields the optimizer does not read: the train step does, and its own tests check them.
READ_BY_THE_TRAIN_STEP = {
    "ema_decay": "the parameter EMA the train state carries (tests/tasks/test_task.py)",
    "num_microbatches": "gradient accumulation in the train step (tests/tasks, tests/sharding)",
}


def run_forward_and_loss(model: Any, batch: dict, ctx: Context) -> tuple[Any, Context]:
    """How a model is run, forward then loss: the one place to change if the model API changes."""
    predictions, ctx = model.compute_predictions(batch, ctx)
    return model.compute_loss(predictions, batch), ctx


# Model families: how to shrink a config and what a tiny batch for it looks like ----------------
def _shrink_language_model(m: LanguageModelConfig) -> LanguageModelConfig:
    heads, dims = 4, 16
    kv = {0: 0, 1: 1, m.num_heads: heads}.get(m.num_kv_heads, 2)  # keep MHA / MQA / GQA
    embedding_init = m.embedding_init
    if embedding_init.scale == 1.0 / math.sqrt(m.model_dims):  # Pax's 1/sqrt(MODEL_DIMS): a size
        embedding_init = embedding_init.replace(scale=1.0 / math.sqrt(dims))
    layers = 2 * (m.pipeline.circular_repeat if m.pipeline.enabled else 1)  # whole chunks of 2 stages
    return m.replace(
        vocab_size=32, max_seq_len=SEQ, num_layers=layers, model_dims=dims, hidden_dims=32, num_heads=heads,
        dim_per_head=dims // heads if m.dim_per_head else 0, num_kv_heads=kv, unroll=min(m.unroll, 2),
        loss_chunk_size=4 if m.loss_chunk_size else 0, embedding_init=embedding_init,
        # MoE: at most 8 experts and 2 groups, so the 8-token groups still have a capacity that
        # capacity_factor / min_capacity change (with 16 experts or 1-token groups it is always 1).
        moe=m.moe.replace(num_experts=min(m.moe.num_experts, 8), num_groups=min(m.moe.num_groups, 2)),
        moe_hidden_dims=16 if m.moe_hidden_dims else 0,
        # A pipeline: 2 stages of the layers (x its circular repeats), 2 microbatches of the batch of 2.
        pipeline=m.pipeline.replace(num_stages=2, num_microbatches=2) if m.pipeline.enabled else m.pipeline,
    )  # fmt: skip


def _language_model_batch(m: LanguageModelConfig) -> dict:
    """As the data pipeline gives it: one document a row, the second row's last two positions
    padding (segment 0), so the options that act on paddings are exercised."""
    ids = jnp.arange(BATCH * SEQ).reshape(BATCH, SEQ) % m.vocab_size
    segment_ids = jnp.ones((BATCH, SEQ), jnp.int32).at[1, SEQ - 2 :].set(0)
    weights = segment_ids.astype(jnp.float32)
    return {"ids": ids, "labels": (ids + 1) % m.vocab_size, "weights": weights, "segment_ids": segment_ids}


def _shrink_classifier(m: ClassificationModelConfig) -> ClassificationModelConfig:
    if isinstance(m.network, MLPConfig):
        network = m.network.replace(hidden_dims=tuple(8 for _ in m.network.hidden_dims))
        return m.replace(input_shape=(8,), num_classes=4, network=network)
    if isinstance(m.network, ViTConfig):
        # A ViT: the digits' 8x8x1 images are tiny already (patch size kept); a narrow, shallow stack.
        network = m.network.replace(model_dims=8, num_heads=2, hidden_dims=16, num_layers=2)
        return m.replace(num_classes=4, network=network)
    if isinstance(m.network, CNNConfig):
        # A CNN: MNIST's 28x28x1 images kept (the flattened size follows them); thin convolutions and hidden layers.
        network = m.network.replace(
            channels=tuple(4 for _ in m.network.channels), hidden_dims=tuple(8 for _ in m.network.hidden_dims)
        )
        return m.replace(num_classes=4, network=network)
    # A ResNet: the digits' 8x8x1 images are tiny already; thin every stage.
    network = m.network.replace(channels=tuple(8 for _ in m.network.channels), stem_channels=8)
    return m.replace(num_classes=4, network=network)


def _classifier_batch(m: ClassificationModelConfig) -> dict:
    size = math.prod(m.input_shape)
    inputs = jnp.linspace(-1.0, 1.0, BATCH * size).reshape(BATCH, *m.input_shape)
    return {"inputs": inputs, "labels": jnp.arange(BATCH) % m.num_classes, "weights": jnp.ones((BATCH,))}


def _shrink_sequence_model(m: SequenceModelConfig) -> SequenceModelConfig:
    heads, dims = 4, 16
    kv = {0: 0, 1: 1, m.num_heads: heads}.get(m.num_kv_heads, 2)
    return m.replace(
        vocab_size=32, max_seq_len=SEQ, num_encoder_layers=2, num_decoder_layers=2, model_dims=dims, hidden_dims=32,
        num_heads=heads, dim_per_head=dims // heads if m.dim_per_head else 0, num_kv_heads=kv,
        unroll=min(m.unroll, 2),
    )  # fmt: skip


def _sequence_model_batch(m: SequenceModelConfig) -> dict:
    ids = jnp.arange(BATCH * SEQ).reshape(BATCH, SEQ) % m.vocab_size
    paddings = jnp.zeros((BATCH, SEQ)).at[1, SEQ - 2 :].set(1.0)
    return {
        "inputs": ids, "input_paddings": paddings, "target_ids": (ids + 2) % m.vocab_size,
        "targets": (ids + 3) % m.vocab_size, "target_paddings": paddings,
    }  # fmt: skip


def _shrink_bert(m: BertModelConfig) -> BertModelConfig:
    """A language model's shrink; a mask past the byte tokenizer's ids stays the last of the 32."""
    return _shrink_language_model(m).replace(mask_token_id=min(m.mask_token_id, 31))


def _shrink_token_mlp(m: TokenMlpConfig) -> TokenMlpConfig:
    return m.replace(input_dims=16, hidden_dims=8, num_layers=3)


def _token_mlp_batch(m: TokenMlpConfig) -> dict:
    """Token ids that predict themselves, the second row's last two positions weight 0."""
    ids = jnp.arange(BATCH * SEQ).reshape(BATCH, SEQ) % m.input_dims
    return {"ids": ids, "labels": ids, "weights": jnp.ones((BATCH, SEQ)).at[1, SEQ - 2 :].set(0.0)}


FAMILIES = {
    LanguageModelConfig: (_shrink_language_model, _language_model_batch),
    TokenMlpConfig: (_shrink_token_mlp, _token_mlp_batch),
    BertModelConfig: (_shrink_bert, _language_model_batch),
    ClassificationModelConfig: (_shrink_classifier, _classifier_batch),
    SequenceModelConfig: (_shrink_sequence_model, _sequence_model_batch),
}


# Fingerprints ---------------------------------------------------------------------------------
def model_fingerprint(cfg: Any) -> Iterator[str]:
    """Digests of the built model, cheapest first, so a comparison can stop at the first that
    differs: structure, static fields and shapes (traced, nothing computed), then the training
    forward + loss (traced on those shapes), then the parameter values (built, fixed key)."""
    cfg.validate()
    build = lambda key: split_state(cfg.build(key))
    model, state = eqx.filter_eval_shape(build, jax.random.key(0))
    yield digest(jax.tree.structure((model, state)), [(a.shape, a.dtype) for a in jax.tree.leaves((model, state))])
    batch = next(make for family, (_, make) in FAMILIES.items() if isinstance(cfg, family))(cfg)

    def train_forward(model, state, batch, key):
        return run_forward_and_loss(model, batch, Context(key=key, state=state, mode=Mode.TRAIN))

    yield jaxpr_text(train_forward, model, state, batch, jax.random.key(1))
    yield arrays_digest(build(jax.random.key(0)))


_RUN_STEPS = 12_345  # train.num_steps, for a schedule whose decay ends with the run
_PARAMS = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.linspace(0.5, -0.5, 4)}
_STEPS = jnp.asarray([0, 1, 2, 3, 5, 10, 50, 100, 266, 300, 1000, 2000, 4001, 10**4, 10**5, 108_600, 3 * 10**5, 10**6])


def learner_fingerprint(cfg: LearnerConfig) -> Iterator[str]:
    """Digests of the optimizer, cheapest first: the computation of `update` and of the schedule,
    then their values (three update steps; the schedule over a range of steps)."""
    # A decay_end of 0 follows the run's length, as the programs resolve it.
    cfg = cfg.resolve(max(_RUN_STEPS, cfg.schedule.decay_begins + 1000))
    tx = build_optimizer(cfg, _PARAMS)
    schedule = learning_rate_fn(cfg)
    opt_state, params, values = tx.init(_PARAMS), _PARAMS, []
    grads = [jax.tree.map(lambda p, s=s: jnp.sin(p * (s + 2.0)), _PARAMS) for s in range(3)]
    yield jaxpr_text(tx.update, grads[0], opt_state, params) + jaxpr_text(schedule, _STEPS[0])
    for g in grads:
        updates, opt_state = tx.update(g, opt_state, params)
        params = jax.tree.map(jnp.add, params, updates)
        values.append(arrays_digest(updates))
    yield digest(values, np.asarray(jax.vmap(schedule)(_STEPS)))


@functools.cache
def _baseline(fingerprint: Callable, cfg: Any) -> tuple[str, ...]:
    return tuple(fingerprint(cfg))


def _differs(fingerprint: Callable, baseline: tuple[str, ...], cfg: Any) -> bool:
    """Whether `cfg` builds something else than the baseline, computing only as far as needed."""
    return any(digest != base for digest, base in zip(fingerprint(cfg), baseline))


# The cases: every leaf of every distinct (shrunk) model and learner -----------------------------
def _which_flags_matter(cfg: Config) -> tuple:
    """What decides whether a field can take effect: every choice, flag and size, and of each float
    only whether it is 0 (off) or its default (the rejections compare against defaults). Configs
    equal in this are tested once: 1e-5 or 1e-6 as an epsilon, 0.02 or 0.006 as an init scale
    do not change which fields matter."""
    key = []
    for path in leaf_paths(cfg):
        _, value = field_type(cfg, path)
        if isinstance(value, float):
            *parents, name = path.split(".")
            owner = functools.reduce(getattr, parents, cfg)
            value = ("float", value == 0.0, value == type(owner).__dataclass_fields__[name].default)
        key.append((path, value))
    return type(cfg), tuple(key)


def _switched(cfg: Config) -> Iterator[tuple[str, str, Config]]:
    """(choice path, variant, `cfg` with that choice switched to that variant) for every other
    variant of every choice in `cfg` (`--learner.optimizer sgd`), those that validate alone."""
    for path, options in choice_fields(cfg):
        current = functools.reduce(getattr, path.split("."), cfg)
        for kind, cls in options.items():
            if kind == current.kind:
                continue
            try:
                yield path, kind, cfg.override(path, switch_variant(current, cls))
            except ValueError:  # a variant that needs a value of its own first (piecewise: boundaries)
                continue


def _distinct_configs() -> tuple[dict, dict]:
    """The distinct shrunk models and learners of the registered experiments ({key: (config,
    label, the paths to walk: "" for all)}), and every switch of their choices, where only the
    switched variant's own fields are walked (the rest is the experiment's, walked already)."""
    models, learners = {}, {}
    for name in registry.names():
        exp = registry.load_experiment(name)
        roots = [(learners, exp.learner)]
        if type(exp.model) in FAMILIES:
            roots.append((models, FAMILIES[type(exp.model)][0](exp.model)))
        for found, cfg in roots:
            found.setdefault(_which_flags_matter(cfg), (cfg, name, ""))
            for path, kind, switched in _switched(cfg):
                key = (_which_flags_matter(switched), path)
                found.setdefault(key, (switched, f"{name}[{path}={kind}]", path + "."))
    return models, learners


def _switch_cases() -> list:
    """Every switch of every choice of each experiment's (shrunk) model and learner."""
    cases, seen = [], set()
    for name in registry.names():
        exp = registry.load_experiment(name)
        roots = [("learner", exp.learner)]
        if type(exp.model) in FAMILIES:
            roots.append(("model", FAMILIES[type(exp.model)][0](exp.model)))
        for root, cfg in roots:
            for path, kind, _ in _switched(cfg):
                key = (root, _which_flags_matter(cfg), path, kind)
                if key not in seen:
                    seen.add(key)
                    cases.append(pytest.param(root, cfg, path, kind, id=f"{name}-{root}.{path}={kind}"))
    return cases


@pytest.mark.parametrize("root, cfg, path, kind", _switch_cases())
def test_switching_a_choice_changes_what_is_built(root, cfg, path, kind):
    fingerprint = model_fingerprint if root == "model" else learner_fingerprint
    switched = dict((p, c) for p, k, c in _switched(cfg) if k == kind and p == path)[path]
    try:
        differs = _differs(fingerprint, _baseline(fingerprint, cfg), switched)
    except ValueError as error:  # refused where it would do nothing (llama3 rotary scaling, no rotary)
        assert re.search(rf"\b{path.rsplit('.', 1)[-1]}\b", str(error)), f"{root}.{path}={kind}: {error}"
        return
    assert differs, f"{root}.{path} {kind} built the same"


def _cases() -> list:
    models, learners = _distinct_configs()
    cases = []
    for root, found in (("model", models), ("learner", learners)):
        for cfg, name, under in found.values():
            paths = [p for p in leaf_paths(cfg) if p.startswith(under) and p not in READ_BY_THE_TRAIN_STEP]
            cases += [pytest.param(root, cfg, path, id=f"{name}-{root}.{path}") for path in paths]
    return cases


@pytest.mark.parametrize("root, cfg, path", _cases())
def test_changing_a_field_changes_what_is_built_or_is_rejected(root, cfg, path):
    fingerprint = model_fingerprint if root == "model" else learner_fingerprint
    tp, value = field_type(cfg, path)
    field = path.rsplit(".", 1)[-1]
    try:
        baseline = _baseline(fingerprint, cfg)
    except ValueError as error:  # a switched variant refused here as a whole (it would do nothing)
        assert re.search(rf"\b{field}\b", str(error)), f"{root}.{path}: the refusal does not name {field!r}: {error}"
        return
    rejections, same = [], []
    for new in new_values(tp, value):
        try:
            changed = _differs(fingerprint, baseline, cfg.override(path, new))
        except ValueError as error:  # ConfigError is one
            assert re.search(rf"\b{field}\b", str(error)), (
                f"{root}.{path}={new!r} was rejected by an error that does not name {field!r}: {error}"
            )
            rejections.append(new)
            continue
        if value is None and not changed:
            # None stands for a default another field decides (NormConfig.direct_scale: the kind's
            # form), which one explicit value spells out; another value must then take effect.
            same.append(new)
            continue
        assert changed, (
            f"{root}.{path}={new!r} (was {value!r}) was accepted but built the same {root}: the flag does "
            "nothing here. Make it a build argument if a parent decides it, or reject it in validate."
        )
        return
    assert not same, f"{root}.{path}={same[0]!r} (was None) was accepted, and no value changed what is built."
    assert rejections, f"no value to try for {root}.{path}"


def test_every_experiment_has_a_model_family_here():
    """A new model family needs a shrink and a batch above, or its flags go untested."""
    for name in registry.names():
        model = registry.load_experiment(name).model
        assert type(model) in FAMILIES, f"{name}: add {type(model).__name__} to FAMILIES in this test."


def test_fields_left_to_the_train_step_exist():
    assert set(READ_BY_THE_TRAIN_STEP) <= {f.name for f in dataclasses.fields(LearnerConfig)}


def test_a_size_the_model_decides_is_not_a_block_flag():
    """The issue's examples: these parsed, validated and were silently replaced; now the block has
    no such fields, so the CLI rejects them by name."""
    block = registry.load_experiment("shakespeare_char").model.block
    for path, named in [
        ("model_dims", "model_dims"), ("attention.num_kv_heads", "num_kv_heads"), ("init.scale", "init"),
        ("norm.dims", "dims"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=f"has no field '{named}'"):
            block.override(path, 7)


@config
class _PlantedLanguageModelConfig(LanguageModelConfig):
    """A language model with one field nothing reads: what this test exists to catch."""

    planted_knob: int = 0


def test_the_walk_catches_a_planted_inert_field():
    """The check of `test_changing_a_field_changes_what_is_built_or_is_rejected` on a field that is
    parsed and validated but never read: the same model is built, so that test would fail on it."""
    cfg = _shrink_language_model(registry.load_experiment("shakespeare_char").model)
    planted = _PlantedLanguageModelConfig(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    baseline = tuple(model_fingerprint(planted))
    assert not _differs(model_fingerprint, baseline, planted.override("planted_knob", 1))
    assert _differs(model_fingerprint, baseline, planted.override("num_layers", 3))  # a real field differs
