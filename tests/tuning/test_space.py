"""Search spaces: their domains, the checks against an experiment, a trial's flags, the count.

Everything here runs in-process with an in-memory Optuna study; the trials that train are in
test_tune_cli.py.
"""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

from pax_eqx.command_line import cli, registry
from pax_eqx.tuning import Choice, IntRange, LogUniform, SearchSpace, SearchSpaceError, Uniform, parse_param
from pax_eqx.tuning.check import baseline, check_space, flags, trial_experiment
from pax_eqx.tuning.study import counted, grid, requeue

optuna.logging.set_verbosity(optuna.logging.WARNING)


def shakespeare():
    return registry.load_experiment("shakespeare_char")


@pytest.mark.parametrize(
    "text, path, domain",
    [
        ("learner.learning-rate=loguniform:1e-4:1e-2", "learner.learning_rate", LogUniform(1e-4, 1e-2)),
        ("learner.b2=uniform:0.9:0.999", "learner.b2", Uniform(0.9, 0.999)),
        ("learner.b2=uniform:0.9:0.99:0.01", "learner.b2", Uniform(0.9, 0.99, 0.01)),
        ("learner.schedule.warmup_steps=int:0:200:20", "learner.schedule.warmup_steps", IntRange(0, 200, 20)),
        ("model.num_layers=logint:1:16", "model.num_layers", IntRange(1, 16, log=True)),
        ("model.block.activation.name=choice:gelu,relu", "model.block.activation.name", Choice(("gelu", "relu"))),
        ("train.sample_at_end=choice:true,false", "train.sample_at_end", Choice((True, False))),
        ("data.train.batch_size=choice:8,12,16", "data.train.batch_size", Choice((8, 12, 16))),
    ],
)
def test_a_param_is_read_from_the_command_line(text, path, domain):
    assert parse_param(text) == (path, domain)


@pytest.mark.parametrize(
    "text, message",
    [
        ("learner.learning_rate", "expected PATH=DOMAIN"),
        ("learner.learning_rate=normal:0:1", "unknown domain 'normal:0:1'"),
        ("learner.learning_rate=loguniform:0:1e-2", "a log scale needs LOW > 0"),
        ("learner.learning_rate=loguniform:1e-2:1e-4", "needs finite LOW < HIGH"),
        ("learner.learning_rate=loguniform:a:b", "the bounds must be numbers"),
        ("model.num_layers=int:1:8:0", "STEP must be in [1, HIGH - LOW]"),
        ("model.num_layers=choice:4", "at least two values"),
        ("model.num_layers=choice:4,4", "listed twice"),
        ("learner..b2=uniform:0:1", "expected a dotted field path"),
    ],
)
def test_a_bad_param_names_itself_and_the_fix(text, message):
    with pytest.raises(SearchSpaceError, match=re_escape(message)) as info:
        parse_param(text)
    assert text.split("=")[0] in str(info.value) or "search space path" in str(info.value)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_domains_suggest_what_they_declare():
    space = SearchSpace({
        "learner.learning_rate": LogUniform(1e-4, 1e-2),
        "learner.b2": Uniform(0.9, 0.99, 0.01),
        "learner.schedule.warmup_steps": IntRange(0, 200, 20),
        "model.block.activation.name": Choice(("gelu", "relu")),
    })  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = [space.suggest(study.ask()) for _ in range(40)]
    for values in seen:
        for path, domain in space.params.items():
            assert domain.contains(values[path]), (path, values[path])
    logs = [math.log10(v["learner.learning_rate"]) for v in seen]
    assert min(logs) < -3.3 and max(logs) > -2.7  # both decades are sampled: log-uniform
    assert {v["model.block.activation.name"] for v in seen} == {"gelu", "relu"}


def test_a_trial_s_values_become_the_flags_a_user_types():
    exp = shakespeare()
    values = {"learner.learning_rate": 0.0012345678901234567, "train.sample_at_end": False, "model.num_layers": 3}
    assert flags(exp, values) == [
        "--learner.learning-rate", "0.0012345678901234567", "--train.no-sample-at-end", "--model.num-layers", "3",
    ]  # fmt: skip
    trial = trial_experiment(exp, values)
    assert trial.learner.learning_rate == 0.0012345678901234567  # the float, exactly
    assert trial.train.sample_at_end is False and trial.model.num_layers == 3
    assert flags(exp, {"train.sample_at_end": True}) == ["--train.sample-at-end"]


