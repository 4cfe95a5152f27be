"""The data inspection command: its core report, and the `python -m pax_eqx.inspect_data` entry point."""

import pytest

from pax_eqx.data import DataConfig, InputConfig, RandomSource, SyntheticSource, TextFilesSource
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.inspect_data import inspect, main


def test_report_shows_shapes_padding_and_decoded_rows(tmp_path):
    (tmp_path / "c.txt").write_text("To be, or not to be: that is the question.\n" * 3)
    data = DataConfig(
        source=TextFilesSource(path=str(tmp_path / "c.txt")),
        seq_len=16,
        eval=InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True),
    )
    report = inspect(data, "eval", num_batches=3, num_infeed_hosts=2, infeed_host_index=1)
    assert "host 1 of 2" in report and "global batch 8 (4 per host x 2 hosts)" in report
    assert "eval run: until StopIteration" in report
    assert "ids          (4, 16)      int32" in report
    assert "weights      (4, 16)      float32" in report
    assert "rows fully padded" in report and "row 0: " in report
    assert "StopIteration (end of data)" in report  # a 13-token eval split is one batch per host


def test_seq2seq_report_decodes_inputs_and_targets_with_sentinels(tmp_path):
    (tmp_path / "c.txt").write_text("To be, or not to be: that is the question.\n" * 8)
    data = DataConfig(
        source=TextFilesSource(path=str(tmp_path / "c.txt"), layout="span_corruption"),
        seq_len=32,
        eval=InputConfig(batch_size=2, shuffle=False, repeat=False, reset_for_eval=True),
    )
    report = inspect(data, "eval", num_batches=1)
    assert "target_ids" in report and "target padding:" in report
    assert "inputs 0: " in report and "targets 0: '<extra_id_0>" in report


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="--num-batches must be > 0"):
        inspect(DataConfig(source=SyntheticSource()), num_batches=0)


def tiny_experiment() -> ExperimentConfig:
    return ExperimentConfig(data=DataConfig(source=RandomSource(num_synthetic_examples=32), seq_len=8))


def test_command_line(capsys):
    exp = f"{__name__}.tiny_experiment"
    assert (
        main(
            [
                "--exp",
                exp,
                "--split",
                "eval",
                "--num-batches",
                "1",
                "--num-infeed-hosts",
                "2",
                "--infeed-host-index",
                "1",
                "--data.seq-len",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "split='eval'" in out and "host 1 of 2" in out and "(12, 4)" in out
