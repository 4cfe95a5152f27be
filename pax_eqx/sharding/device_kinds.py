"""The accelerators the dry run and `--dry-run --recommend` plan for: peak matmul rate, memory and
the two networks. `mesh.device_kind` names the one an experiment's layout was written for.

Every number is a vendor's published figure, with its source beside it; where a vendor publishes
none the value is marked ASSUMED and says what it stands in for. Bandwidths are per device and
per direction (a ring collective moves its bytes one way round), in bytes per second:

- H100 SXM (NVIDIA H100 Tensor Core GPU datasheet, 2023; DGX H100 user guide): 989.4 TFLOP/s dense
  bf16 (the datasheet's 1,979 is "with sparsity"), 80 GB HBM3 at 3.35 TB/s, NVLink 4 at 900 GB/s
  bidirectional per GPU (450 GB/s each way) joining the 8 GPUs of a host; between hosts one 400 Gb/s
  ConnectX-7 InfiniBand port per GPU (DGX H100: 8 for the compute fabric), 50 GB/s.
- A100 40GB SXM (NVIDIA A100 Tensor Core GPU datasheet, 2021; Google Cloud's a2-megagpu-16g, the
  "8 hosts * 16 A100s" Paxml's pipelined lm_cloud configs were written for): 312 TFLOP/s dense bf16,
  40 GB HBM2 at 1,555 GB/s, NVLink 3 at 600 GB/s bidirectional per GPU (300 GB/s each way) through
  NVSwitch joining the 16 GPUs of a host; between hosts the VM's 100 Gb/s, so 100 / 16 Gb/s a GPU
  (ASSUMED: Google's page gives the VM's bandwidth, not a GPU's share).
- TPU v4 (cloud.google.com/tpu/docs/v4): 275 TFLOP/s bf16, 32 GiB HBM2 at 1,200 GB/s, 4,096 chips a
  pod with 1.1 PB/s all-reduce bandwidth, so 1.1e15 / 4096 = 268.6 GB/s a chip; 4 chips a host
  (a v4-8 VM). DCN: the page gives none; ASSUMED v5p's 50 Gb/s a chip.
- TPU v5e (cloud.google.com/tpu/docs/v5e): 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, ICI 400 GB/s
  bidirectional a chip (200 GB/s each way; also 51.2 TB/s all-reduce over 256 chips), 8 chips a
  host with 2 x 100 Gb/s NICs, so 25 Gb/s (3.125 GB/s) of DCN a chip.
- TPU v5p (cloud.google.com/tpu/docs/v5p): 459 TFLOP/s bf16, 95 GiB HBM2e at 2,765 GB/s, ICI
  1,200 GB/s bidirectional a chip (600 GB/s each way), DCN 50 Gb/s (6.25 GB/s) a chip, 4 chips a
  host.

`matmul_efficiency` is not a datasheet number: it is the share of peak that large bf16 matmuls
reach in a whole train step. For the H100 it is fitted to one measurement, gpt3_xl's 625.7 ms step
on one H100 (docs/performance.md; the recommend's time model predicts that step with it, see
tests/sharding/test_recommend.py); the TPUs have no measurement here and take the same 0.60
(ASSUMED). It sets the predicted times' scale, not the order of the layouts.

`fused_attention`: attention "auto" runs cuDNN's flash kernel on the H100 (no S x S scores in memory)
and XLA's attention on a TPU; the TPUs are planned with `attention.implementation xla`.

`ici_is_host`: on a GPU the fast network (NVLink) joins one host's devices and everything
between hosts crosses the slow one; on a TPU the ICI joins a whole slice, many hosts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

GB = 1e9


@dataclass(frozen=True)
class DeviceKind:
    """One accelerator: what the time model and the memory default read."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_gib: float
    hbm_bytes_per_s: float
    ici_bytes_per_s: float  # per device, each way
    dcn_bytes_per_s: float  # per device, each way
    devices_per_host: int
    ici_is_host: bool
    fused_attention: bool  # cuDNN's flash attention runs ("auto" picks it); on a TPU attention is XLA's
    matmul_efficiency: float = 0.60


DeviceKindName = Literal["h100", "a100", "tpu_v4", "tpu_v5e", "tpu_v5p"]

DEVICE_KINDS: dict[str, DeviceKind] = {
    "a100": DeviceKind(
        "A100 40GB SXM (NVSwitch, 16 a host)",
        312e12,
        40.0 * 1e9 / 2**30,
        1555 * GB,
        300 * GB,
        100 / 16 / 8 * GB,
        16,
        True,
        True,
    ),  # fmt: skip
    "h100": DeviceKind("H100 SXM (NVLink + InfiniBand)", 989.4e12, 80.0, 3350 * GB, 450 * GB, 50 * GB, 8, True, True),
    "tpu_v4": DeviceKind("TPU v4", 275e12, 32.0, 1200 * GB, 1.1e15 / 4096, 50 / 8 * GB, 4, False, False),
    "tpu_v5e": DeviceKind("TPU v5e", 197e12, 16.0 * 1e9 / 2**30, 819 * GB, 200 * GB, 25 / 8 * GB, 8, False, False),
    "tpu_v5p": DeviceKind("TPU v5p", 459e12, 95.0, 2765 * GB, 600 * GB, 50 / 8 * GB, 4, False, False),
}
assert set(DEVICE_KINDS) == set(get_args(DeviceKindName)), "a device kind is named in one place but not the other"
