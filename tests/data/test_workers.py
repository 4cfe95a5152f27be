"""grain worker processes (num_workers > 0): same batches as in-process, resumable, clean exit.

Run in a subprocess: worker processes must not be forked from the test runner's workers.
"""

import subprocess
import sys

SCRIPT = """
import json
import numpy as np
from pax_eqx.data import DataConfig, InputConfig, RandomSource, build_input, build_tokenizer

if __name__ == "__main__":
    data = DataConfig(source=RandomSource(num_synthetic_examples=64), seq_len=8, train=InputConfig(batch_size=4))
    tok = build_tokenizer(data)
    with_workers = data.replace(train=data.train.replace(num_workers=2))
    ref = build_input(data, "train", tok, 2, 1)
    inp = build_input(with_workers, "train", tok, 2, 1)
    for _ in range(3):
        assert np.array_equal(inp.get_next()["ids"], ref.get_next()["ids"])
    state = json.loads(json.dumps(inp.get_state()))
    want = ref.get_next()["ids"]
    resumed = build_input(with_workers, "train", tok, 2, 1)
    resumed.set_state(state)
    got = resumed.get_next()
    assert type(got["ids"]) is np.ndarray  # copied out of shared memory
    assert np.array_equal(got["ids"], want)
    print("OK")
"""


def test_worker_processes_match_in_process_batches(tmp_path):
    script = tmp_path / "workers.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK")
    assert "Traceback" not in done.stderr and "leaked shared_memory" not in done.stderr, done.stderr[-3000:]
