"""The tiny LoRA run the tests of tests/tasks share: shakespeare_char made small, on a 2x2x2 mesh
of the 8 fake devices, with a repeated (scanned) stack so each adapter has a `layers` axis."""

from __future__ import annotations

import functools

import numpy as np

from experiments import registry
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.learners.lora_config import LoraConfig


@functools.cache
def tiny(lora: LoraConfig, **more) -> ExperimentConfig:
    """shakespeare_char with 2 layers of width 32, `lora`, and `more` overrides (path: value)."""
    exp = registry.load_experiment("shakespeare_char")
    sizes = {
        "model.num_layers": 2, "model.model_dims": 32, "model.hidden_dims": 64, "model.num_heads": 2,
        "model.repeat": True, "model.block.attention.combine_qkv": False, "data.seq_len": 16,
        "mesh.ici_mesh_shape": (2, 2, 2), "data.train.batch_size": 8, **more,
    }  # fmt: skip
    for path, value in sizes.items():
        exp = exp.override(path, value)
    return exp.replace(lora=lora)


def batch(seed: int = 0) -> dict[str, np.ndarray]:
    """8 random rows of 16 byte ids, their next ids as labels, every position weighted."""
    ids = np.random.default_rng(seed).integers(0, 60, (8, 17)).astype(np.int32)
    return {"ids": ids[:, :-1], "labels": ids[:, 1:], "weights": np.ones((8, 16), np.float32)}
