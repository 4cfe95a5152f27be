"""`python -m pax_eqx.prepare_images`: ImageNet's JPEG folders as ArrayRecord shards of the files.

    python -m pax_eqx.prepare_images --input /data/imagenet --output /data/imagenet_ar \
        [--num-shards 1024] [--val-num-shards 64]

The shards feed `--data.source imagenet_array_record`; what a record holds and why nothing is
decoded or resized is in pax_eqx/data/image_records.py, which writes them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pax_eqx.command_line.entry import OneLineParser
from pax_eqx.config import ConfigError
from pax_eqx.data.image_records import write_image_records


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m pax_eqx.prepare_images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="root of train/<wnid>/*.JPEG (and val/<wnid>/*.JPEG)")
    parser.add_argument("--output", required=True, help="root to write train/ (and val/) shards into")
    parser.add_argument("--num-shards", type=int, default=1024, help="shards of the train split")
    parser.add_argument("--val-num-shards", type=int, default=64, help="shards of the val split")
    args = parser.parse_args(argv)
    try:
        written = write_image_records(args.input, args.output, args.num_shards, args.val_num_shards)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a permission lost while writing: the environment
        print(
            f"error: writing the shards into --output {args.output!r} failed ({e.strerror or e}: {e.filename}); "
            "fix that and rerun (the shards of a split are written again whole).",
            file=sys.stderr,
        )
        return 1
    for folder, manifest in written.items():
        print(f"{args.output}/{folder}: {manifest['num_records']} images of {len(manifest['classes'])} classes in "
              f"{len(manifest['shards'])} shards")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
