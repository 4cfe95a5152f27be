"""`--data.source digits_images`: the same digits as [8, 8, 1] images, the same split (images.py)."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import digits, images
from pax_eqx.data.data_source import ExampleSpec, HeldOutSplit, ImageSource
from pax_eqx.data.sources.digits import check_digits


@config
class DigitsImagesSource(ImageSource, HeldOutSplit):
    """scikit-learn's digits as 8x8x1 images (the digits_resnet and digits_vit experiments)."""

    kind: ClassVar[str] = "digits_images"

    def validate(self) -> None:
        super().validate()
        if self.image_shape and tuple(self.image_shape) != images.DIGITS_SHAPE:
            raise ConfigError(
                f"data.image_shape={tuple(self.image_shape)} but data.source='digits_images' gives "
                f"{images.DIGITS_SHAPE} images; set data.image_shape to {images.DIGITS_SHAPE} or leave it empty."
            )

    def check(self, data, files: bool) -> None:
        super().check(data, files)
        check_digits(self, data, files)

    def example_spec(self) -> ExampleSpec:
        return ExampleSpec(images.DIGITS_SHAPE, digits.NUM_CLASSES)

    def split_examples(self, split):
        return images.digits_image_examples(split, self.eval_fraction)
