"""The small model, learner and batches shared by the SPMD tests and the multi-host worker."""

import numpy as np

from pax_eqx.layers.pipeline import PipelineConfig
from pax_eqx.learners import LearnerConfig
from pax_eqx.learners.optimizer_configs import AdamWConfig
from pax_eqx.models import LanguageModelConfig
from pax_eqx.programs.compiled import Programs
from pax_eqx.sharding.mesh import MeshConfig, build_mesh
from pax_eqx.tasks.task import Task

MODEL = LanguageModelConfig(
    vocab_size=32, max_seq_len=16, num_layers=2, model_dims=32, hidden_dims=64, num_heads=4, num_kv_heads=2
)

# 4 layers in 2 stages of 2, 4 microbatches: the pipelined tests' model.
PIPELINED = MODEL.replace(num_layers=4, pipeline=PipelineConfig(num_stages=2, num_microbatches=4))
LEARNER = LearnerConfig(optimizer=AdamWConfig(), learning_rate=1e-2, weight_decay=0.01)


def global_batches(n: int = 5, batch: int = 8, seq: int = 16):
    rng = np.random.default_rng(0)
    for _ in range(n):
        # Learnable rows: arithmetic sequences mod 32 with random starts and strides.
        start = rng.integers(0, 32, (batch, 1))
        stride = rng.integers(1, 4, (batch, 1))
        ids = ((start + stride * np.arange(seq + 1)) % 32).astype(np.int32)
        yield {
            "ids": ids[:, :-1],
            "labels": ids[:, 1:],
            "weights": np.ones((batch, seq), np.float32),
            "segment_ids": np.ones((batch, seq), np.int32),
            "segment_pos": np.tile(np.arange(seq, dtype=np.int32), (batch, 1)),
        }


def programs_for(mesh_cfg: MeshConfig, devices=None, model=MODEL, learner=LEARNER) -> Programs:
    return Programs(Task(model, learner), build_mesh(mesh_cfg, devices), mesh_cfg.rules)


def losses(mesh_cfg: MeshConfig, devices=None, batch: int = 8, **kw) -> list[float]:
    programs = programs_for(mesh_cfg, devices, **kw)
    state = programs.init_state(0)
    out = []
    for b in global_batches(batch=batch):
        state, outputs = programs.train_step(state, programs.global_batch(b))
        out.append(float(outputs.metrics["total_loss"].value))
    return out
