"""Pax's ImageNet ResNet experiment (paxml/tasks/vision/params/imagenet_resnets.py), with Pax's numbers.

paxml registers one ImageNet ResNet, `ResNet50Pjit` ("ImageNet in 1 Hour", Goyal et al. 2017),
here `imagenet_resnet50`. Every number below is a constant of `PAX` with its line in Pax's file
(paxml commit b397693f, 2026-05-04; the file's numbers are unchanged since it was open-sourced):

    IMAGE_SIZE = 224 (l. 97); 3 channels, 1000 classes (l. 45-48, input_generator.py l. 46-47)
    TRAIN_BATCH_SIZE = EVAL_BATCH_SIZE = 512 (l. 98-99)
    ResNet-50 (`ResNet.HParamsResNet50()`, l. 158) with zero_init_residual=True (l. 163-165)
    softmax init Gaussian(0.01) over 1000 classes (l. 247-251); loss avg_xent (l. 102), no label
      smoothing (Praxis' ClassificationModel has none: one-hot label_probs)
    ShardedSgd(momentum=0.9, nesterov=True) (l. 169)
    LEARNING_RATE = (512 / 256) * 0.1 = 0.2 (l. 104)
    LinearRampupPiecewiseConstant(boundaries=iters x [5, 30, 60, 80, 90] epochs, values=[1, 0.1,
      0.01, 0.001, 0.0]) (l. 171-180), iters = TRAIN_EXAMPLES // 512 = 1281167 // 512 = 2502
      (input_generator.py l. 27): warmup 0 -> 1 over 12510 steps, 1.0 until 75060, 0.1 until
      150120, 0.01 until 200160, 0.001 until 225180
    L2_REGULARIZER_WEIGHT = 1e-4 (l. 105) with skip_lp_1d_vectors=True (l. 191)
    CLIP_GRADIENT_NORM_TO_VALUE = 0.0, EMA_DECAY = 0.0 (l. 107-108)
    num_train_steps = 2502 x 90 = 225180 (l. 227-228); eval every epoch, 2502 steps (l. 229)
    SUMMARY_INTERVAL_STEPS = 1000, SAVE_INTERVAL_STEPS = 5000, SAVE_MAX_TO_KEEP = 1000 (l. 111-113)
    MESH_SHAPE = [1, 8, 1] over ('replica', 'data', 'mdl'), batch split over (replica, data)
      (l. 118-121): full data parallelism on 8 devices. Mapped as in experiments/lm_cloud.py,
      [replica, data, mdl] = our (data, fsdp, tensor): (1, 8, 1), the batch split 8 ways. One
      difference: Praxis' convolutions carry no sharding annotation (replicated weights), while
      our rules shard conv_out (and BatchNorm/softmax dims) over fsdp, ZeRO-3 style -- the same
      math; `--mesh.ici-mesh-shape 8 1 1` replicates the weights as Pax does.

Data. Pax reads ImageNet TFRecords of the encoded JPEGs and crops them as it decodes. Here the
experiment reads the JPEGs themselves (`data.source="imagenet_folder"`, pax_eqx/data/imagenet_source.py):
`--data.path /data/imagenet`, laid out `train/<wnid>/*.JPEG` and `val/<wnid>/*.JPEG` (the 1000
synset folders sort to Pax's label ids 0..999), any size, decoded in grain's workers
(`--data.train.num-workers N`); `--data.source imagenet_array_record` reads the same bytes from
ArrayRecord shards (python -m pax_eqx.prepare_images). Without `--data.path` a run stops
before writing anything, with an error naming data.path (as the C4 experiments do); `--dry-run`
plans without data. `--data.source synthetic_images` trains on random 224x224x3 images (label 0)
for speed, no files needed.

What cannot be expressed exactly (nearest chosen):

- Preprocessing is Pax's: Inception's random-resized crop (area 8-100%, aspect 3/4-4/3, 10
  tries then the central crop, bicubic resize to 224) and a random horizontal flip for training,
  the central 224/256 of the shorter side resized to 224 for eval (TF's CROP_PADDING = 32). Two
  nearest choices: the aspect ratio is drawn log-uniformly (TF draws it uniformly), and the
  resize is Pillow's bicubic filter, which smooths when it shrinks (TF's does not). Pax feeds
  pixels as 0..255 with no mean/std normalisation: the augment "normalisation" (x - 0) / (1/255)
  scales our 0..1 pixels back to 0..255.
- dtype: the class docstring says Pax "uses bfloat16", but nothing in the experiment sets an
  fprop dtype, so Praxis' float32 default is what it runs; float32 here too.
- Eval: every epoch on the whole eval split (data.eval.reset_for_eval); Pax's decode interval
  has no counterpart (a classifier does not decode).
"""

from __future__ import annotations

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import DataConfig, ImagenetFolderSource, InputConfig
from pax_eqx.data.augment import AugmentConfig
from pax_eqx.experiment import ExperimentConfig, TrainConfig
from pax_eqx.layers import ResNetBlockConfig
from pax_eqx.layers.initializers import gaussian
from pax_eqx.layers.resnets import resnet50
from pax_eqx.learners import LearnerConfig, PiecewiseSchedule, SgdConfig
from pax_eqx.models import ClassificationModelConfig
from pax_eqx.sharding.mesh import MeshConfig

