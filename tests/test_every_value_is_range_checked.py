"""Every value is range-checked: a numeric config field the CLI (or config.json) accepts is a
number of its declared kind, finite, and in its range, or the experiment's `validate` refuses it
with a ConfigError that names the field.

A value accepted and then doing nonsense (a NaN learning rate, a seed jax silently truncates,
a negative dropout, a step count past int32) is worse than an error at once. So for every
numeric field (int, float, and the elements of tuples of them) of every config reachable from
every registered experiment's ExperimentConfig (the model of every family, learner, schedule,
task, data with its inputs / tokenizer / augment / span corruption, train, checkpoint, mesh,
decode, profile), this test puts each value of a list of suspects in the field, down the path
with `dataclasses.replace`, and runs `validate(data_files=False)`:

- ints: -1, 0, a huge int (2**63 and -2**63), a float (1.5), a bool (True);
- floats: NaN, +inf, -inf, -1.0, 0.0;
- tuples: each element in turn replaced by its kind's suspects (an empty tuple: 1, 2 and 3
  copies of a suspect).

Each must be refused by a ConfigError naming the field, unless ALLOWED below says why the value
is legitimate for that field. Each (config class, field) is tested once, in the first
experiment that has it (one where a tuple is non-empty, if any), which keeps this fast.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any

import pytest

from pax_eqx.command_line import cli, registry
from pax_eqx.config import ConfigError, _declared_in
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.learners import build_schedule
from pax_eqx.learners.schedules import LinearSchedule

INT_SUSPECTS = (-1, 0, 2**63, -(2**63), 1.5, True)
FLOAT_SUSPECTS = (math.nan, math.inf, -math.inf, -1.0, 0.0)

# "ConfigClass.field": {value: why it is a legitimate value of the field}. A suspect listed here
# may be accepted (it may also be refused, e.g. by a check that another field makes it do nothing).
ALLOWED: dict[str, dict[float, str]] = {
    # train / decode / profile / checkpoint
    "TrainConfig.eval_interval_steps": {0: "0 = evaluate only at the end"},
    "TrainConfig.summary_interval_steps": {0: "0 = log train metrics only at the end"},
    "TrainConfig.seed": {0: "any uint32 seeds jax.random.key"},
    "TrainConfig.decode_interval_steps": {0: "0 = no decoding during training"},
    "SampleStrategy.seed": {0: "any uint32 seeds jax.random.key"},
    "AdafactorConfig.beta1": {0: "0 = no momentum (Praxis' beta1=0)"},
    "SampleStrategy.temperature": {0: "0 = greedy (argmax)"},
    "SampleStrategy.top_k": {0: "0 = no top-k filter"},
    "SampleConfig.eos_id": {-1: "-1 = the tokenizer's eos", 0: "token 0 is a token id"},
    "BeamStrategy.length_norm_alpha": {0: "0 = rank beams by raw log-prob"},
    "ProfileConfig.steps": {0: "(0, n): trace from the first step"},
    "EarlyStoppingConfig.patience": {0: "0 = no patience rule"},
    "EarlyStoppingConfig.min_delta": {0: "0 = any improvement counts"},
    "EarlyStoppingConfig.target": {0: "0 = no target", -1: "a metric's target may be negative"},
    "CheckpointConfig.every_n_steps": {0: "0 = no periodic save (the last step is always saved)"},
    "LoraConfig.base_step": {-1: "-1 = the base job dir's newest checkpoint", 0: "step 0: an import's checkpoint"},
    "LoraConfig.dropout": {0: "0 = no dropout on the adapters' input (the merged forward)"},
    "CheckpointConfig.max_to_keep": {0: "0 = keep every checkpoint"},
    "CheckpointConfig.every_n_seconds": {0: "0 = no time-based save"},
    # BERT (models.bert_model, layers.masked_lm)
    "BertModelConfig.mask_token_id": {0: "id 0 may be the mask (Praxis' BertModel default, Paxml's BertSpmd)"},
    "MaskedLmConfig.mask_prob": {0: "no masked tokens: only random and kept ones (the sum is checked)"},
    "MaskedLmConfig.random_prob": {0: "no random replacements (the sum is checked)"},
    "MaskedLmConfig.same_prob": {0: "no chosen token kept as it is (the sum is checked)"},
    # task
    "TaskConfig.aux_loss_weight": {0: "0 = the layers' aux losses do not train"},
    "TaskConfig.loss_weights": {0: "a loss reported but not trained on"},
    "VariationalNoiseConfig.scale": {0: "0 = no weight noise"},
    "VariationalNoiseConfig.start_step": {0: "noise from the first step"},
    # learner and schedule
    "_AdamMoments.b1": {0: "Adam without first-moment averaging (RMSProp-like)"},
    "_AdamMoments.b2": {0: "second moment = the last squared gradient"},
    "_AdamMoments.eps": {0: "Adam's epsilon may be 0 (optax allows it; eps_root can guard instead)"},
    "_AdamMoments.eps_root": {0: "0 = off"},
    "SgdConfig.momentum": {0: "0 = plain SGD"},
    "LearnerConfig.weight_decay": {0: "0 = off"},
    "LearnerConfig.l2_regularization": {0: "0 = off"},
    "LearnerConfig.clip_grad_norm": {0: "0 = off"},
    "LearnerConfig.clip_update_rms": {0: "0 = off"},
    "LearnerConfig.ema_decay": {0: "0 = no parameter EMA"},
    "_Schedule.warmup_steps": {0: "0 = start at the peak"},
    "_Decaying.decay_start": {0: "0 = decay right after warmup"},
    "_Decaying.decay_end": {0: "0 = train.num_steps"},
    "_Decaying.min_ratio": {0: "decay to 0 (not for kind='exponential')"},
    "PiecewiseSchedule.values": {0: "a piece with learning rate 0"},
    "PiecewiseSchedule.boundaries": {0: "a boundary at step 0 (after a warmup of 0)"},
    # data
    "TextDocuments.target_seq_len": {0: "0 = derived from seq_len"},
    "InputConfig.num_infeed_hosts": {0: "0 = one per JAX process"},
    "InputConfig.infeed_host_index": {-1: "-1 = jax.process_index()", 0: "host 0"},
    "InputConfig.input_random_seed": {0: "any uint32 seeds the input"},
    "InputConfig.eval_loop_num_batches": {0: "0 = one epoch per eval run", -1: "-1 = one epoch (Pax's spelling)"},
    "InputConfig.num_workers": {0: "0 = in this process"},
    "InputConfig.read_threads": {0: "0 = in the calling thread"},
    "AugmentConfig.crop_padding": {0: "0 = no random crop"},
    "AugmentConfig.mean": {0: "a channel mean of 0", -1: "a channel mean may be negative"},
    # model
    "LanguageModelConfig.dim_per_head": {0: "0 = model_dims // num_heads"},
    "LanguageModelConfig.num_kv_heads": {0: "0 = num_heads"},
    "LanguageModelConfig.soft_cap_logits": {0: "0 = off"},
    "LanguageModelConfig.label_smoothing_prob": {0: "0 = off"},
    "LanguageModelConfig.loss_chunk_size": {0: "0 = all positions at once"},
    "LanguageModelConfig.moe_layer_interval": {0: "0 = a dense model (no MoE layers)"},
    "LanguageModelConfig.moe_hidden_dims": {0: "0 = each expert is hidden_dims wide"},
    "MoEFeedForwardConfig.num_groups": {0: "0 = one routing group per batch row"},
    "MoEFeedForwardConfig.z_loss_weight": {0: "0 = no router z-loss"},
    "MoEFeedForwardConfig.jitter_eps": {0: "0 = no router jitter"},
    "MoEFeedForwardConfig.gating_logit_cap": {0: "0 = no cap on the router logits"},
    "SequenceModelConfig.dim_per_head": {0: "0 = model_dims // num_heads"},
    "SequenceModelConfig.num_kv_heads": {0: "0 = num_heads"},
    "SequenceModelConfig.label_smoothing_prob": {0: "0 = off"},
    "ClassificationModelConfig.label_smoothing_prob": {0: "0 = off"},
    "AttentionConfig.logit_cap": {0: "0 = off"},
    "AttentionConfig.dropout_prob": {0: "0 = off"},
    "AttentionConfig.query_scale_dims": {0: "0 = the head dim (1 / sqrt(head_dim))"},
    "LanguageModelConfig.global_layer_interval": {0: "0 = every layer uses the attention's window"},
    "TransformerConfig.residual_dropout_prob": {0: "0 = off"},
    "TransformerConfig.relu_dropout_prob": {0: "0 = off"},
    "TransformerConfig.residual_droppath_prob": {0: "0 = no stochastic depth"},
    "ResNetBlockConfig.residual_droppath_prob": {0: "0 = no stochastic depth"},
    "_Norm.epsilon": {0: "an epsilon may be 0"},
    "WeightInit.scale": {0: "all-zero weights (zero-init heads and residuals)"},
    "ActivationConfig.negative_slope": {0: "LeakyReLU with slope 0 is ReLU", -1: "any finite slope"},
    "MLPConfig.dropout_prob": {0: "0 = off"},
    "MLPConfig.batch_norm_decay": {0: "moving statistics = the last batch's"},
    "ResNetBlockConfig.batch_norm_decay": {0: "moving statistics = the last batch's"},
    "ResNetBlockConfig.batch_norm_epsilon": {0: "an epsilon may be 0"},
}


# Walking the configs ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Leaf:
    experiment: str
    path: tuple[str, ...]  # field names from the ExperimentConfig down
    owner: str  # the config class holding the field
    integer: bool
    is_tuple: bool
    value: Any

    @property
    def key(self) -> str:
        return f"{self.owner}.{self.path[-1]}"

    @property
    def flag(self) -> str:
        return ".".join(self.path)


def _numeric_kind(hint: Any) -> tuple[bool, bool] | None:
    """(integer, is_tuple) for a numeric annotation, None for anything else; raises for a numeric
    annotation this walker does not know (teach it, or the field goes untested)."""
    if hint is int or hint is float:
        return hint is int, False
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        elements = {a for a in args if a is not Ellipsis}
        if elements == {int}:
            return True, True
        if elements and elements <= {int, float}:
            return False, True
    if hint is bool or typing.get_origin(hint) is typing.Literal:
        return None
    if any(t in (int, float) or _numeric_kind(t) is not None for t in args if t is not Ellipsis):
        raise TypeError(f"numeric annotation {hint} is not walked here; teach _numeric_kind.")
    return None


def _leaves(cfg: Any, experiment: str, path: tuple[str, ...] = ()) -> list[Leaf]:
    leaves = []
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):  # a nested config, whichever member of a union it is
            leaves += _leaves(value, experiment, (*path, f.name))
            continue
        kind = _numeric_kind(hints[f.name])
        if kind is not None:
            # Keyed by the class that declares the field (a base shared by variants: _Schedule).
            owner = _declared_in(type(cfg), f.name).__name__
            leaves.append(Leaf(experiment, (*path, f.name), owner, *kind, value))
    return leaves


def _cases() -> list[Leaf]:
    """One leaf per (config class, field): the first experiment's, or the first with a non-empty
    tuple."""
    chosen: dict[str, Leaf] = {}
    for name in registry.names():
        for leaf in _leaves(registry.load_experiment(name), name):
            old = chosen.get(leaf.key)
            if old is None or (old.is_tuple and not old.value and leaf.value):
                chosen[leaf.key] = leaf
    return list(chosen.values())


CASES = _cases()


def _replace(cfg: Any, path: tuple[str, ...], value: Any) -> Any:
    head, *rest = path
    new = value if not rest else _replace(getattr(cfg, head), tuple(rest), value)
    return dataclasses.replace(cfg, **{head: new})


def _suspects(leaf: Leaf) -> list[tuple[Any, Any]]:
    """(the field's new value, the suspect it holds) pairs."""
    singles = INT_SUSPECTS if leaf.integer else FLOAT_SUSPECTS
    if not leaf.is_tuple:
        return [(s, s) for s in singles]
    if not leaf.value:
        return [((s,) * n, s) for s in singles for n in (1, 2, 3)]
    return [(leaf.value[:i] + (s,) + leaf.value[i + 1 :], s) for s in singles for i in range(len(leaf.value))]


def _allowed(leaf: Leaf, suspect: Any) -> bool:
    values = ALLOWED.get(leaf.key, {})
    return not isinstance(suspect, bool) and not math.isnan(suspect) and any(suspect == v for v in values)


@pytest.mark.parametrize("leaf", CASES, ids=lambda leaf: f"{leaf.experiment}-{leaf.flag}")
def test_every_out_of_range_value_is_refused_naming_the_field(leaf: Leaf):
    exp = registry.load_experiment(leaf.experiment)
    field = leaf.path[-1]
    problems = []
    for new, suspect in _suspects(leaf):
        try:
            _replace(exp, leaf.path, new).validate(data_files=False)
        except ConfigError as error:
            if not re.search(rf"\b{field}\b", str(error)):
                problems.append(f"{new!r} was refused by an error that does not name {field!r}: {error}")
            continue
        except Exception as error:  # noqa: BLE001 -- a crash is a finding, reported with the rest
            problems.append(f"{new!r} raised {type(error).__name__} (not a ConfigError): {error}")
            continue
        if not _allowed(leaf, suspect):
            problems.append(f"{new!r} was accepted")
    assert not problems, (
        f"{leaf.experiment}: {leaf.flag} ({leaf.key}): " + "; ".join(problems) + ". Check it in the config's "
        "validate, or, if the value is legitimate, add it to ALLOWED with the reason."
    )


def test_the_allow_list_names_fields_that_exist():
    keys = {leaf.key for leaf in CASES}
    assert set(ALLOWED) <= keys, f"stale ALLOWED entries: {sorted(set(ALLOWED) - keys)}"


def test_every_family_and_section_is_walked():
    """The walk reaches the configs the issue lists (a section no experiment has goes untested)."""
    owners = {leaf.owner for leaf in CASES}
    for owner in (
        "LanguageModelConfig", "SequenceModelConfig", "ClassificationModelConfig", "LearnerConfig", "_Schedule",
        "DataConfig", "InputConfig", "SentencePieceConfig", "AugmentConfig", "SpanCorruptionConfig", "TrainConfig",
        "CheckpointConfig", "DecodeConfig", "MeshConfig", "TaskConfig", "ProfileConfig", "MLPConfig", "ResNetConfig",
        "ViTConfig", "AttentionConfig",
    ):  # fmt: skip
        assert owner in owners, f"no registered experiment has a {owner}"


# The schedule's decay end follows train.num_steps unless set ------------------------------------
def _with_decay_end_unset(exp: ExperimentConfig) -> ExperimentConfig:
    schedule = exp.learner.schedule.replace(decay_end=0)
    return exp.replace(learner=exp.learner.replace(schedule=schedule))


def test_an_unset_decay_end_is_train_num_steps():
    exp = _with_decay_end_unset(registry.load_experiment("shakespeare_char"))
    assert exp.learner.schedule.kind == "cosine" and exp.learner.schedule.decay_end == 0
    exp.validate(data_files=False)
    assert exp.resolved_learner().schedule.decay_end == exp.train.num_steps
    assert exp.resolved_learner().replace(schedule=exp.learner.schedule) == exp.learner  # nothing else changes
    # A bare schedule does not know the run's length: it refuses to build rather than guess.
    with pytest.raises(ConfigError, match=r"decay_end=0 .*train.num_steps"):
        build_schedule(exp.learner.schedule)
    assert LinearSchedule(warmup_steps=5).resolve(50).decay_end == 50


def test_an_unset_decay_end_follows_the_command_line_and_round_trips(monkeypatch):
    base = _with_decay_end_unset(registry.load_experiment("shakespeare_char"))
    monkeypatch.setattr(registry, "load_experiment", lambda name: base)
    exp, _, _ = cli.parse(["--train.num-steps", "500"], "test", "test", job_dir_required=False)
    assert exp.learner.schedule.decay_end == 0  # what the user chose is what config.json stores
    assert exp.resolved_learner().schedule.decay_end == 500
    again = ExperimentConfig.from_json(exp.to_json())
    assert again == exp and again.resolved_learner().schedule.decay_end == 500


def test_an_unset_decay_end_in_a_run_shorter_than_the_warmup_is_never_reached():
    """A run that ends before the decay starts (6 steps of a 100-step warm-up) builds: the decay
    would start after it; the banner's note (`note_for_run`) says so instead of an error."""
    exp = _with_decay_end_unset(registry.load_experiment("shakespeare_char"))
    short = exp.replace(train=exp.train.replace(num_steps=exp.learner.schedule.warmup_steps))
    short.validate(data_files=False)
    assert short.resolved_learner().schedule.decay_end == exp.learner.schedule.warmup_steps + 1
    assert short.learner.schedule.note_for_run(short.train.num_steps).startswith("the decay starts at step")


def test_experiments_that_set_decay_end_keep_it():
    for name in registry.names():
        exp = registry.load_experiment(name)
        decay_end = getattr(exp.learner.schedule, "decay_end", 0)  # only a decaying schedule has one
        assert exp.resolved_learner() == exp.learner or decay_end == 0, name
        if decay_end:
            assert exp.resolved_learner().schedule.decay_end == decay_end, name
