"""The jobs of test_export_trained: tiny Llama- and GPT-2-shaped models trained two steps through
the train CLI's `main`, exported in float32 with export_hf's, and the logits each trained model
computes from its checkpoint (what the exports must reproduce).

    python tests/hf/trained_for_export.py ROOT   # ROOT/{llama,gpt2}/ (job), ROOT/{family}_hf/ (export),
                                                 # ROOT/{family}_logits.npy [2, 16, 260], ROOT/{family}.log

Run as a process of its own on one CPU device (the test starts it), with XLA's backend
optimisations off: the two jobs' compiles are most of their cost, and a one-device program
compiles in about half the time of the test process's eight-device one. The logits here and the
test's re-imported logits are compared within 1e-5, far above what the optimisation level moves.

The GPT-2-shaped model is shakespeare_char with learned positions: it has what the export must
convert on the way out (a listed stack, a fused w_qkv, LayerNorm scales stored as offsets from
one, no biases); the Llama has the plain layout (a scanned stack) with grouped-query heads and an
untied softmax.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import numpy as np

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
# Two steps at a learning rate that moves every weight (norm scales included) off its init.
TINY = [
    "--model.num-layers", "2", "--model.model-dims", "32", "--model.num-heads", "4", "--data.seq-len", "16",
    "--train.num-steps", "2", "--train.steps-per-loop", "1", "--train.no-sample-at-end",
    "--data.train.batch-size", "2", "--data.eval.batch-size", "2", "--data.eval.eval-loop-num-batches", "1",
    "--learner.learning-rate", "1e-2", "--learner.schedule.warmup-steps", "0",
]  # fmt: skip
SHAPES = {
    # Llama: scanned stack, grouped-query attention (4 query heads, 2 kv heads), untied softmax.
    "llama": ["--exp", "shakespeare_char_llama", "--model.hidden-dims", "48", "--model.num-kv-heads", "2",
              "--model.repeat", "--model.separate-embedding"],
    # GPT-2: shakespeare_char (listed stack, fused qkv, offset LayerNorm, no biases) with learned positions.
    "gpt2": ["--exp", "shakespeare_char", "--model.hidden-dims", "64", "--model.position-embedding", "trainable"],
}  # fmt: skip
ENV = {
    "XLA_FLAGS": "--xla_force_host_platform_device_count=1 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true",
    "JAX_PLATFORMS": "cpu",
}


def token_ids() -> np.ndarray:
    """[2, 16] byte-tokenizer ids of TEXT."""
    from pax_eqx.data.tokenizers import ByteTokenizer

    return np.array(ByteTokenizer().encode(TEXT)[:32]).reshape(2, 16)


def trained_logits(job: Path, ids: np.ndarray) -> np.ndarray:
    """The logits the job's own model computes from its newest checkpoint, loaded as eval and
    decode load it."""
    from hf_models import forward_logits

    from pax_eqx.checkpoint import Checkpointer
    from pax_eqx.experiment import ExperimentConfig
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.lora_base import restore_state
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.mesh import build_mesh

    exp = ExperimentConfig.from_dict(json.loads((job / "config.json").read_text()))
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    ckpt = Checkpointer(job / "checkpoints", exp.checkpoint, read_only=True)
    restored, state, _ = restore_state(ckpt, programs, exp, job, None, restore_data=False)
    ckpt.close()
    assert restored == 2, restored
    return forward_logits(programs.task.model(programs.task.inference_params(state)), ids)


def main(root: Path) -> None:
    from pax_eqx import export_hf, train

    for family, args in SHAPES.items():
        job, out = root / family, root / f"{family}_hf"
        with open(root / f"{family}.log", "w") as log, contextlib.redirect_stdout(log):
            assert train.main([*args, *TINY, "--job-log-dir", str(job)]) == 0
            assert export_hf.main(["--job-log-dir", str(job), "--out", str(out), "--dtype", "float32"]) == 0
        np.save(root / f"{family}_logits.npy", trained_logits(job, token_ids()))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
