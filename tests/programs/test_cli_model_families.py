"""A second model family through the same CLI, and layer summaries end to end.

digits_mlp (a classifier, not a language model) trains, checkpoints, resumes, evaluates and
writes TensorBoard events and metrics.jsonl exactly like the LM; its eval epoch pads the 180
held-out images to whole batches on every device, and the weighted metrics count each image
once. `--train.layer-summaries true` on the LM puts each layer's activation RMS and attention
logit max into TensorBoard and metrics.jsonl, also with microbatches.
"""

import json

import numpy as np
import pytest
from event_files import scalar_tags
from test_cli_end_to_end import metrics
from tiny import tiny_args
from tolerances import assert_same_math

from pax_eqx import eval as eval_main
from pax_eqx import train
from pax_eqx.command_line.cli import CliError
from pax_eqx.config import ConfigError
from pax_eqx.summaries.writer import TIMING_KEYS

DIGITS = [
    "--exp", "digits_mlp", "--model.network.hidden-dims", "32", "--train.num-steps", "40",
    "--train.summary-interval-steps", "10", "--train.eval-interval-steps", "20", "--checkpoint.every-n-steps", "20",
    "--mesh.ici-mesh-shape", "8", "1", "1", "--data.train.batch-size", "32", "--data.eval.batch-size", "32",
]  # fmt: skip


def test_a_classifier_trains_resumes_and_evaluates_through_the_same_cli(tmp_path, capsys):
    job = tmp_path / "digits"
    args = [*DIGITS, "--job-log-dir", str(job), "--data.eval.metrics", "confusion_matrix", "balanced_accuracy"]
    assert train.main([*args, "--train.num-steps", "20"]) == 0
    assert train.main(args) == 0
    assert "Resuming" in capsys.readouterr().out
    config = json.loads((job / "config.json").read_text())
    assert config["model"]["num_classes"] == 10 and config["data"]["source"]["kind"] == "digits"
    assert sorted(p.name for p in (job / "checkpoints").iterdir() if p.name.isdigit()) == ["20", "40"]
    rows = metrics(job)
    assert [r["step"] for r in rows if r["split"] == "train"] == [10, 20, 30, 40]
    evals = [r for r in rows if r["split"] == "eval"]
    # 180 held-out images, padded to 6 batches of 32: the padding weighs nothing.
    assert [r["num_predictions"] for r in evals] == [180.0, 180.0]
    assert evals[-1]["accuracy"] > 0.6 and "tokens_per_s" not in rows[-2] and rows[-2]["examples_per_s"] > 0
    assert {"accuracy", "error_rate", "avg_xent", "grad_norm"} <= scalar_tags(job / "summaries" / "train")
    # The input's own eval metrics: a confusion matrix of the 180 real rows that agrees with the
    # weighted accuracy, and the mean per-class recall.
    counts = np.array(json.loads((job / "plots" / "confusion.json").read_text())["counts"])
    assert counts.sum() == 180 and abs(np.trace(counts) / 180 - evals[-1]["accuracy"]) < 1e-6
    recall = np.diag(counts) / counts.sum(axis=1)
    assert abs(evals[-1]["balanced_accuracy"] - recall.mean()) < 1e-9
    assert (job / "plots" / "confusion.png").read_bytes()[:4] == b"\x89PNG"
    assert (job / "plots" / "accuracy.png").exists() and (job / "plots" / "loss.png").exists()
    assert eval_main.main(["--job-log-dir", str(job)]) == 0  # the experiment and its flags from config.json
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(result["accuracy"] - evals[-1]["accuracy"]) < 1e-6
    _classifier_decode(job, evals[-1]["accuracy"], capsys)


