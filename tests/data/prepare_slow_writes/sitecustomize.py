"""Test scaffolding for the kill -9 test of prepare_data (tests/data/test_prepare_data.py).

On this machine a shard of the test corpus is written in about a millisecond, so all of them
land within a few milliseconds and a kill "mid-run" could not be aimed. With this directory on
PYTHONPATH, every Python process of the run (the driver and each Beam worker, which inherit the
environment) waits PAX_EQX_TEST_SHARD_DELAY_S seconds before writing each shard: the kill then
lands while shards are being written. Nothing else changes; nothing outside the test uses it.
"""

import os

_DELAY = float(os.environ.get("PAX_EQX_TEST_SHARD_DELAY_S", "0") or 0)
if _DELAY > 0:
    import functools
    import time

    from pax_eqx.data.prepare import shards

    _write = shards.write_shard

    @functools.wraps(_write)
    def _slow_write_shard(*args, **kwargs):
        time.sleep(_DELAY)
        return _write(*args, **kwargs)

    shards.write_shard = _slow_write_shard
