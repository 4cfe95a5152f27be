# Sourced first by the GPU lease scripts (`LEASE=name; . benchmarks/sweeps/lease_setup.sh`):
# results go to $OUT (the device tool's folder that comes back, or runs/$LEASE), Python's output
# is unbuffered so a call cut short keeps every line, XLA may take 95% of the GPU's memory, and
# $OUT/machine.txt says which GPU, driver and jax the numbers come from.
set -u
OUT=${OUT:-runs/$LEASE}
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 PYTHONUNBUFFERED=1
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; $PY -c "import jax; print('jax', jax.__version__, jax.devices())"; } 2>&1 | tee "$OUT/machine.txt"