def _classifier_decode(job, accuracy, capsys):
    """`pax_eqx.decode` on the classifier: each eval example's predicted class, its probability and
    label, printed and written to DIR/decode/step_40.jsonl; over the whole held-out split the
    share predicted right is the eval's accuracy. A `.npy` file of one of those examples decodes
    as that example; sampling flags are refused."""
    from pax_eqx import decode as decode_main
    from pax_eqx.data.digits import digits_examples

    assert decode_main.main(["--job-log-dir", str(job), "--num-samples", "180"]) == 0
    out = capsys.readouterr().out
    assert "example 0: predicted " in out and "records: " in out
    records = [json.loads(line) for line in (job / "decode" / "step_40.jsonl").read_text().splitlines()]
    assert len(records) == 180 and list(records[0]) == ["example", "predicted", "probability", "label"]
    held_out = digits_examples("eval", 0.1)
    assert [r["label"] for r in records] == [int(held_out[i]["labels"]) for i in range(180)]
    assert abs(np.mean([r["predicted"] == r["label"] for r in records]) - accuracy) < 1e-6
    assert all(0.1 <= r["probability"] <= 1.0 for r in records)  # the most likely of 10 classes

    np.save(job / "seven.npy", held_out[3]["inputs"])
    assert decode_main.main(["--job-log-dir", str(job), "--inputs", str(job / "seven.npy")]) == 0
    (record,) = [json.loads(line) for line in (job / "decode" / "step_40.jsonl").read_text().splitlines()]
    assert record["file"] == str(job / "seven.npy") and "label" not in record
    assert record["predicted"] == records[3]["predicted"]
    assert_same_math(record["probability"], records[3]["probability"])  # a batch of 1 against one of 180
    with pytest.raises(CliError):
        decode_main.main(["--job-log-dir", str(job), "--temperature", "0.5"])
    assert "--decode.temperature has no effect" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="seven.png"):
        decode_main.main(["--job-log-dir", str(job), "--inputs", str(job / "seven.png")])


def test_layer_summaries_reach_tensorboard_and_metrics_jsonl(tmp_path):
    job = tmp_path / "lm"
    args = tiny_args(
        job, "--train.layer-summaries", "--learner.num-microbatches", "2", "--model.num-layers", "2",
        "--data.train.batch-size", "16",
    )  # fmt: skip
    assert train.main(args) == 0
    row = [r for r in metrics(job) if r["split"] == "train"][-1]
    per_layer = {k for k in row if "activation_rms" in k or "logit_max" in k}
    assert len(per_layer) == 4, per_layer  # two statistics for each of the two layers
    assert all(row[k] > 0 for k in per_layer)
    assert per_layer <= scalar_tags(job / "summaries" / "train")
    eval_row = [r for r in metrics(job) if r["split"] == "eval"][-1]
    assert per_layer <= set(eval_row)


def test_layer_summaries_are_off_by_default(tmp_path):
    job = tmp_path / "lm"
    assert train.main(tiny_args(job)) == 0
    assert not any("activation_rms" in k for r in metrics(job) for k in r)


def test_a_task_loss_the_model_does_not_report_fails_before_anything_is_written(tmp_path):
    """The train step is traced on the first batch's shapes before the job dir is touched (the
    entry point turns the ConfigError into one line and exit 2)."""
    job = tmp_path / "bad"
    with pytest.raises(ConfigError, match=r"task.losses names \['avg_xnet'\].*avg_xent"):
        train.main([*DIGITS, "--job-log-dir", str(job), "--task.losses", "avg_xnet"])
    assert not job.exists() or not any(job.iterdir())


def test_an_image_experiment_resumes_exactly(tmp_path):
    """digits_resnet (BatchNorm state, random crops drawn by the input pipeline) stopped at step
    6 and resumed gives the same metrics, bit for bit, as one uninterrupted run to step 12."""
    small = [
        "--exp", "digits_resnet", "--model.network.channels", "8", "8", "8", "--model.network.stem-channels", "8",
        "--train.summary-interval-steps", "2", "--train.eval-interval-steps", "6", "--checkpoint.every-n-steps", "6",
        "--data.train.batch-size", "16", "--data.eval.batch-size", "64", "--train.num-steps", "12",
        "--mesh.ici-mesh-shape", "8", "1", "1",
    ]  # fmt: skip
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train.main([*small, "--job-log-dir", str(straight)]) == 0
    assert train.main([*small, "--job-log-dir", str(resumed), "--train.num-steps", "6"]) == 0
    assert train.main([*small, "--job-log-dir", str(resumed)]) == 0
    strip = lambda rows: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]
    assert strip(metrics(resumed)) == strip(metrics(straight))
