"""`--data.source synthetic_images --data.image-shape 224 224 3`: `num_synthetic_examples` random
images of `image_shape` per split, label 0 (images.py): an image model's shapes without a
dataset, for speed and plumbing."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import images
from pax_eqx.data.data_source import ExampleSpec, GeneratedExamples, ImageSource


@config
class SyntheticImagesSource(ImageSource, GeneratedExamples):
    """Random images of `image_shape` (required)."""

    kind: ClassVar[str] = "synthetic_images"

    def validate(self) -> None:
        super().validate()
        if not self.image_shape:
            raise ConfigError(
                "data.image_shape is empty; data.source='synthetic_images' makes random images of that shape "
                "(--data.image-shape 224 224 3)."
            )

    def example_spec(self) -> ExampleSpec:
        return ExampleSpec(tuple(self.image_shape), None)

    def split_examples(self, split):
        return images.synthetic_image_examples(self.num_synthetic_examples, self.image_shape, split)
