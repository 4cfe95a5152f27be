"""Pax's ImageNet ResNet experiment (experiments/imagenet.py): Pax's numbers, the ResNet-50 plan,
one real training step on synthetic images, and the missing-data error."""

from __future__ import annotations

import json

import pytest
from test_experiments_cli_and_docs import run_main

from experiments import imagenet, registry
from pax_eqx import train
from pax_eqx.config import ConfigError
from pax_eqx.learners import SgdConfig, learning_rate_fn

# paxml/tasks/vision/params/imagenet_resnets.py (class ResNet50Pjit) and input_generator.py, typed
# in by hand from Pax's source: experiments/imagenet.py must agree with this table, not with itself.
PAX_RESNET50 = {
    "image": (224, 224, 3),  # IMAGE_SIZE l. 97; num_color_channels l. 47
    "num_classes": 1000,  # l. 48, l. 251
    "train_batch": 512,  # l. 98
    "eval_batch": 512,  # l. 99
    "learning_rate": 0.2,  # (512 / 256) * 0.1, l. 104
    "l2": 1e-4,  # l. 105
    "momentum": 0.9,  # l. 169
    "nesterov": True,  # l. 169
    "steps_per_epoch": 2502,  # 1281167 // 512, l. 174 / l. 227, input_generator.py l. 27
    "lr_boundaries": (12510, 75060, 150120, 200160, 225180),  # 2502 x [5, 30, 60, 80, 90], l. 173-175
    "lr_values": (1.0, 0.1, 0.01, 0.001, 0.0),  # l. 172
    "num_train_steps": 225180,  # 2502 x 90, l. 228
    "summary_interval": 1000,  # l. 113
    "save_interval": 5000,  # l. 112
    "save_max_to_keep": 1000,  # l. 111
    "mesh": (1, 8, 1),  # l. 121
    "softmax_init_scale": 0.01,  # l. 249
}


@pytest.fixture(scope="module")
def exp():
    return registry.load_experiment("imagenet_resnet50")


def test_pax_class_names_are_aliases(exp):
    assert registry.load_experiment("ResNet50Pjit") == exp
    assert registry.load_experiment("tasks.vision.params.imagenet_resnets.ResNet50Pjit") == exp


def test_every_number_is_paxs(exp):
    pax, m, lr, data = PAX_RESNET50, exp.model, exp.learner, exp.data
    assert m.input_shape == data.source.image_shape == pax["image"]
    assert m.num_classes == pax["num_classes"]
    assert m.label_smoothing_prob == 0.0
    assert (m.head_init.method, m.head_init.scale) == ("gaussian", pax["softmax_init_scale"])
    net = m.network
    assert (net.blocks, net.channels, net.strides) == ((3, 4, 6, 3), (256, 512, 1024, 2048), (1, 2, 2, 2))
    assert (net.stem, net.stem_channels, net.block.bottleneck, net.block.zero_init_residual) == (
        "imagenet", 64, True, True,
    )  # fmt: skip
    assert (data.train.batch_size, data.eval.batch_size) == (pax["train_batch"], pax["eval_batch"])
    assert data.source.augment.horizontal_flip and data.source.augment.std == (1 / 255,) * 3  # Pax feeds 0..255 pixels
    assert lr.optimizer == SgdConfig(momentum=pax["momentum"], nesterov=pax["nesterov"])
    assert lr.learning_rate == pytest.approx(pax["learning_rate"])
    assert (lr.l2_regularization, lr.weight_decay) == (pax["l2"], 0.0)  # Pax's coupled L2, no decoupled decay
    assert lr.weight_decay_mask == "matrices"  # skip_lp_1d_vectors=True
    assert (lr.clip_grad_norm, lr.ema_decay) == (0.0, 0.0)
    assert imagenet.STEPS_PER_EPOCH == pax["steps_per_epoch"]
    assert imagenet.LR_BOUNDARIES == pax["lr_boundaries"]
    assert exp.train.num_steps == pax["num_train_steps"]
    assert exp.train.eval_interval_steps == pax["steps_per_epoch"]
    assert exp.train.summary_interval_steps == pax["summary_interval"]
    assert (exp.checkpoint.every_n_steps, exp.checkpoint.max_to_keep) == (pax["save_interval"], pax["save_max_to_keep"])
    assert exp.mesh.ici_mesh_shape == pax["mesh"] and exp.mesh.dcn_mesh_shape == (1, 1, 1)
    assert exp.train.fprop_dtype == "float32" and exp.train.sample_at_end is False


def test_schedule_is_paxs_at_every_boundary(exp):
    """Pax's LinearRampupPiecewiseConstant exactly: the warmup, the plateau and each drop (x0.1 at
    epochs 30, 60, 80; 0 after 90), at every boundary and the steps either side of it."""
    ours = learning_rate_fn(exp.learner)
    pax_lr = PAX_RESNET50["learning_rate"]
    boundaries = PAX_RESNET50["lr_boundaries"]
    steps = [0, 1, boundaries[0] // 2] + [b + d for b in boundaries for d in (-1, 0, 1)]
    for step in steps:
        assert float(ours(step)) == pytest.approx(pax_lr * imagenet.pax_lr_multiplier(step), rel=1e-5, abs=1e-7), step
    assert imagenet.pax_lr_multiplier(boundaries[1]) == 0.1 and imagenet.pax_lr_multiplier(boundaries[2]) == 0.01


def test_dry_run_plans_resnet50_with_its_published_parameter_count(capsys):
    code, out, err = run_main(capsys, "--exp", "ResNet50Pjit", "--dry-run")
    assert code == 0, err
    assert "Dry run of imagenet_resnet50: mesh (data, fsdp, tensor) = (1, 8, 1)" in out
    assert "Parameters: 25,557,032 (25.56 M)" in out


def test_without_data_path_the_run_stops_naming_it_and_the_synthetic_source(tmp_path):
    job = tmp_path / "job"
    with pytest.raises(ConfigError, match=r"data.path is empty.*--data.source synthetic_images"):
        train.main(["--exp", "imagenet_resnet50", "--job-log-dir", str(job)])  # Pax's 8 devices
    assert not job.exists()


def test_one_real_training_step_on_small_synthetic_images(capsys, tmp_path):
    """The experiment as registered on Pax's (1, 8, 1) mesh (tests/conftest.py's 8 CPU devices),
    shrunk by flags only: 32x32 images, 8 channels, one block a stage, batch 8, 10 classes (1000
    classes give 1000 per-class metrics, slow to compile here)."""
    job = tmp_path / "job"
    code, out, err = run_main(
        capsys, "--exp", "imagenet_resnet50", "--job-log-dir", str(job),
        "--data.source", "synthetic_images", "--data.image-shape", "32", "32", "3", "--data.num-synthetic-examples",
        "16", "--data.train.batch-size", "8", "--data.eval.batch-size", "8", "--model.input-shape", "32", "32", "3",
        "--model.num-classes", "10", "--model.network.channels", "8", "8", "8", "8", "--model.network.blocks", "1",
        "1", "1", "1", "--model.network.stem-channels", "8", "--train.num-steps", "1", "--train.eval-interval-steps",
        "1", "--checkpoint.every-n-steps", "0",
    )  # fmt: skip
    assert code == 0, err
    assert "Finished at step 1" in out
    config = json.loads((job / "config.json").read_text())
    assert config["data"]["source"]["kind"] == "synthetic_images" and config["learner"]["optimizer"]["kind"] == "sgd"
