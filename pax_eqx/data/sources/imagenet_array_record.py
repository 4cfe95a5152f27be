"""`--data.source imagenet_array_record --data.path /data/imagenet_ar`: ImageNet's file bytes as
ArrayRecord shards at `path`/train/ and `path`/val/ (written by python -m pax_eqx.prepare_images),
read and cropped as imagenet_folder's (imagenet_source.py)."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import config
from pax_eqx.data import imagenet_source
from pax_eqx.data.sources.imagenet_folder import ImagenetSource


@config
class ImagenetArrayRecordSource(ImagenetSource):
    """ImageNet prepared into ArrayRecord shards (checked against their manifest)."""

    kind: ClassVar[str] = "imagenet_array_record"

    def records(self, split):
        return imagenet_source.records_source(self.path, split)
