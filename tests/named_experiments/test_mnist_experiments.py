"""Paxml's MNIST experiment (experiments/mnist.py): Pax's numbers, its names, its parameter count,
and the missing-data error. Its data and a training run: tests/data/test_mnist_idx.py."""

from __future__ import annotations

import equinox as eqx
import jax
import pytest

from experiments import registry
from pax_eqx import train
from pax_eqx.config import ConfigError
from pax_eqx.learners import SgdConfig, learning_rate_fn

# paxml/tasks/vision/params/mnist.py (class MnistExperiment, class CNN) at paxml-v1.4.0, and the
# SingleTask.Train / Learner defaults it keeps, typed in by hand from Pax's source:
# experiments/mnist.py must agree with this table, not with itself.
PAX_MNIST = {
    "image": (28, 28, 1),  # HEIGHT, WIDTH l. 220-221; filter_shape (3, 3, 1, 32) l. 67
    "num_classes": 10,  # l. 222
    "kernel_size": 3,  # l. 223
    "conv_channels": (32, 64),  # l. 67, l. 84
    "pooling": ("avg", 2),  # pooling_type='AVG', window_shape = window_stride = (2, 2), l. 74-79
    "hidden_dims": (256,),  # dense1, l. 98
    "batch": 1024,  # BATCH_SIZE l. 216, train and eval
    "momentum": 0.1,  # l. 217
    "learning_rate": 0.01,  # l. 218, schedules.Constant(value=1) l. 247
    "num_train_steps": 1000,  # l. 219
    "mesh": (1, 1, 1),  # l. 227
    "save_interval": 5000,  # tasks_lib.py l. 1288
    "save_max_to_keep": 10,  # l. 1290
    "summary_interval": 100,  # l. 1292
    "eval_interval": 100,  # l. 1297
    "seed": 1234,  # l. 1316
    # conv1 + conv2 + dense1 + linear + bias
    "params": (9 * 32 + 32) + (9 * 32 * 64 + 64) + (3136 * 256 + 256) + (256 * 10) + 10,
}


@pytest.fixture(scope="module")
def exp():
    return registry.load_experiment("mnist_cnn")


def test_pax_class_names_are_aliases(exp):
    assert registry.load_experiment("MnistExperiment") == exp
    assert registry.load_experiment("tasks.vision.params.mnist.MnistExperiment") == exp


def test_every_number_is_paxs(exp):
    pax, m, lr, data = PAX_MNIST, exp.model, exp.learner, exp.data
    assert m.input_shape == data.source.image_shape == pax["image"]
    assert m.num_classes == pax["num_classes"] and m.label_smoothing_prob == 0.0
    net = m.network
    assert (net.channels, net.kernel_size, (net.pooling, net.pool_size)) == (
        pax["conv_channels"], pax["kernel_size"], pax["pooling"],
    )  # fmt: skip
    assert net.hidden_dims == pax["hidden_dims"] and net.activation.name == "relu" and not net.activation.gated
    assert net.init.method == m.head_init.method == "xavier"  # Praxis' default params_init
    assert data.source.kind == "mnist_idx" and not data.source.augment.normalizes  # pixels / 255, nothing more
    assert (data.train.batch_size, data.eval.batch_size) == (pax["batch"], pax["batch"])
    assert data.train.shuffle and data.train.repeat
    assert data.eval.reset_for_eval and not data.eval.repeat and not data.eval.shuffle
    assert lr.optimizer == SgdConfig(momentum=pax["momentum"], nesterov=False)
    assert lr.learning_rate == pax["learning_rate"] and lr.schedule.kind == "constant"
    schedule = learning_rate_fn(lr)
    assert [float(schedule(s)) for s in (0, 500, 999)] == pytest.approx([pax["learning_rate"]] * 3)
    assert (lr.clip_grad_norm, lr.weight_decay, lr.l2_regularization, lr.ema_decay) == (0.0, 0.0, 0.0, 0.0)
    assert lr.skip_nonfinite  # the Learner's enable_skip_step_on_gradient_anomalies=True
    assert exp.train.num_steps == pax["num_train_steps"]
    assert (exp.train.eval_interval_steps, exp.train.summary_interval_steps) == (
        pax["eval_interval"], pax["summary_interval"],
    )  # fmt: skip
    assert exp.train.seed == pax["seed"] and exp.train.fprop_dtype == "float32"
    assert (exp.checkpoint.every_n_steps, exp.checkpoint.max_to_keep) == (pax["save_interval"], pax["save_max_to_keep"])
    assert exp.mesh.ici_mesh_shape == pax["mesh"] and exp.mesh.dcn_mesh_shape == (1, 1, 1)


def test_the_model_has_paxs_parameter_count(exp):
    model = eqx.filter_eval_shape(exp.model.build, jax.random.key(0))
    count = sum(a.size for a in jax.tree.leaves(model) if isinstance(a, jax.ShapeDtypeStruct))
    assert count == PAX_MNIST["params"] == 824_458


def test_without_data_path_the_run_stops_naming_it(tmp_path):
    job = tmp_path / "job"
    with pytest.raises(ConfigError, match=r"data\.path is empty; data\.source='mnist_idx' reads MNIST's four IDX"):
        train.main(["--exp", "mnist_cnn", "--job-log-dir", str(job), "--mesh.ici-mesh-shape", "1", "1", "8"])
    assert not job.exists()
