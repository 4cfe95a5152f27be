"""`python -m pax_eqx.train --train.num-steps 20` on the default experiment decays to its floor by step 20.

Issue 50: a shortened run used to keep the decay of the experiment's 2000 steps and end near the
peak learning rate. Here the rate metrics.jsonl logs at the last step is read back.
"""

import json
import math
import os
import subprocess
import sys

# One device, one layer of 32, batches of 4, no checkpoint, one eval batch: the least a run does.
TINY_RUN = [
    "--exp", "shakespeare_char", "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims", "64",
    "--model.num-heads", "2", "--data.seq-len", "16", "--data.train.batch-size", "4", "--data.eval.batch-size", "4",
    "--data.eval.eval-loop-num-batches", "1", "--train.steps-per-loop", "1", "--train.summary-interval-steps", "10",
    "--train.eval-interval-steps", "0", "--checkpoint.every-n-steps", "0", "--train.no-sample-at-end",
]  # fmt: skip


def test_a_shortened_run_ends_its_decay_at_its_last_step(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pax_eqx.train", *TINY_RUN, "--job-log-dir", str(tmp_path),
         "--train.num-steps", "20", "--learner.schedule.warmup-steps", "2"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["learning_rate"] for r in rows if r["split"] == "train"}
    # The step-20 row logs the last update's rate, step 19's: cosine from step 2 to 20, floor 0.1.
    expected = 2e-3 * (0.1 + 0.9 * (1 + math.cos(math.pi * 17 / 18)) / 2)
    assert math.isclose(lr[20], expected, rel_tol=1e-5), (lr, expected)
    assert lr[20] < 0.11 * 2e-3  # with the decay still ending at 2000 it was 99.99% of the peak
    saved = json.loads((tmp_path / "config.json").read_text())["learner"]["schedule"]
    assert saved["decay_end"] == 0  # config.json keeps "the run's end", so a longer resume decays further
