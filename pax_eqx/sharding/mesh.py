"""The device mesh: axes (stage, data, fsdp, context, tensor), an ICI shape times a DCN shape.

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
five axes; at stage 1 nothing maps to it and the others are exactly as before.

`context` is context parallelism: the logical `seq` axis maps onto it, so each of its devices
holds a slice of every row's tokens and attention gathers the keys and values
(docs/long_context.md). It is named only by a 5-entry shape, (stage, data, fsdp, context,
tensor): the mesh's own order, outermost first. A 3- or 4-entry shape (what every job dir
written before it holds) has context 1 and means what it meant. It sits inside fsdp and outside
tensor: its all-gathers of K/V run on every layer's critical path, as tensor's all-reduces do
(so both want the fastest links), but tensor's [tokens, model] all-reduces are the larger.

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

AXES = ("stage", "data", "fsdp", "context", "tensor")
# What each accepted length of a mesh shape names, in the mesh's order; the axes left out are 1.
SHAPE_FORMS = {
    3: ("data", "fsdp", "tensor"),
    4: ("stage", "data", "fsdp", "tensor"),
    5: AXES,
}


def full_shape(shape: tuple[int, ...]) -> tuple[int, int, int, int, int]:
    """A 3-, 4- or 5-entry mesh shape (`SHAPE_FORMS`) as the five sizes of `AXES`, 1 where the
    short form leaves an axis out: (d, f, t) -> (1, d, f, 1, t); (s, d, f, t) -> (s, d, f, 1, t)."""
    sizes = dict(zip(SHAPE_FORMS[len(shape)], shape))
    return tuple(int(sizes.get(axis, 1)) for axis in AXES)  # type: ignore[return-value]


def shortest_form(*shapes: tuple[int, ...]) -> tuple[str, ...]:
    """The axes of the shortest form in `SHAPE_FORMS` that holds every one of `shapes` (full
    5-entry shapes; the axes it leaves out are 1 in each): how a layout is printed and passed as
    flags, so a layout without a context or stage axis reads as it always did."""
    for length in sorted(SHAPE_FORMS):
        names = SHAPE_FORMS[length]
        if all(size == 1 for shape in shapes for axis, size in zip(AXES, shape) if axis not in names):
            return names
    return AXES


def in_form(shape: tuple[int, ...], names: tuple[str, ...]) -> tuple[int, ...]:
    """The sizes of a full 5-entry `shape` for the axes `names` (a `shortest_form`)."""
    return tuple(shape[AXES.index(axis)] for axis in names)


@config
class MeshConfig(Config):
    """ici_mesh_shape / dcn_mesh_shape: sizes of (data, fsdp, tensor) within and across slices, or
    of (stage, data, fsdp, tensor) for a pipelined model (the stage axis is its num_stages), or
    of (stage, data, fsdp, context, tensor) to split the sequence over `context` (context
    parallelism; docs/long_context.md). The two may have different lengths.

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
    def shape(self) -> tuple[int, int, int, int, int]:
        """(stage, data, fsdp, context, tensor): ICI x DCN per axis."""
        ici, dcn = full_shape(self.ici_mesh_shape), full_shape(self.dcn_mesh_shape)
        return tuple(i * d for i, d in zip(ici, dcn))  # type: ignore[return-value]

    @property
    def sizes(self) -> dict[str, int]:
        """{mesh axis: size} for every axis of `AXES`."""
        return dict(zip(AXES, self.shape))

    @property
    def num_stages(self) -> int:
        """The pipeline axis' size (1 unless a 4- or 5-entry shape sets it)."""
        return self.shape[0]

    @property
    def context(self) -> int:
        """The context axis' size: the ways each row's tokens are split (1 unless a 5-entry shape sets it)."""
        return self.shape[3]

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        for name in ("ici_mesh_shape", "dcn_mesh_shape"):
            shape = getattr(self, name)
            if not isinstance(shape, (tuple, list)) or len(shape) not in SHAPE_FORMS or any(not s >= 1 for s in shape):
                raise ConfigError(
                    f"mesh.{name} must be 3 positive sizes (data, fsdp, tensor), 4 (stage, data, fsdp, tensor) "
                    f"or 5 (stage, data, fsdp, context, tensor), got {shape}."
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
    ici, dcn = full_shape(cfg.ici_mesh_shape), full_shape(cfg.dcn_mesh_shape)
    if math.prod(dcn) == 1:
        grid = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    elif len({getattr(d, "slice_index", 0) for d in devices}) == math.prod(dcn):
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    elif len({d.process_index for d in devices}) == math.prod(dcn):
        grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=True)
    else:
        grid = _outer_inner_grid(devices, ici, dcn)
    _check_context_within_processes(grid, cfg)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def _check_context_within_processes(grid: np.ndarray, cfg: MeshConfig) -> None:
    """ConfigError where one context group (the devices that split the same rows' tokens) spans
    several processes: each host reads its own rows (data/host_sharding.py), and the devices of one
    group must see the same rows. A DCN context factor is for a mesh one process drives (and for
    the dry run's plans); across hosts, context stays on ICI."""
    axis = AXES.index("context")
    if grid.shape[axis] == 1:
        return
    processes = np.vectorize(lambda d: getattr(d, "process_index", 0), otypes=[int])(grid)
    if (processes != processes.take([0], axis=axis)).any():
        raise ConfigError(
            f"mesh.ici_mesh_shape {cfg.ici_mesh_shape} x mesh.dcn_mesh_shape {cfg.dcn_mesh_shape}: the context axis "
            f"({cfg.context} devices) crosses processes, but each process reads its own rows and one context group "
            "must split the same rows; put the context factor in mesh.ici_mesh_shape (within a host) and split "
            "the batch over DCN instead."
        )


def _outer_inner_grid(devices: list, ici: tuple[int, ...], dcn: tuple[int, ...]) -> np.ndarray:
    """Devices in process order, split into DCN granules (outer) of ICI blocks (inner)."""
    grid = np.asarray(devices, dtype=object).reshape(tuple(dcn) + tuple(ici))
    n = len(ici)
    order = [k for i in range(n) for k in (i, n + i)]  # (d0, i0, d1, i1, ...)
    return grid.transpose(order).reshape([d * i for d, i in zip(dcn, ici)])
