"""Paxml's MNIST example (paxml/tasks/vision/params/mnist.py), with Pax's numbers.

paxml 1.4 registers one MNIST experiment, `MnistExperiment` ("MNIST model based on CNN"), here
`mnist_cnn`; `--exp MnistExperiment` and `--exp tasks.vision.params.mnist.MnistExperiment` name
it too. Every number below is a constant of `PAX` with its line in Pax's file (paxml-v1.4.0,
b5a3fcd7; unchanged at b397693f) or the Pax/Praxis default it takes:

    HEIGHT = WIDTH = 28, NUM_CLASSES = 10, KERNEL_SIZE = 3 (l. 220-223); 1 channel (l. 67)
    CNN (l. 50-121): 3x3 conv 1 -> 32 with bias, ReLU (l. 64-73), 2x2 AVG pooling at stride 2
      (l. 74-80), 3x3 conv 32 -> 64 with bias, ReLU (l. 81-90), the same pooling (l. 91),
      flatten 7 x 7 x 64 = 4 x 28 x 28 = 3136 (l. 97), FeedForward 3136 -> 256 with bias and
      ReLU (l. 94-101), Linear 256 -> 10 and Bias (l. 102-109): `CNNConfig` (layers/cnns.py),
      Paxml's Linear + Bias being the ClassificationModel's softmax head; Praxis' default init
      (Xavier) everywhere, biases 0, no BatchNorm (batch_norm_tpl=None, l. 69, 86)
    loss: the mean softmax cross-entropy over the batch, one-hot labels (l. 124-129): avg_xent,
      no label smoothing; accuracy (l. 132-134)
    BATCH_SIZE = 1024 for training and eval (l. 216, 271, 276)
    ShardedSgd(momentum=MOMENTUM = 0.1, nesterov=False) (l. 217, 244-248): optax.sgd's trace
    LEARNING_RATE = 0.01 (l. 218, 249) x schedules.Constant(value=1) (l. 247)
    TRAIN_STEPS = 1000 (l. 219, 262)
    no clipping, no weight decay, no EMA (BaseOptimizer's defaults); the Learner's
      enable_skip_step_on_gradient_anomalies=True (learners.py l. 141): a step whose gradient
      norm is NaN/Inf is skipped (learner.skip_nonfinite)
    SingleTask.Train defaults (tasks_lib.py l. 1288-1316): save_interval_steps 5000,
      save_max_to_keep 10, summary_interval_steps 100, eval_interval_steps 100, random_seed 1234
    ICI_MESH_SHAPE = [1, 1, 1] over ('replica', 'data', 'mdl') (l. 226-227): our (data, fsdp,
      tensor) = (1, 1, 1), one device
    eval_skip_train=True (l. 263): pax_eqx never evaluates on the training split
    data: TFDS 'mnist' train / test (l. 163-170), pixels / 255 (l. 173-175), train shuffled and
      repeated (l. 185-186), eval one pass with reset_for_eval=True (l. 274-279), batches with
      drop_remainder (l. 188): `mnist_idx` (pax_eqx/data/sources/mnist_idx.py)

Data. Pax reads MNIST through TFDS (`tfds.load('mnist', try_gcs=True)`, downloaded when first
used). Here nothing is downloaded: `--data.path DIR` names a directory holding the four IDX files
of the MNIST site (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
t10k-labels-idx1-ubyte, each plain or .gz), the files TFDS itself builds its `mnist` from, with
the same split (train: 60,000, eval: the 10,000 of t10k). Without `--data.path` a run stops before
writing anything, naming data.path; `--dry-run` plans without data.

What cannot be expressed exactly (nearest chosen):

- Train order: Pax shuffles with a 10,000-example buffer over TFDS's order
  (`dataset.shuffle(10000)`, reseeded each run). Here each epoch is a full permutation seeded by
  data.train.input_random_seed, the same in every run (what every pax_eqx source does; a
  resumed run sees the batches an uninterrupted one would).
- Eval set: Pax batches the test split with `drop_remainder=True`, so each eval reads 9 batches,
  9,216 of the 10,000 test images. Here an eval epoch reads all 10,000 (10 batches, the last
  padded with rows of weight 0). A static 9 batches would need reset_for_eval=False with a
  repeating input, which rolls over the split instead of reading its first 9,216 images.
- Checkpoints: Pax's save_keep_interval_duration='12h' (keep one checkpoint each 12 hours past
  save_max_to_keep) has no counterpart; a 1,000-step run saves once, at its last step, anyway.
- Init scale: Praxis' default Xavier gain is 1.000001, ours 1.0.
- Summaries: Pax's Learner writes gradient and variable norms (grad_norm_summary,
  var_norm_summary); pax_eqx's train metrics are its own (docs/design.md, "Summaries").
- Metric names: Pax's `loss` is `avg_xent` here (the same number); `accuracy` is `accuracy`.
"""

