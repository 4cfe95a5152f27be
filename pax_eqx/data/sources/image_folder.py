"""`--data.source image_folder --data.path root`: image files `root/<class_name>/*.png|jpg|jpeg`
decoded with Pillow; the eval split as images_npz's (an eval folder keeps the train class ids)."""

from __future__ import annotations

from typing import ClassVar

from pax_eqx.config import ConfigError, config
from pax_eqx.data import images
from pax_eqx.data.data_source import FileSource, ImageSource
from pax_eqx.data.sources.images_npz import require_path


@config
class ImageFolderSource(ImageSource, FileSource):
    """A folder of class folders of images at `path`."""

    kind: ClassVar[str] = "image_folder"
    reads: ClassVar[str] = "a folder root/<class_name>/*.png|jpg"

    def check(self, data, files: bool) -> None:
        super().check(data, files)
        if not files:
            return
        require_path(self)
        train_classes = list(images.folder_files(self.path, "data.path"))
        if self.eval_path:
            unknown = [c for c in images.folder_files(self.eval_path, "data.eval_path") if c not in train_classes]
            if unknown:
                raise ConfigError(
                    f"data.eval_path={self.eval_path!r} has class folder(s) {unknown} that data.path lacks; the "
                    f"classes are {train_classes}."
                )

    def split_examples(self, split):
        spec, field, held_out_split = self.split_files(split)
        names = list(images.folder_files(self.path, "data.path")) if field == "data.eval_path" else None
        return images.image_folder_examples(spec, field, held_out_split, self.eval_fraction, names)
