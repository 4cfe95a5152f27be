"""The CLI parses an experiment's model as the concrete config class its default holds.

`ExperimentConfig.model` is annotated with a base class; an experiment may put a subclass there
(a user's own model config). tyro parses by annotation, so without `cli.specialise` the
subclass's own fields would be neither shown nor settable and the parsed model would silently
come back as the base class.
"""

from __future__ import annotations

import dataclasses

import pytest

from pax_eqx.command_line import cli, registry
from pax_eqx.config import Config, config
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.models import LanguageModelConfig


@config
class ScaledLanguageModelConfig(LanguageModelConfig):
    """A user's model config: one extra field of its own.
    logit_scale: multiplies the logits (a field the base class does not have)."""

    logit_scale: float = 1.0


def _experiment() -> ExperimentConfig:
    """A tiny experiment whose model is the subclass above."""
    from experiments.shakespeare import shakespeare_char

    exp = shakespeare_char()
    base = {f.name: getattr(exp.model, f.name) for f in dataclasses.fields(exp.model)}
    return exp.replace(name="scaled_lm", model=ScaledLanguageModelConfig(**base, logit_scale=2.0))


@pytest.fixture
def scaled_lm(monkeypatch):
    """The experiment registered for this test only (the registry is restored after it)."""
    registry.load_entry_points()
    monkeypatch.setitem(registry._REGISTRY, "scaled_lm", _experiment)
    return "scaled_lm"


def test_a_subclass_field_is_parsed_and_the_result_is_a_plain_experiment(scaled_lm):
    exp, _, _ = cli.parse(
        ["--exp", scaled_lm, "--model.logit-scale", "0.5", "--model.num-layers", "3"],
        "prog",
        "description",
        job_dir_required=False,
    )
    assert type(exp) is ExperimentConfig  # not the parser's specialised class
    assert type(exp.model) is ScaledLanguageModelConfig
    assert exp.model.logit_scale == 0.5 and exp.model.num_layers == 3
    assert exp == _experiment().replace(model=_experiment().model.replace(logit_scale=0.5, num_layers=3))


def test_without_overrides_the_default_comes_back_equal(scaled_lm):
    exp, _, _ = cli.parse(["--exp", scaled_lm], "prog", "description", job_dir_required=False)
    assert exp == _experiment() and type(exp.model) is ScaledLanguageModelConfig


def test_help_shows_the_concrete_models_fields(scaled_lm, capsys):
    with pytest.raises(SystemExit) as info:
        cli.parse(["--exp", scaled_lm, "--help"], "prog", "description", job_dir_required=False)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "logit-scale" in out and "--model.num-layers" in out  # the section's names; a most used flag
    with pytest.raises(SystemExit) as info:
        cli.parse(["--exp", scaled_lm, "--help", "model"], "prog", "description", job_dir_required=False)
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--model.logit-scale FLOAT" in out and "--model.num-layers INT" in out


def test_a_misspelt_subclass_field_is_one_error_line(scaled_lm, capsys):
    with pytest.raises(SystemExit) as info:
        cli.parse(["--exp", scaled_lm, "--model.logit-scal", "0.5"], "prog", "description", job_dir_required=False)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--model.logit-scale" in err


@config
class _Holder(Config):
    """A config with one config-typed field, to see `specialise` on its own."""

    model: LanguageModelConfig = LanguageModelConfig()


@config
class _PlainHolder(Config):
    """A config-typed field whose default is its annotated class and holds no choice."""

    init: WeightInit = WeightInit()


def test_the_parser_is_specialised_only_where_a_default_is_a_subclass():
    assert cli.specialise(_PlainHolder, _PlainHolder()) is _PlainHolder  # nothing to specialise
    # A choice (the model's norms) is specialised to the variant the default holds.
    spec = cli.specialise(_Holder, _Holder())
    assert spec is not _Holder and cli.generalise(cli._as(spec, _Holder())) == _Holder()
    holder = _Holder(model=ScaledLanguageModelConfig(logit_scale=3.0))
    spec = cli.specialise(_Holder, holder)
    assert spec is not _Holder and issubclass(spec, _Holder)
    model_spec = {f.name: f.type for f in dataclasses.fields(spec)}["model"]
    assert issubclass(model_spec, ScaledLanguageModelConfig)  # itself specialised to its norm variants
    back = cli.generalise(spec(model=holder.model))
    assert type(back) is _Holder and back == holder
