"""digits_mlp: a classifier on scikit-learn's 8x8 handwritten digits, through the same Task.

Not a language model: 64 pixel features in, 10 classes out, a two-layer MLP with batch norm
(whose moving statistics are non-trainable, mean-synced state) trained with Adam. It proves
the model contract is general -- the Task, CLI, checkpoints, summaries and eval programs are
the ones the language models use -- and trains in seconds on a CPU (98.9% eval accuracy after
600 steps, in about 6 s). The split is fixed: the last 10% of a seeded shuffle of the 1,797 images.
"""

from __future__ import annotations

from experiments.registry import register
from pax_eqx.checkpoint import CheckpointConfig
from pax_eqx.data import DataConfig, DigitsImagesSource, DigitsSource, InputConfig
from pax_eqx.data.augment import AugmentConfig
from pax_eqx.experiment import ExperimentConfig, TrainConfig
from pax_eqx.layers import MLPConfig, ResNetBlockConfig, ResNetConfig, ViTConfig
from pax_eqx.learners import AdamWConfig, CosineSchedule, LearnerConfig
from pax_eqx.models import ClassificationModelConfig
from pax_eqx.tuning import LogUniform, SearchSpace


def _digits(
    name: str,
    model: ClassificationModelConfig,
    *,
    images: bool,
    weight_decay: float,
    num_steps: int,
    warmup_steps: int,
    min_ratio: float,
    eval_every: int,
) -> ExperimentConfig:
    """What the digits experiments share: AdamW at 3e-3 with a cosine decay over the run (decay_end
    0 follows --train.num-steps), batches of 64, one eval epoch over the 180 held-out digits
    scored with a confusion matrix, no decoding.
    `images`: the digits as 8x8x1 images with a 1-pixel random crop, else as 64 features."""
    eval_input = InputConfig(
        batch_size=64 if not images else 60, shuffle=False, repeat=False, reset_for_eval=True,
        metrics=("confusion_matrix", "balanced_accuracy"),
    )  # fmt: skip
    source = DigitsImagesSource(augment=AugmentConfig(crop_padding=1)) if images else DigitsSource()
    data = DataConfig(source=source, train=InputConfig(batch_size=64), eval=eval_input)
    return ExperimentConfig(
        name=name,
        model=model,
        learner=LearnerConfig(
            optimizer=AdamWConfig(),
            learning_rate=3e-3,
            weight_decay=weight_decay,
            schedule=CosineSchedule(warmup_steps=warmup_steps, decay_end=0, min_ratio=min_ratio),  # to num_steps
        ),
        data=data,
        train=TrainConfig(
            num_steps=num_steps, eval_interval_steps=eval_every, summary_interval_steps=50, sample_at_end=False
        ),
        checkpoint=CheckpointConfig(every_n_steps=eval_every, max_to_keep=2),
    )


# What `python -m pax_eqx.tune --exp digits_mlp` searches: Adam's rate and weight decay, for the
# held-out accuracy (a metric to maximise; evals every 100 steps give the pruner six points).
MLP_SEARCH = SearchSpace(
    {"learner.learning_rate": LogUniform(3e-4, 3e-2), "learner.weight_decay": LogUniform(1e-4, 0.1)},
    metric="accuracy",
    direction="maximize",
    overrides=("--train.eval-interval-steps", "100"),
)


@register("digits_mlp", aliases=("DigitsMlp",), search=MLP_SEARCH)
def digits_mlp() -> ExperimentConfig:
    """An MLP classifier of scikit-learn's 8x8 digits (a model family other than the LM)."""
    mlp = MLPConfig(hidden_dims=(128, 128), batch_norm=True, batch_norm_decay=0.95)
    model = ClassificationModelConfig(input_shape=(64,), num_classes=10, network=mlp)
    return _digits(
        "digits_mlp", model, images=False, weight_decay=0.01, num_steps=600, warmup_steps=20, min_ratio=0.1,
        eval_every=200,
    )  # fmt: skip


@register("digits_resnet", aliases=("DigitsResNet",))
def digits_resnet() -> ExperimentConfig:
    """A small ResNet on the digits as 8x8x1 images (issue 13's goal: >= 98% test accuracy in
    about two minutes on a 2-core CPU; it reaches 98.9-99.4% over three seeds in about 30 s)."""
    resnet = ResNetConfig(
        blocks=(1, 1, 1),
        channels=(16, 32, 64),
        strides=(1, 2, 2),
        stem="small",
        stem_channels=16,
        block=ResNetBlockConfig(batch_norm_decay=0.9),
    )
    model = ClassificationModelConfig(input_shape=(8, 8, 1), num_classes=10, network=resnet, label_smoothing_prob=0.1)
    return _digits(
        "digits_resnet", model, images=True, weight_decay=1e-4, num_steps=600, warmup_steps=20, min_ratio=0.05,
        eval_every=200,
    )  # fmt: skip


@register("digits_vit", aliases=("DigitsViT",))
def digits_vit() -> ExperimentConfig:
    """A tiny ViT on the digits as 8x8x1 images: 2x2 patches (16 tokens), 4 layers of width 64,
    mean pooling (issue 13: its accuracy is reported, there is no target): 97.2% eval accuracy after
    1,500 steps, in about 70 s on a 2-core CPU."""
    vit = ViTConfig(patch_size=2, model_dims=64, num_layers=4, num_heads=4, hidden_dims=128, pooling="mean")
    model = ClassificationModelConfig(input_shape=(8, 8, 1), num_classes=10, network=vit, label_smoothing_prob=0.1)
    return _digits(
        "digits_vit", model, images=True, weight_decay=0.05, num_steps=1500, warmup_steps=50, min_ratio=0.05,
        eval_every=250,
    )  # fmt: skip
