"""`--data.source imagenet_array_record --data.path /data/imagenet_ar`: ImageNet's file bytes as
ArrayRecord shards at `path`/train/ and `path`/val/ (written by python -m pax_eqx.prepare_images),
read and cropped as imagenet_folder's (imagenet_source.py)."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import imagenet_source
from pax_eqx.data.sources.imagenet_folder import ImagenetSource


@config
class ImagenetArrayRecordSource(ImagenetSource):
    """ImageNet prepared into ArrayRecord shards (checked against their manifest)."""

    kind: ClassVar[str] = "imagenet_array_record"

    def classes_in_files(self) -> int | None:
        try:  # the train split's manifest lists the classes
            train = imagenet_source.split_folder(self.path, "train")
            return len(imagenet_source.read_images_manifest(train, "data.path")["classes"])
        except ConfigError:  # no data (yet): `check` names the problem where files are read
            return None

    def records(self, split):
        return imagenet_source.records_source(self.path, split)
