"""`--data.source imagenet_folder --data.path /data/imagenet`: ImageNet's JPEGs at
`path`/train/<wnid>/ and `path`/val/<wnid>/, any size, decoded when read and cropped as Pax crops
them (imagenet_source.py). The shared base `ImagenetSource` also serves imagenet_array_record."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import imagenet_source
from pax_eqx.data.data_source import ExampleSpec, ImageSource


@config
class ImagenetSource(ImageSource):
    """path: the root of both splits (the eval split is always `path`/val). image_shape: the
    model's square input (S, S, C), C = 1 or 3, which every image is cropped to (required)."""

    path: str = ""

    def validate(self) -> None:
        super().validate()
        if not self.image_shape:
            raise ConfigError(
                f"data.image_shape is empty; {self.flag} crops every image to that size (--data.image-shape 224 224 3)."
            )
        imagenet_source.check_image_shape(self.image_shape, self.kind)
        if self.augment.crop_padding:
            raise ConfigError(
                f"data.augment.crop_padding={self.augment.crop_padding} would do nothing: {self.flag} crops with "
                "Inception's random-resized crop (train) and the central crop (eval); remove it."
            )

    def inert_fields(self) -> dict[str, str]:
        return super().inert_fields() | {
            "augment.crop_padding": (
                f"{self.flag} crops with Inception's random-resized crop (train) and the central crop (eval); "
                "crop_padding is the padded crop of pre-resized images"
            )
        }

    def draws_from_seed(self, split, data) -> bool:
        return split == "train"  # the random-resized crop

    def example_spec(self) -> ExampleSpec:
        return ExampleSpec(tuple(self.image_shape), None)

    def records(self, split):
        """The split's (index, label, encoded) source and the class names."""
        raise NotImplementedError(f"{type(self).__name__} does not say where its images are.")

    def check(self, data, files: bool) -> None:
        super().check(data, files)
        if files:
            self.records("train")

    def check_decodable(self, data, split) -> None:
        channels = imagenet_source.check_image_shape(self.image_shape, self.kind)[2]
        imagenet_source.check_decodable(self.records(split)[0], channels, self.path, split)

    def build_input(self, data, split, tokenizer, shard):
        import grain

        items = grain.MapDataset.source(self.records(split)[0])
        shape = imagenet_source.check_image_shape(self.image_shape, self.kind)
        return imagenet_source.imagenet_input(items, shape, self.augment, getattr(data, split), split, shard, self.path)


@config
class ImagenetFolderSource(ImagenetSource):
    """ImageNet's JPEG files in class folders."""

    kind: ClassVar[str] = "imagenet_folder"

    def classes_in_files(self) -> int | None:
        try:  # the train split's class folders, without listing their files
            return len(imagenet_source.class_names(imagenet_source.split_folder(self.path, "train"), "data.path"))
        except ConfigError:  # no data (yet): `check` names the problem where files are read
            return None

    def check(self, data, files: bool) -> None:
        if files:  # the train split's class folders, without listing their files
            imagenet_source.class_names(imagenet_source.split_folder(self.path, "train"), "data.path")
        ImageSource.check(self, data, files)

    def records(self, split):
        return imagenet_source.folder_source(self.path, split)
