"""Schedules: values at chosen steps against the closed-form math and Pax's formulas, by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.learners import LearnerConfig, ScheduleConfig, build_schedule, learning_rate_fn
from pax_eqx.learners import linear_rampup_exponential_decay as pax_lred
from pax_eqx.learners.schedules import (
    ConstantSchedule,
    CosineSchedule,
    ExponentialSchedule,
    LinearSchedule,
    PiecewiseSchedule,
    RsqrtSchedule,
)

STEPS = [0, 1, 5, 9, 10, 15, 19, 20, 21, 40, 60, 99, 100, 101, 500]


def values(schedule, steps=STEPS):
    return np.array([float(schedule(jnp.asarray(s, jnp.int32))) for s in steps])


def piecewise(step, *, warmup, start, peak, decay):
    """Ramp 0 -> peak over warmup, hold until start, then decay(t = step - start)."""
    if step < warmup:
        return peak * step / warmup
    if step < start:
        return peak
    return decay(step - start)


def test_constant_with_and_without_warmup():
    assert np.allclose(values(build_schedule(ConstantSchedule(), 3e-4)), 3e-4)
    got = values(build_schedule(ConstantSchedule(warmup_steps=10, max=2.0), 0.5))
    want = [piecewise(s, warmup=10, start=10, peak=1.0, decay=lambda t: 1.0) for s in STEPS]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cosine_with_warmup_hold_and_floor():
    cfg = CosineSchedule(warmup_steps=10, decay_start=20, decay_end=100, min_ratio=0.1, max=2.0)
    peak, r, span = 2.0 * 1e-3, 0.1, 80

    def cosine(t):
        t = min(t, span)
        return peak * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * t / span)))

    want = [piecewise(s, warmup=10, start=20, peak=peak, decay=cosine) for s in STEPS]
    np.testing.assert_allclose(values(build_schedule(cfg, 1e-3)), want, rtol=1e-5)
    assert values(build_schedule(cfg, 1e-3), [100, 10_000]) == pytest.approx([peak * r] * 2, rel=1e-5)


def test_cosine_without_hold_equals_optax_warmup_cosine():
    cfg = CosineSchedule(warmup_steps=10, decay_end=100, min_ratio=0.1)
    ours = learning_rate_fn(LearnerConfig(learning_rate=1e-3, schedule=cfg))
    theirs = optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100, end_value=1e-4)
    np.testing.assert_allclose(values(ours), values(theirs), rtol=1e-6)


def test_linear_decay():
    cfg = LinearSchedule(warmup_steps=10, decay_end=60, min_ratio=0.25)
    want = [piecewise(s, warmup=10, start=10, peak=1.0, decay=lambda t: 1 - 0.75 * min(t, 50) / 50) for s in STEPS]
    np.testing.assert_allclose(values(build_schedule(cfg)), want, rtol=1e-6)


def test_exponential_decay_is_geometric_between_max_and_floor():
    cfg = ExponentialSchedule(warmup_steps=10, decay_end=100, min_ratio=0.01)
    want = [piecewise(s, warmup=10, start=10, peak=1.0, decay=lambda t: 0.01 ** (min(t, 90) / 90)) for s in STEPS]
    np.testing.assert_allclose(values(build_schedule(cfg)), want, rtol=1e-5)


def test_pax_linear_rampup_exponential_decay():
    """Pax: Linear((0, 0), (warmup, max)) | Linear hold | Exponential((0, max), (end - start, max * min_ratio))."""
    warmup, start, end, min_ratio, peak = 10, 20, 100, 0.05, 3.0
    cfg = pax_lred(warmup_steps=warmup, decay_start=start, decay_end=end, min_ratio=min_ratio, max=peak)
    assert cfg.kind == "exponential" and cfg.max == peak

    def pax(step):
        if step < warmup:
            return 0.0 + (peak - 0.0) * step / warmup
        if step < start:
            return peak
        x = min(step - start, end - start)  # Pax's Linear holds y1 past x1
        log_y = math.log(peak) + (x / (end - start)) * (math.log(peak * min_ratio) - math.log(peak))
        return math.exp(log_y)

    np.testing.assert_allclose(values(build_schedule(cfg)), [pax(s) for s in STEPS], rtol=1e-5)


def test_pax_linear_rampup_exponential_decay_without_warmup_or_hold():
    cfg = pax_lred(decay_end=50, min_ratio=0.5, max=1.0)
    np.testing.assert_allclose(values(build_schedule(cfg), [0, 25, 50, 80]), [1.0, 0.5**0.5, 0.5, 0.5], rtol=1e-5)


def test_rsqrt_matches_pax_linear_rampup_sqrt_decay_after_step_zero():
    cfg = RsqrtSchedule(warmup_steps=16, max=2.0)
    steps = [1, 4, 15, 16, 17, 64, 1000]

    def pax(step):  # praxis LinearRampupSqrtDecay(peak=2, warmup_steps=16)
        step = max(step, 1)
        return 2.0 * min(step / 16, math.sqrt(16 / step))

    np.testing.assert_allclose(values(build_schedule(cfg), steps), [pax(s) for s in steps], rtol=1e-6)
    assert float(build_schedule(cfg)(0)) == 0.0


def test_rsqrt_with_hold():
    cfg = RsqrtSchedule(warmup_steps=4, decay_start=25)
    np.testing.assert_allclose(values(build_schedule(cfg), [2, 10, 25, 100]), [0.5, 1.0, 1.0, 0.5], rtol=1e-6)


def test_decay_start_zero_means_after_warmup():
    a = LinearSchedule(warmup_steps=10, decay_end=60)
    b = a.replace(decay_start=10)
    assert_same_math(values(build_schedule(a)), values(build_schedule(b)))


def test_schedule_runs_under_jit_with_traced_step():
    fn = learning_rate_fn(LearnerConfig(schedule=CosineSchedule(warmup_steps=5, decay_end=50)))
    jitted = jax.jit(fn)
    steps = [0, 3, 5, 30, 60]
    assert_same_math([jitted(jnp.int32(s)) for s in steps], [fn(s) for s in steps])
    assert all(jitted(jnp.int32(s)).dtype == jnp.float32 for s in steps)


KINDS = {c.kind: c for c in (ConstantSchedule, CosineSchedule, LinearSchedule, ExponentialSchedule, RsqrtSchedule)}


@pytest.mark.parametrize(
    "kind, fields, match",
    [
        ("cosine", dict(warmup_steps=10, decay_end=10), "decay_end=10"),
        ("cosine", dict(warmup_steps=10, decay_start=5), "decay_start=5"),
        ("constant", dict(warmup_steps=-1), "warmup_steps must be >= 0"),
        ("exponential", dict(decay_end=10, min_ratio=0.0), "min_ratio must be > 0"),
        ("cosine", dict(decay_end=10, min_ratio=1.5), "min_ratio must be in"),
        ("rsqrt", dict(), "rsqrt"),
        ("constant", dict(max=0.0), "max must be > 0"),
    ],
)
def test_bad_schedules_name_the_field(kind, fields, match):
    with pytest.raises(ConfigError, match=match):
        KINDS[kind](**fields)


def test_a_schedule_choice_from_json_names_its_kind():
    from pax_eqx.config import _from_jsonable

    with pytest.raises(ConfigError, match="warmup_cosine.*Did you mean 'cosine'"):
        _from_jsonable(ScheduleConfig, {"kind": "warmup_cosine"}, "learner.schedule")
    # An older config.json's flat schedule: the fields its kind never read are dropped.
    old = {"kind": "cosine", "warmup_steps": 5, "decay_start": 0, "decay_end": 50, "min_ratio": 0.1, "max": 1.0,
           "boundaries": [], "values": []}  # fmt: skip
    assert _from_jsonable(ScheduleConfig, old, "s") == CosineSchedule(warmup_steps=5, decay_end=50, min_ratio=0.1)


@pytest.mark.parametrize(
    "kind, fields, named",
    [
        ("constant", dict(decay_end=100), "decay_end"),
        ("constant", dict(min_ratio=0.1), "min_ratio"),
        ("constant", dict(warmup_steps=5, decay_start=10), "decay_start"),
        ("rsqrt", dict(warmup_steps=10, decay_end=100), "decay_end"),
        ("rsqrt", dict(warmup_steps=10, min_ratio=0.5), "min_ratio"),
        ("cosine", dict(decay_end=10, boundaries=(5,)), "boundaries"),
    ],
)
def test_a_field_the_kind_never_reads_is_not_a_field_of_it(kind, fields, named):
    with pytest.raises(ConfigError, match=f"has no field {named!r}"):
        KINDS[kind](**fields)


def test_piecewise_is_paxs_linear_rampup_piecewise_constant():
    """Pax's LinearRampupPiecewiseConstant(boundaries=[w, b0, b1], values=[v, v0, v1]): a ramp from
    0 to v over w steps, then v until b0, v0 until b1, v1 after; written out with NumPy."""
    w, b0, b1, v, v0, v1 = 10, 25, 40, 1.0, 0.1, 0.001
    cfg = PiecewiseSchedule(warmup_steps=w, max=v, boundaries=(b0, b1), values=(v0 / v, v1 / v))
    schedule = build_schedule(cfg, 0.2)
    steps = np.arange(0, 60)
    expected = 0.2 * np.where(steps < w, v * steps / w, np.where(steps < b0, v, np.where(steps < b1, v0, v1)))
    np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=1e-6, atol=1e-9)


def test_piecewise_fields_are_checked_and_unused_elsewhere():
    with pytest.raises(ConfigError, match="one value per boundary"):
        PiecewiseSchedule(boundaries=(5, 9), values=(0.1,))
    with pytest.raises(ConfigError, match="must increase"):
        PiecewiseSchedule(warmup_steps=10, boundaries=(5,), values=(0.1,))