TRAIN_EXAMPLES = 1281167  # paxml/tasks/vision/input_generator.py l. 27
PAX = {
    # paxml/tasks/vision/params/imagenet_resnets.py, class ResNet50Pjit
    "IMAGE_SIZE": 224,  # l. 97
    "NUM_COLOR_CHANNELS": 3,  # l. 47
    "NUM_CLASSES": 1000,  # l. 48, l. 251
    "TRAIN_BATCH_SIZE": 512,  # l. 98
    "EVAL_BATCH_SIZE": 512,  # l. 99
    "LEARNING_RATE": (512 / 256) * 0.1,  # l. 104
    "L2_REGULARIZER_WEIGHT": 1e-4,  # l. 105
    "CLIP_GRADIENT_NORM_TO_VALUE": 0.0,  # l. 107
    "EMA_DECAY": 0.0,  # l. 108
    "SAVE_MAX_TO_KEEP": 1_000,  # l. 111
    "SAVE_INTERVAL_STEPS": 5_000,  # l. 112
    "SUMMARY_INTERVAL_STEPS": 1_000,  # l. 113
    "MESH_SHAPE": (1, 8, 1),  # l. 121
    "MOMENTUM": 0.9,  # l. 169
    "NESTEROV": True,  # l. 169
    "LR_VALUES": (1, 0.1, 0.01, 0.001, 0.0),  # l. 172
    "LR_EPOCH_BOUNDARIES": (5, 30, 60, 80, 90),  # l. 173
    "NUM_EPOCHS": 90,  # l. 103, l. 228
    "ZERO_INIT_RESIDUAL": True,  # l. 163-165
    "SOFTMAX_INIT_SCALE": 0.01,  # l. 249
}
STEPS_PER_EPOCH = TRAIN_EXAMPLES // PAX["TRAIN_BATCH_SIZE"]  # l. 174, l. 227: 2502
LR_BOUNDARIES = tuple(STEPS_PER_EPOCH * e for e in PAX["LR_EPOCH_BOUNDARIES"])  # l. 175
NUM_TRAIN_STEPS = STEPS_PER_EPOCH * PAX["NUM_EPOCHS"]  # l. 228: 225180


def pax_lr_multiplier(step: int) -> float:
    """Pax's LinearRampupPiecewiseConstant(LR_BOUNDARIES, LR_VALUES) at `step` (Praxis' semantics),
    written out to test ours against; not used by the experiment."""
    first = LR_BOUNDARIES[0]
    values = PAX["LR_VALUES"]
    if step < first:
        return values[0] * step / first
    for boundary, value in zip(LR_BOUNDARIES[1:], values):
        if step < boundary:
            return value
    return values[-1]


def resnet50_learner() -> LearnerConfig:
    """ShardedSgd(0.9, Nesterov), lr 0.2 x Pax's LinearRampupPiecewiseConstant, Pax's coupled L2 (module doc)."""
    warmup, *drops = LR_BOUNDARIES
    peak, *after = PAX["LR_VALUES"]
    return LearnerConfig(
        optimizer=SgdConfig(momentum=PAX["MOMENTUM"], nesterov=PAX["NESTEROV"]),
        learning_rate=PAX["LEARNING_RATE"],
        schedule=PiecewiseSchedule(
            warmup_steps=warmup,
            max=peak,
            boundaries=tuple(drops),
            values=tuple(v / peak for v in after),
        ),  # fmt: skip
        l2_regularization=PAX["L2_REGULARIZER_WEIGHT"],  # coupled, before momentum, as Pax's
        weight_decay_mask="matrices",  # Pax's skip_lp_1d_vectors=True
        clip_grad_norm=PAX["CLIP_GRADIENT_NORM_TO_VALUE"],
        ema_decay=PAX["EMA_DECAY"],
        skip_nonfinite=True,  # Pax's Learner default check_valid_step=True: a NaN/Inf gradient's step is skipped
    )


@register("imagenet_resnet50", aliases=("ResNet50Pjit", "tasks.vision.params.imagenet_resnets.ResNet50Pjit"))
def imagenet_resnet50() -> ExperimentConfig:
    """ResNet-50 (25.6M) on ImageNet 224x224x3, 1000 classes: batch 512, Nesterov SGD lr 0.2, 90 epochs on (1, 8, 1)."""
    size, channels = PAX["IMAGE_SIZE"], PAX["NUM_COLOR_CHANNELS"]
    network = resnet50(block=ResNetBlockConfig(bottleneck=True, zero_init_residual=PAX["ZERO_INIT_RESIDUAL"]))
    return ExperimentConfig(
        name="imagenet_resnet50",
        model=ClassificationModelConfig(
            input_shape=(size, size, channels),
            num_classes=PAX["NUM_CLASSES"],
            network=network,
            label_smoothing_prob=0.0,  # Praxis' ClassificationModel has no label smoothing
            head_init=gaussian(PAX["SOFTMAX_INIT_SCALE"]),
        ),
        learner=resnet50_learner(),
        data=DataConfig(
            source=ImagenetFolderSource(
                image_shape=(size, size, channels),
                augment=AugmentConfig(horizontal_flip=True, mean=(0.0,) * channels, std=(1.0 / 255.0,) * channels),
            ),
            train=InputConfig(batch_size=PAX["TRAIN_BATCH_SIZE"]),
            eval=InputConfig(batch_size=PAX["EVAL_BATCH_SIZE"], shuffle=False, repeat=False, reset_for_eval=True),
        ),
        mesh=MeshConfig(ici_mesh_shape=PAX["MESH_SHAPE"], device_kind="tpu_v4"),
        train=TrainConfig(
            num_steps=NUM_TRAIN_STEPS,
            eval_interval_steps=STEPS_PER_EPOCH,
            summary_interval_steps=PAX["SUMMARY_INTERVAL_STEPS"],
            fprop_dtype="float32",
            sample_at_end=False,
        ),
        checkpoint=CheckpointConfig(every_n_steps=PAX["SAVE_INTERVAL_STEPS"], max_to_keep=PAX["SAVE_MAX_TO_KEEP"]),
    )