def test_a_typo_in_the_space_fails_before_any_trial_with_a_suggestion():
    exp = shakespeare()
    with pytest.raises(SearchSpaceError, match=r"learner.learnin_rate: learner: LearnerConfig has no field "
                       r"'learnin_rate'. Did you mean 'learning_rate'"):  # fmt: skip
        check_space(SearchSpace({"learner.learnin_rate": LogUniform(1e-4, 1e-2)}), exp)
    with pytest.raises(SearchSpaceError, match=r"learner.learning_rate.x: learner.learning_rate is a value"):
        check_space(SearchSpace({"learner.learning_rate.x": LogUniform(1e-4, 1e-2)}), exp)


def test_a_domain_of_the_wrong_type_or_with_a_refused_end_is_refused():
    exp = shakespeare()
    with pytest.raises(SearchSpaceError, match=r"model.num_layers=uniform:1:4: the field is int; use an int range"):
        check_space(SearchSpace({"model.num_layers": Uniform(1.0, 4.0)}), exp)
    # the high end goes through validate: steps_per_loop must divide the intervals (and be <= 10000)
    with pytest.raises(SearchSpaceError, match=r"the experiment refuses train.steps_per_loop=20000"):
        check_space(SearchSpace({"train.steps_per_loop": IntRange(1, 20000)}), exp)
    with pytest.raises(SearchSpaceError, match=r"refuses model.block.activation.name=gelu_fast"):
        check_space(SearchSpace({"model.block.activation.name": Choice(("gelu", "gelu_fast"))}), exp)
    with pytest.raises(SearchSpaceError, match=r"the search space is empty"):
        check_space(SearchSpace({}), exp)


@pytest.mark.parametrize("name", [n for n in registry.names() if registry.search_space(n) is not None])
def test_every_registered_space_fits_its_experiment(name):
    space = registry.search_space(name)
    base = cli.parse_fields(registry.load_experiment(name), list(space.overrides), "test")
    check_space(space, base)


def test_the_experiment_s_own_values_are_the_first_trial_when_the_space_holds_them():
    space = registry.search_space("shakespeare_char")
    assert baseline(space, shakespeare()) == {"learner.learning_rate": 2e-3, "learner.schedule.warmup_steps": 100}
    narrow = space.replace(params={**space.params, "learner.learning_rate": LogUniform(1e-4, 1e-3)})
    assert baseline(narrow, shakespeare()) is None


def test_grid_search_takes_every_combination_in_order_and_choices_only():
    space = SearchSpace({"model.num_layers": Choice((1, 2)), "model.block.activation.name": Choice(("gelu", "relu"))})
    assert [tuple(p.values()) for p in grid(space)] == [(1, "gelu"), (1, "relu"), (2, "gelu"), (2, "relu")]
    with pytest.raises(Exception, match=r"--sampler grid takes choices only; learner.learning_rate is a range"):
        grid(SearchSpace({"learner.learning_rate": LogUniform(1e-4, 1e-2), "model.num_layers": Choice((1, 2))}))


def test_num_trials_counts_each_resumed_trial_once():
    """An interrupted trial requeued under a new number is one trial, not two; a surplus one
    (claimed after the study was full) is none."""
    study = optuna.create_study()
    space = SearchSpace({"learner.learning_rate": LogUniform(1e-4, 1e-2)})
    done = study.ask()
    space.suggest(done)
    study.tell(done, 1.0)
    cut = study.ask()
    space.suggest(cut)
    cut.set_user_attr("job_dir", "trials/0001")
    study.tell(cut, state=TrialState.FAIL)
    requeue(study, study.trials[1])
    extra = study.ask()  # the requeued one, with the interrupted trial's params and job dir
    assert space.suggest(extra) == study.trials[1].params
    assert extra.user_attrs == {"resumes_trial": 1, "job_dir": "trials/0001"}
    surplus = study.ask()
    surplus.set_user_attr("surplus", True)
    study.tell(surplus, state=TrialState.FAIL)
    assert [t.number for t in counted(study.get_trials())] == [0, 2]
