"""`--data.source images_npz --data.path train.npz`: a .npz file of `images` [N, H, W(, C)] and
`labels` [N]; the eval split is `eval_path`, or the last `eval_fraction` of a fixed shuffle."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import images
from pax_eqx.data.data_source import FileSource, ImageSource


@config
class ImagesNpzSource(ImageSource, FileSource):
    """Images and labels in one .npz file at `path`."""

    kind: ClassVar[str] = "images_npz"
    reads: ClassVar[str] = "a .npz file"

    def check(self, data, files: bool) -> None:
        super().check(data, files)
        if files:
            require_path(self)
            images.npz_file(self.path, "data.path")
            if self.eval_path:
                images.npz_file(self.eval_path, "data.eval_path")

    def split_examples(self, split):
        spec, field, held_out_split = self.split_files(split)
        return images.npz_examples(spec, field, held_out_split, self.eval_fraction)


def require_path(source: FileSource) -> None:
    """ConfigError for an empty data.path of an image source that reads files."""
    if not source.path.strip():
        raise ConfigError(
            f"data.path is empty; {source.flag} reads {source.reads} there (--data.path ...), or train on "
            "random images of data.image_shape without files: --data.source synthetic_images."
        )
