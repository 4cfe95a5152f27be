"""The device mesh: axes (stage, data, fsdp, tensor), an ICI shape times a DCN shape.

Pax's ICI_MESH_SHAPE / DCN_MESH_SHAPE: the mesh is the elementwise product of the two, with
the DCN (data-centre network, between slices/hosts) factor on the *outside* of each axis, so
only the slow outer axis crosses DCN. On TPU/GPU slices JAX's `create_hybrid_device_mesh` does
this from the devices' slice indices (or, when each host is a granule, from process indices);
where neither matches the DCN size (one process standing in for several slices in tests) we
lay the same outer/inner order out by hand.

`stage` is the pipeline axis (Pax's ICI_MESH_SHAPE [stage, replica, data, mdl] for pipelined
experiments): optional in the config -- a 3-entry shape is (data, fsdp, tensor) with stage 1 --
and outermost in the mesh, so that with a DCN stage factor only stage-to-stage traffic (one
microbatch's activations per pipeline iteration) crosses the slow network. Every mesh has the
four axes; at stage 1 nothing maps to it and the other three are exactly as before.

Axis types are `Auto` (GSPMD-style): the sharding rules annotate inputs/outputs and a few
activations and XLA propagates the rest (`jax.make_mesh` would default to Explicit axes).
"""

from __future__ import annotations

import math
from typing import Literal

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from pax_eqx.config import Config, ConfigError, check_range, config
from pax_eqx.sharding.device_kinds import DEVICE_KINDS, DeviceKindName

AXES = ("stage", "data", "fsdp", "tensor")


def with_stage(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A (data, fsdp, tensor) shape with stage 1 in front; a 4-entry shape as it is."""
    return (1, *shape) if len(shape) == 3 else tuple(shape)


@config
class MeshConfig(Config):
    """ici_mesh_shape / dcn_mesh_shape: sizes of (data, fsdp, tensor) within and across slices, or
    of (stage, data, fsdp, tensor) for a pipelined model (the stage axis is its num_stages).

    rules: logical-axis -> mesh-axes rules, "logical=axis+axis" ("" on the right = replicated);
      later rules for the same name override earlier ones. See docs/sharding.md.
    device_kind: the accelerator the layout was written for ("" when none: a Pax experiment's
      mesh is written for a topology, e.g. TPU v4 or H100). A real run reads the devices it has;
      `--dry-run` judges fit against this kind's memory unless --dry-run-device-memory-gb is
      given. (`--recommend` plans for --dry-run-device-kind, H100 by default, and names the kind
      in the commands it prints.)
    """

    ici_mesh_shape: tuple[int, ...] = (1, 1, 1)
    dcn_mesh_shape: tuple[int, ...] = (1, 1, 1)
    rules: tuple[str, ...] = ()
    device_kind: DeviceKindName | Literal[""] = ""

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(stage, data, fsdp, tensor): ICI x DCN per axis."""
        ici, dcn = with_stage(self.ici_mesh_shape), with_stage(self.dcn_mesh_shape)
        return tuple(i * d for i, d in zip(ici, dcn))  # type: ignore[return-value]

    @property
    def num_stages(self) -> int:
        """The pipeline axis' size (1 unless a 4-entry shape sets it)."""
        return self.shape[0]

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        for name in ("ici_mesh_shape", "dcn_mesh_shape"):
            shape = getattr(self, name)
            if not isinstance(shape, (tuple, list)) or len(shape) not in (3, 4) or any(not s >= 1 for s in shape):
                raise ConfigError(
                    f"mesh.{name} must be 3 positive sizes (data, fsdp, tensor) or 4 (stage, data, fsdp, "
                    f"tensor), got {shape}."
                )
            check_range(self, name, ge=1, prefix="mesh")  # ints, and not absurdly large
        if self.device_kind not in ("", *DEVICE_KINDS):
            raise ConfigError(
                f"mesh.device_kind={self.device_kind!r} is not a known accelerator; use one of "
                f"{', '.join(sorted(DEVICE_KINDS))}, or '' (none)."
            )

    def check_devices(self, num_devices: int) -> None:
        """ConfigError unless the mesh has exactly `num_devices` devices (those of the run)."""
        if self.num_devices != num_devices:
            raise ConfigError(
                f"mesh.ici_mesh_shape {self.ici_mesh_shape} x mesh.dcn_mesh_shape {self.dcn_mesh_shape} = "
                f"{self.num_devices} devices, but {num_devices} are available; choose shapes whose "
                f"product is {num_devices}."
            )


def build_mesh(cfg: MeshConfig, devices: list | None = None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    cfg.check_devices(len(devices))
    ici, dcn = with_stage(cfg.ici_mesh_shape), with_stage(cfg.dcn_mesh_shape)
    if math.prod(dcn) == 1:
        grid = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    elif len({getattr(d, "slice_index", 0) for d in devices}) == math.prod(dcn):
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    elif len({d.process_index for d in devices}) == math.prod(dcn):
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True)
    else:
        grid = _outer_inner_grid(devices, ici, dcn)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def _outer_inner_grid(devices: list, ici: tuple[int, ...], dcn: tuple[int, ...]) -> np.ndarray:
    """Devices in process order, split into DCN granules (outer) of ICI blocks (inner)."""
    grid = np.asarray(devices, dtype=object).reshape(tuple(dcn) + tuple(ici))
    n = len(ici)
    order = [k for i in range(n) for k in (i, n + i)]  # (d0, i0, d1, i1, ...)
    return grid.transpose(order).reshape([d * i for d, i in zip(dcn, ici)])
