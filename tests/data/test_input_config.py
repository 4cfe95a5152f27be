"""The reset_for_eval x eval_loop_num_batches table of the data-inputs seed, cell by cell."""

import pytest

from pax_eqx.config import ConfigError
from pax_eqx.data import (
    DataConfig,
    InputConfig,
    RandomSource,
    SyntheticSource,
    build_input,
    build_tokenizer,
    eval_num_batches,
)


def eval_cfg(**kw) -> InputConfig:
    return InputConfig(batch_size=2, shuffle=False, **kw)


# -- the four cells ----------------------------------------------------------------------------


def test_reset_true_dynamic_is_one_epoch_per_run():
    cfg = eval_cfg(reset_for_eval=True, repeat=False, eval_loop_num_batches=0)
    assert eval_num_batches(cfg) is None
    assert eval_num_batches(cfg.replace(eval_loop_num_batches=-1)) is None


def test_reset_true_static_is_not_supported():
    cfg = eval_cfg(reset_for_eval=True, repeat=False, eval_loop_num_batches=5)
    message = r"data\.eval\.reset_for_eval=True with data\.eval\.eval_loop_num_batches=5 is not supported"
    with pytest.raises(ConfigError, match=message):
        cfg.validate("eval")
    with pytest.raises(ConfigError, match=message):  # the DataConfig holding it checks it when made
        DataConfig(eval=cfg)


def test_reset_false_static_rolls_over_n_batches():
    cfg = eval_cfg(reset_for_eval=False, repeat=True, eval_loop_num_batches=3)
    assert eval_num_batches(cfg) == 3


@pytest.mark.parametrize("n", [0, -1])
def test_reset_false_dynamic_is_not_supported(n):
    cfg = eval_cfg(reset_for_eval=False, repeat=True, eval_loop_num_batches=n)
    message = rf"data\.eval\.reset_for_eval=False with data\.eval\.eval_loop_num_batches={n} .*is not supported"
    with pytest.raises(ConfigError, match=message):
        cfg.validate("eval")
    with pytest.raises(ConfigError, match=message):  # the DataConfig holding it checks it when made
        DataConfig(eval=cfg)


# -- contradictory settings ----------------------------------------------------------------------


def test_one_epoch_per_run_needs_a_finite_input():
    cfg = eval_cfg(reset_for_eval=True, repeat=True)
    with pytest.raises(ConfigError, match=r"repeat=True.*set data\.eval\.repeat=False"):
        cfg.validate("eval")


def test_rolling_eval_needs_a_repeating_input():
    cfg = eval_cfg(reset_for_eval=False, repeat=False, eval_loop_num_batches=4)
    with pytest.raises(ConfigError, match=r"must repeat forever; set data\.eval\.repeat=True"):
        cfg.validate("eval")


def test_training_must_repeat_and_never_reset():
    with pytest.raises(ConfigError, match=r"data\.train\.repeat=False"):
        InputConfig(repeat=False).validate("train")
    with pytest.raises(ConfigError, match="reset_for_eval applies to eval inputs only"):
        InputConfig(reset_for_eval=True).validate("train")


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(batch_size=0), "batch_size must be > 0"),
        (dict(num_infeed_hosts=-1), "num_infeed_hosts must be >= 0"),
        (dict(num_infeed_hosts=2, infeed_host_index=2), r"infeed_host_index=2 is out of range.*use 0\.\.1"),
        (dict(infeed_host_index=-2), "infeed_host_index must be >= 0"),
        (dict(eval_loop_num_batches=-2), "eval_loop_num_batches=-2"),
        (dict(input_random_seed=-1), "input_random_seed"),
        (dict(num_workers=-1), "num_workers=-1"),
    ],
)
def test_bad_values_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        InputConfig(**fields).validate("train")


def test_experiment_build_fails_before_any_batch():
    """A bad cell of the table is refused when the DataConfig is made (directly, by replace, or
    from a job dir's config.json), so no Input is ever built from it to fail mid-run."""
    bad = InputConfig(reset_for_eval=True, repeat=False, eval_loop_num_batches=2)
    message = "data.eval.reset_for_eval=True with data.eval.eval_loop_num_batches=2 is not supported"
    with pytest.raises(ConfigError, match=message):
        DataConfig(source=SyntheticSource(), eval=bad)
    good = DataConfig(source=SyntheticSource())
    with pytest.raises(ConfigError, match=message):
        good.replace(eval=bad)
    saved = good.to_dict()
    saved["eval"]["eval_loop_num_batches"] = 2
    with pytest.raises(ConfigError, match=message):
        DataConfig.from_dict(saved)


def test_default_data_config_is_valid():
    DataConfig().validate()
    assert eval_num_batches(DataConfig().eval) is None


def test_host_index_beyond_process_count_is_an_error():
    data = DataConfig(source=SyntheticSource(num_synthetic_examples=8))
    with pytest.raises(ConfigError, match="infeed_host_index=3 is out of range for num_infeed_hosts=2"):
        build_input(data, "train", build_tokenizer(data), num_infeed_hosts=2, infeed_host_index=3)


def test_rolling_eval_reads_new_batches_each_run():
    """reset_for_eval=False, N static: consecutive runs see non-overlapping batches, forever."""
    data = DataConfig(
        source=RandomSource(num_synthetic_examples=10),
        seq_len=4,
        eval=InputConfig(batch_size=2, shuffle=False, repeat=True, reset_for_eval=False, eval_loop_num_batches=2),
    )
    inp = build_input(data, "eval", build_tokenizer(data), 1, 0)
    n = eval_num_batches(data.eval)
    runs = [[inp.get_next()["ids"] for _ in range(n)] for _ in range(7)]  # 28 examples: past the end of data
    first_five = [b for run in runs for b in run][:5]
    seen = [tuple(row) for b in first_five for row in b]
    assert len(set(seen)) == 10  # 5 batches x 2 = one full epoch, no repeats
    assert runs[0][0].tolist() != runs[1][0].tolist()
