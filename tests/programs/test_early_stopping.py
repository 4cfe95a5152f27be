"""Early stopping's rule (patience, min_delta, mode, target), its state through a checkpoint's JSON,
and its config errors."""

import json

import pytest

from pax_eqx.config import ConfigError
from pax_eqx.experiment import EarlyStoppingConfig, TrainConfig
from pax_eqx.programs.train.early_stopping import STATE_KEY, EarlyStopping


def _run(cfg, values, start=1):
    es, stops = EarlyStopping(cfg), []
    for i, v in enumerate(values, start=start):
        if es.update(i * 10, {"m": v}):
            stops.append(i * 10)
            break
    return es, stops


def test_patience_counts_evals_without_an_improvement_of_more_than_min_delta():
    cfg = EarlyStoppingConfig(metric="m", patience=2, min_delta=0.1)
    # 1.0 best; 0.95 is not better by > 0.1 (1); 0.85 is (best, 0); 0.8 (1); 0.9 (2) -> stop at step 50.
    es, stops = _run(cfg, [1.0, 0.95, 0.85, 0.8, 0.9, 0.1])
    assert stops == [50] and es.best == 0.85 and es.best_step == 30
    assert "has not improved by more than 0.1 for 2 evals" in es.stopped


def test_mode_max_and_a_target():
    es, stops = _run(EarlyStoppingConfig(metric="m", mode="max", patience=1), [0.1, 0.2, 0.2])
    assert stops == [30]
    es, stops = _run(EarlyStoppingConfig(metric="m", target=2.69), [3.0, 2.7, 2.69, 2.0])
    assert stops == [30] and "reached the target <= 2.69" in es.stopped
    es, stops = _run(EarlyStoppingConfig(metric="m", mode="max", target=0.5), [0.1, 0.6])
    assert stops == [20]


def test_the_state_survives_a_checkpoint_and_resumes_the_count():
    cfg = EarlyStoppingConfig(metric="m", patience=3)
    es, _ = _run(cfg, [1.0, 2.0, 3.0])  # best 1.0 at step 10, two evals since
    saved = json.loads(json.dumps({STATE_KEY: es.saved()}))  # as the checkpoint's JSON holds it
    again = EarlyStopping.restore(cfg, saved)
    assert (again.best, again.best_step, again.evals_since_best) == (1.0, 10, 2)
    assert again.update(40, {"m": 5.0})  # the third eval without improvement
    # Stopped stays stopped under the same rule; more patience decides again.
    stopped = json.loads(json.dumps({STATE_KEY: again.saved()}))
    assert EarlyStopping.restore(cfg, stopped).stopped
    more = EarlyStopping.restore(cfg.replace(patience=5), stopped)
    assert not more.stopped and more.evals_since_best == 3
    # Another metric starts afresh; a checkpoint without the state too.
    assert EarlyStopping.restore(cfg.replace(metric="other"), stopped).best is None
    assert EarlyStopping.restore(cfg, {"train": {}}).best is None


def test_a_metric_the_eval_does_not_report_is_named():
    es = EarlyStopping(EarlyStoppingConfig(metric="pplx", patience=1))
    with pytest.raises(ConfigError, match=r"metric='pplx' is not among the eval metrics \['log_pplx'\]"):
        es.update(10, {"log_pplx": 1.0})


def test_loss_the_name_the_console_prints_watches_the_total_loss():
    es = EarlyStopping(EarlyStoppingConfig(metric="loss", patience=1))
    assert es.update(10, {"total_loss": 2.0}) == ""
    assert "has not improved" in es.update(20, {"total_loss": 2.5})


def test_a_misspelt_metric_is_refused_at_start_before_anything_is_written(tmp_path, capsys):
    """It was refused at the first eval, after checkpoints were written: the eval's names are now
    known from its abstract outputs on the first batch's shapes (eval_loop.reported_names)."""
    from tiny import tiny_args

    from pax_eqx import train
    from pax_eqx.command_line import entry

    job = tmp_path / "j"
    argv = tiny_args(job, "--train.early-stopping.metric", "los", "--train.early-stopping.patience", "2")
    with pytest.raises(SystemExit) as done:
        entry.run(lambda: train.main(argv))
    err = capsys.readouterr().err
    assert done.value.code == 2, err
    assert "train.early_stopping.metric='los' is not among the eval metrics [" in err
    assert "'loss'" in err and "'log_pplx'" in err and "'pplx'" in err  # what the eval reports, aliases included
    assert not (job / "config.json").exists() and not (job / "checkpoints").exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(patience=3), r"train.early_stopping.patience=3 has no effect without train.early_stopping.metric"),
        (dict(metric="m"), r"never stops the run"),
        (dict(metric="m", target=1.0, min_delta=0.1), r"min_delta=0.1 has no effect with .*patience=0"),
        (dict(metric="m", patience=-1), r"train.early_stopping.patience must be >= 0"),
        (dict(metric="m", mode="up", patience=1), r"mode='up' is not one of"),
    ],
)
def test_bad_configs_are_one_config_error_naming_the_field(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EarlyStoppingConfig(**kwargs).validate()


def test_early_stopping_needs_evals_during_the_run():
    with pytest.raises(ConfigError, match="train.eval_interval_steps=0"):
        TrainConfig(eval_interval_steps=0, early_stopping=EarlyStoppingConfig(metric="m", patience=1)).validate()
