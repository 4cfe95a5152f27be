"""ClassificationModel: a network of features, then a softmax over classes (Praxis' ClassificationModel).

    inputs [B, *input_shape] -> network (MLP, ResNet, ViT or CNN) -> features [B, F] -> Softmax -> logits [B, C]

Batch: `inputs` [batch, *input_shape] (float), `labels` [batch] (int), `weights` [batch] (0 for
padded rows). Metrics, each a mean over the weighted examples with their count as its weight:
`avg_xent` (the loss), `accuracy` (top-1), `accuracy_top5` (when there are more than 5
classes), `error_rate`, and, with at most 20 classes, `accuracy/class_<c>` for each class, weighted by
that class's count (its recall; the weights are the per-class counts).

The network is a template (`network`) whose input size the model decides (`input_shape`); the
CLI shows the experiment's network's own fields (`--model.network.hidden-dims 64 64`).
`predict(batch)` gives the classes and their probabilities; `decode_examples(batch)` (Praxis'
ClassificationModel.decode, what `python -m pax_eqx.decode` prints) each example's predicted
class, its probability and, when the batch has labels, the label.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from pax_eqx.config import ConfigError, check_range, config
from pax_eqx.layers.base import Context, Mode, call
from pax_eqx.layers.cnns import CNNConfig
from pax_eqx.layers.embedding_softmax import FullSoftmax, SoftmaxConfig
from pax_eqx.layers.initializers import WeightInit
from pax_eqx.layers.mlps import MLPConfig
from pax_eqx.layers.resnets import ResNetConfig
from pax_eqx.layers.vits import ViTConfig
from pax_eqx.metrics import Metrics, weighted_mean
from pax_eqx.models.model import Batch, Model, ModelConfig

_TOP_K = 5
# Per-class accuracies are scalars each (one TensorBoard curve a class): worth it for a few
# classes; for ImageNet's 1000 they would swamp the summaries and the step's outputs, and the
# confusion matrix (data.eval.metrics) says the same thing once per eval.
_MAX_PER_CLASS_METRICS = 20


@config
class ClassificationModelConfig(ModelConfig):
    """input_shape: one example's shape, e.g. (64,) features or (8, 8, 1) pixels (H, W, C).
    num_classes: classes. network: the feature network's template.
    label_smoothing_prob: label smoothing of the cross-entropy (0 = off).
    head_init: the softmax projection's init.
    """

    decodes_examples: ClassVar[bool] = True
    per_example_keys: ClassVar[tuple[str, ...]] = ("predicted", "label", "weight")

    input_shape: tuple[int, ...] = ()
    num_classes: int = 0
    network: MLPConfig | ResNetConfig | ViTConfig | CNNConfig = MLPConfig()
    label_smoothing_prob: float = 0.0
    head_init: WeightInit = WeightInit()

    def validate(self) -> None:
        check_range(
            self, "num_classes", ge=2, prefix="model",
            note="a softmax over one class gives every example probability 1: its loss is 0 or NaN, nothing is learnt",
            fix="Set it to the data's number of classes.",
        )  # fmt: skip
        if not self.input_shape or any(not d > 0 for d in self.input_shape):
            raise ConfigError(
                f"model.input_shape must be one example's positive sizes, e.g. (64,) or (8, 8, 1); "
                f"got {self.input_shape}."
            )
        check_range(self, "input_shape", gt=0, prefix="model")
        check_range(self, "label_smoothing_prob", ge=0, lt=1, prefix="model")

    def with_num_classes(self, num_classes: int) -> ClassificationModelConfig:
        return self.replace(num_classes=num_classes)

    def check_data(self, data: Any) -> None:
        """The examples must be `input_shape` and their labels fit `num_classes`, where the data
        config says what they are (the digits), or the data's files say how many classes there
        are (ImageNet's class folders or its prepared manifest: `classes_in_files`, a directory
        listing). Otherwise a ResNet trains on 8x8 images declared 16x16, or labels 5-9 meet a
        5-class softmax and train towards nothing (or NaN)."""
        from pax_eqx.data.data_config import example_spec

        spec = example_spec(data)
        if spec is not None and tuple(self.input_shape) != spec.input_shape:
            raise ConfigError(
                f"model.input_shape={tuple(self.input_shape)} but data.source={data.source.kind!r} gives examples of "
                f"shape {spec.input_shape}; set --model.input-shape {' '.join(map(str, spec.input_shape))}."
            )
        classes, said = (spec.num_classes, "") if spec is not None else (None, "")
        if classes is None:
            classes, said = data.source.classes_in_files(), ", from its files"
        if classes is not None and self.num_classes < classes:
            raise ConfigError(
                f"model.num_classes={self.num_classes} but data.source={data.source.kind!r} has {classes} classes "
                f"(labels 0..{classes - 1}{said}): labels >= {self.num_classes} would have no logit; set "
                f"--model.num-classes {classes}."
            )

    def example_from_file(self, path: str, data: Any) -> dict[str, Any]:
        """An image (for an image-shaped model) or a `.npy` array of input_shape, normalised as
        the data's eval split is (data.images.example_from_file)."""
        from pax_eqx.data.images import example_from_file

        return example_from_file(path, tuple(self.input_shape), data.source.normalization)

    def build(self, key: PRNGKeyArray) -> ClassificationModel:
        self.ensure_valid()
        return ClassificationModel(self, key=key)


