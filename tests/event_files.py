"""What the TensorBoard event files of a run hold, read without TensorBoard (tensorboardX's protos)."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX.proto import event_pb2


def scalar_tags(directory: Path) -> set[str]:
    """The tags of every scalar in the TensorBoard event files of `directory`."""
    tags = set()
    for path in directory.glob("events.out.tfevents.*"):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[offset + 12 : offset + 12 + length])
            tags |= {v.tag for v in event.summary.value}
            offset += 16 + length
    return tags
