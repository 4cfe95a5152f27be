"""shakespeare_span_corruption end to end through the CLI, tiny: train (8 fake devices), resume,
decode eval examples with greedy and a beam, decode a prompt with sentinels; the errors a user
meets first (data of the other kind, a vocabulary without room for the sentinels, a sampling
flag beside a beam) name the field before anything is written."""

import json

import pytest
from test_cli_end_to_end import metrics

from pax_eqx import decode, train
from pax_eqx import eval as eval_main
from pax_eqx.config import ConfigError

TINY_S2S = [
    "--exp", "shakespeare_span_corruption", "--model.num-encoder-layers", "1", "--model.num-decoder-layers", "1",
    "--model.model-dims", "32", "--model.hidden-dims", "64", "--model.num-heads", "2", "--data.seq-len", "32",
    "--data.eval.eval-loop-num-batches", "2", "--train.num-steps", "6", "--train.summary-interval-steps", "2",
    "--train.eval-interval-steps", "3", "--checkpoint.every-n-steps", "3", "--decode.max-new-tokens", "10",
    "--decode.num-samples", "2", "--mesh.ici-mesh-shape", "8", "1", "1", "--data.train.batch-size", "8",
    "--data.eval.batch-size", "8",
]  # fmt: skip


def test_span_corruption_trains_resumes_and_decodes(tmp_path, capsys):
    job = tmp_path / "s2s"
    args = [*TINY_S2S, "--job-log-dir", str(job)]
    assert train.main([*args, "--train.num-steps", "3", "--train.no-sample-at-end"]) == 0
    assert train.main(args) == 0
    out = capsys.readouterr().out
    assert "Resuming" in out
    rows = metrics(job)
    train_rows = [r for r in rows if r["split"] == "train"]
    assert [r["step"] for r in train_rows] == [2, 3, 4, 6] and train_rows[-1]["tokens_per_s"] > 0
    eval_rows = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in eval_rows] == [3, 6]
    # The end of training decodes two eval examples: input, target, greedy and a beam of 4.
    assert out.count("--- example") == 2 and out.count("target: ") == 2
    assert out.count("greedy (score") == 2 and out.count("beam 1 (score") == 2
    assert "<extra_id_0>" in out and "mean score over 2 input(s): greedy" in out

    # The experiment's eval input declares exact match and BLEU on the decoded eval examples.
    assert {"exact_match", "bleu"} <= set(eval_rows[-1]) and 0 <= eval_rows[-1]["bleu"] <= 100
    decoded = [json.loads(line) for line in (job / "decode" / "eval_step_6.jsonl").read_text().splitlines()]
    assert len(decoded) == 16 and set(decoded[0]) == {"input", "target", "output"}
    assert "bleu" in out.split("Finished at step 6")[1].splitlines()[0]  # the closing block reports it

    assert eval_main.main(["--job-log-dir", str(job)]) == 0  # the experiment and its flags from config.json
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 6 and result["total_loss"] > 0
    assert 0 <= result["bleu"] <= 100 and 0 <= result["exact_match"] <= 1
    # A user's metric by its dotted path, beside a registered one; the eval's decoded examples go
    # beside its other files (DIR/eval_separate/decode/).
    user = ["--data.eval.metrics", "exact_match", "user_metrics.same_first_character"]
    assert eval_main.main(["--job-log-dir", str(job), *user]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = job / "eval_separate" / "decode" / "eval_step_6.jsonl"
    decoded = [json.loads(line) for line in written.read_text().splitlines()]
    first = [d["target"][:1] == d["output"][:1] for d in decoded]
    assert result["same_first_character"] == pytest.approx(sum(first) / len(first)) and "bleu" not in result
    assert decode.main(["--job-log-dir", str(job), "--beam-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "Beam search from the checkpoint at step 6" in out and "beam 2 (score" in out
    assert decode.main([*args, "--prompt", "To be <extra_id_0> not to be", "--beam-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "input:  To be <extra_id_0> not to be" in out and "target:" not in out and "beam 1" not in out


def test_seq2seq_errors_name_the_field(tmp_path):
    job = tmp_path / "bad"
    args = [*TINY_S2S, "--job-log-dir", str(job)]
    with pytest.raises(ConfigError, match="SequenceModelConfig.*span_corruption"):
        train.main([*args, "--data.layout", "stream"])
    with pytest.raises(ConfigError, match=r"'blue', which is not an eval metric: use one of \[.*'bleu'"):
        train.main([*args, "--data.eval.metrics", "blue"])
    with pytest.raises(SystemExit):  # a metric this model cannot feed, named by the user
        train.main([*args, "--data.eval.metrics", "bits_per_byte"])
    assert not job.exists()  # refused before anything is written
    with pytest.raises(ConfigError, match=r"260 tokens plus 2 span-corruption sentinels.*model.vocab_size >= 262"):
        train.main([*args, "--model.vocab-size", "260"])
    with pytest.raises(SystemExit) as refused:  # the beam search of this experiment does not sample
        train.main([*args, "--decode.top-k", "5"])
    assert refused.value.code == 2
    assert not job.exists() or not any(job.rglob("*.json"))