def _build_network(
    network: MLPConfig | ResNetConfig | ViTConfig | CNNConfig, key: PRNGKeyArray, input_shape: tuple[int, ...]
) -> eqx.Module:
    """The network for one example shape: an MLP takes the flattened size, a ResNet the images'
    channels, a ViT or a CNN the images' shape (input_shape = (height, width, channels))."""
    if isinstance(network, (ResNetConfig, ViTConfig, CNNConfig)):
        if len(input_shape) != 3:
            kind = type(network).__name__.removesuffix("Config")
            raise ConfigError(
                f"model.input_shape={input_shape}: a {kind} network takes images (height, width, channels); "
                "use an image data source (e.g. data.source='digits_images') and input_shape (H, W, C)."
            )
        if isinstance(network, (ViTConfig, CNNConfig)):
            return network.build(key, image_shape=input_shape)
        return network.build(key, input_channels=input_shape[-1])
    return network.build(key, input_dims=math.prod(input_shape))


class ClassificationModel(Model):
    network: eqx.Module
    softmax: FullSoftmax
    num_classes: int = eqx.field(static=True)

    input_keys: ClassVar[tuple[str, ...]] = ("inputs", "labels", "weights")
    loss_name: ClassVar[str] = "avg_xent"

    def __init__(self, cfg: ClassificationModelConfig, *, key: PRNGKeyArray):
        k_net, k_head = jax.random.split(key)
        self.network = _build_network(cfg.network, k_net, cfg.input_shape)
        self.softmax = SoftmaxConfig(
            input_dims=self.network.output_dims, num_classes=cfg.num_classes, init=cfg.head_init,
            label_smoothing_prob=cfg.label_smoothing_prob,
        ).build(k_head)  # fmt: skip
        self.num_classes = cfg.num_classes

    def compute_predictions(self, batch: Batch, ctx: Context) -> tuple[Float[Array, "batch classes"], Context]:
        """Logits [batch, classes] of `batch["inputs"]`."""
        features, ctx = call(self.network, jnp.asarray(batch["inputs"], ctx.dtype), ctx, "network")
        return self.softmax.logits(features), ctx

    def compute_loss(self, predictions: Float[Array, "batch classes"], batch: Batch) -> Metrics:
        labels: Int[Array, " batch"] = jnp.asarray(batch["labels"])
        weights = jnp.asarray(batch["weights"], jnp.float32)
        logits = predictions.astype(jnp.float32)
        xent = self.softmax.xent(logits, labels)
        correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
        num = jnp.sum(weights)
        metrics = {
            "avg_xent": weighted_mean(jnp.sum(xent * weights), num),
            "accuracy": weighted_mean(jnp.sum(correct * weights), num),
            "error_rate": weighted_mean(jnp.sum((1.0 - correct) * weights), num),
        }
        if self.num_classes > _TOP_K:
            _, top = jax.lax.top_k(logits, _TOP_K)
            in_top = jnp.any(top == labels[:, None], axis=-1).astype(jnp.float32)
            metrics["accuracy_top5"] = weighted_mean(jnp.sum(in_top * weights), num)
        if self.num_classes <= _MAX_PER_CLASS_METRICS:
            per_class = jax.nn.one_hot(labels, self.num_classes) * weights[:, None]  # [batch, classes]
            counts, hits = jnp.sum(per_class, 0), jnp.sum(per_class * correct[:, None], 0)
            for c in range(self.num_classes):
                metrics[f"accuracy/class_{c}"] = weighted_mean(hits[c], counts[c])
        return metrics

    def per_example_outputs(self, predictions: Float[Array, "batch classes"], batch: Batch) -> dict[str, Array]:
        """The predicted class, the label and the row's weight: what a confusion matrix needs."""
        return {
            "predicted": jnp.argmax(predictions, axis=-1).astype(jnp.int32),
            "label": jnp.asarray(batch["labels"], jnp.int32),
            "weight": jnp.asarray(batch["weights"], jnp.float32),
        }

    def predict(
        self, batch: Batch, ctx: Context | None = None
    ) -> tuple[Int[Array, " batch"], Float[Array, "batch classes"]]:
        """(the most likely class, the class probabilities) of each example, in eval mode unless
        `ctx` says otherwise."""
        ctx = Context(mode=Mode.EVAL) if ctx is None else ctx
        logits, _ = self.compute_predictions(batch, ctx)
        probabilities = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        return jnp.argmax(probabilities, axis=-1), probabilities

    def decode_examples(self, batch: Batch, ctx: Context) -> dict[str, Array]:
        """predicted [batch] (the most likely class), probability [batch] (its softmax
        probability) and, when `batch` has labels, label [batch]."""
        predicted, probabilities = self.predict(batch, ctx)
        out = {
            "predicted": predicted.astype(jnp.int32),
            "probability": jnp.take_along_axis(probabilities, predicted[:, None], axis=-1)[:, 0],
        }
        if "labels" in batch:
            out["label"] = jnp.asarray(batch["labels"], jnp.int32)
        return out