from __future__ import annotations

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import DataConfig, InputConfig
from pax_eqx.data.sources.mnist_idx import MnistIdxSource
from pax_eqx.experiment import ExperimentConfig, TrainConfig
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.cnns import CNNConfig
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.learners import ConstantSchedule, LearnerConfig, SgdConfig
from pax_eqx.models import ClassificationModelConfig
from pax_eqx.sharding.mesh import MeshConfig

PAX = {
    # paxml/tasks/vision/params/mnist.py, class MnistExperiment and class CNN
    "HEIGHT": 28,  # l. 220
    "WIDTH": 28,  # l. 221
    "NUM_CLASSES": 10,  # l. 222
    "KERNEL_SIZE": 3,  # l. 223
    "INPUT_CHANNELS": 1,  # filter_shape (k, k, 1, 32), l. 67
    "CONV_CHANNELS": (32, 64),  # l. 67, l. 84
    "POOLING": "avg",  # pooling_type='AVG', l. 78
    "POOL_SIZE": 2,  # window_shape = window_stride = (2, 2), l. 76-77
    "HIDDEN_DIMS": (256,),  # dense1 output_dims, l. 98
    "ACTIVATION": "relu",  # activation_tpl ReLU, l. 57-59
    "BATCH_SIZE": 1024,  # l. 216
    "MOMENTUM": 0.1,  # l. 217
    "NESTEROV": False,  # ShardedSgd's default, praxis/optimizers.py
    "LEARNING_RATE": 0.01,  # l. 218
    "TRAIN_STEPS": 1000,  # l. 219
    "ICI_MESH_SHAPE": (1, 1, 1),  # l. 227
    # paxml/tasks_lib.py, SingleTask.Train defaults (the experiment sets none of them)
    "SAVE_INTERVAL_STEPS": 5000,  # l. 1288
    "SAVE_MAX_TO_KEEP": 10,  # l. 1290
    "SUMMARY_INTERVAL_STEPS": 100,  # l. 1292
    "EVAL_INTERVAL_STEPS": 100,  # l. 1297
    "RANDOM_SEED": 1234,  # l. 1316
}


def mnist_cnn_network() -> CNNConfig:
    """Paxml's `CNN`: two 3x3 convolutions (32, 64) each with ReLU and 2x2 average pooling, then 256 (module doc)."""
    return CNNConfig(
        channels=PAX["CONV_CHANNELS"],
        kernel_size=PAX["KERNEL_SIZE"],
        pooling=PAX["POOLING"],
        pool_size=PAX["POOL_SIZE"],
        hidden_dims=PAX["HIDDEN_DIMS"],
        activation=ActivationConfig(name=PAX["ACTIVATION"]),
        init=WeightInit(),  # Praxis' default params_init: Xavier
    )


@register("mnist_cnn", aliases=("MnistExperiment", "tasks.vision.params.mnist.MnistExperiment"))
def mnist_cnn() -> ExperimentConfig:
    """Paxml's CNN (824K) on MNIST 28x28x1 from its IDX files: batch 1024, SGD momentum 0.1 at lr 0.01, 1000 steps."""
    shape = (PAX["HEIGHT"], PAX["WIDTH"], PAX["INPUT_CHANNELS"])
    batch = PAX["BATCH_SIZE"]
    return ExperimentConfig(
        name="mnist_cnn",
        model=ClassificationModelConfig(
            input_shape=shape,
            num_classes=PAX["NUM_CLASSES"],
            network=mnist_cnn_network(),
            label_smoothing_prob=0.0,  # one-hot targets, l. 127-128
            head_init=WeightInit(),  # the Linear 256 -> 10: Praxis' default Xavier
        ),
        learner=LearnerConfig(
            optimizer=SgdConfig(momentum=PAX["MOMENTUM"], nesterov=PAX["NESTEROV"]),
            learning_rate=PAX["LEARNING_RATE"],
            schedule=ConstantSchedule(),
            skip_nonfinite=True,  # the Learner's enable_skip_step_on_gradient_anomalies=True
        ),
        data=DataConfig(
            source=MnistIdxSource(image_shape=shape),
            train=InputConfig(batch_size=batch),
            eval=InputConfig(batch_size=batch, shuffle=False, repeat=False, reset_for_eval=True),
        ),
        mesh=MeshConfig(ici_mesh_shape=PAX["ICI_MESH_SHAPE"], device_kind="tpu_v4"),
        train=TrainConfig(
            num_steps=PAX["TRAIN_STEPS"],
            eval_interval_steps=PAX["EVAL_INTERVAL_STEPS"],
            summary_interval_steps=PAX["SUMMARY_INTERVAL_STEPS"],
            seed=PAX["RANDOM_SEED"],
            fprop_dtype="float32",
            sample_at_end=False,
        ),
        checkpoint=CheckpointConfig(every_n_steps=PAX["SAVE_INTERVAL_STEPS"], max_to_keep=PAX["SAVE_MAX_TO_KEEP"]),
    )
