"""The pipeline schedules against running the layers one after another.

A toy stack (h <- tanh(h @ w_l + b_l) * scale, per example) is applied to a batch directly and by
`run_pipeline` with GPipe and circular schedules of several sizes: outputs, gradients, the
per-layer summaries and the aux losses must agree. The stage function also records which layer
ran, so a wrong layer-to-stage assignment cannot hide behind a symmetric result.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerances import assert_same_math

from pax_eqx.config import ConfigError
from pax_eqx.layers.pipeline import PipelineConfig, run_pipeline

L, B, D = 8, 12, 5


def _units():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "w": jax.random.normal(k1, (L, D, D)) / np.sqrt(D),
        "b": jax.random.normal(k2, (L, D)) * 0.1,
        "index": jnp.arange(L, dtype=jnp.float32),  # which layer this is
    }


def _layer(unit, h, scale):
    out = jnp.tanh(h @ unit["w"] + unit["b"]) * scale[:, None]
    summary = {"mean_in": jnp.mean(h), "index": unit["index"]}
    return out, summary, {"l2": jnp.mean(out**2) * (1.0 + unit["index"])}


def _stage(stage_units, round_, h, inputs, key):
    def body(h, unit):
        out, summary, aux = _layer(unit, h, inputs["scale"])
        return out, (summary, aux)

    h, (summaries, aux) = jax.lax.scan(body, h, jax.tree.map(lambda a: a[round_], stage_units))
    return h, summaries, {name: jnp.sum(value) for name, value in aux.items()}


def _sequential(units, x, scale, m):
    """Every layer on the whole batch; summaries/aux as means over the m (strided) microbatches."""
    summaries, aux = {"mean_in": [], "index": []}, 0.0
    for i in range(L):
        unit = jax.tree.map(lambda a, i=i: a[i], units)
        out, summary, layer_aux = _layer(unit, x, scale)
        # A microbatch's mean of h is the mean over its rows j::m; the pipeline averages those.
        summaries["mean_in"].append(jnp.mean(jnp.stack([jnp.mean(x[j::m]) for j in range(m)])))
        summaries["index"].append(summary["index"])
        aux += jnp.mean(jnp.stack([jnp.mean(out[j::m] ** 2) for j in range(m)])) * (1.0 + i)
        x = out
    return x, {k: jnp.stack(v) for k, v in summaries.items()}, aux


@pytest.mark.parametrize("stages, microbatches, repeat", [(2, 1, 1), (2, 4, 1), (4, 3, 1), (4, 6, 1), (2, 2, 2),
                                                          (2, 3, 2), (4, 4, 2), (2, 6, 4)])  # fmt: skip
def test_schedule_computes_the_layers_in_order(stages, microbatches, repeat):
    cfg = PipelineConfig(num_stages=stages, num_microbatches=microbatches, circular_repeat=repeat)
    units = _units()
    x = jax.random.normal(jax.random.key(1), (B, D))
    scale = jnp.linspace(0.5, 1.5, B)
    got, summaries, aux = run_pipeline(_stage, units, x, {"scale": scale}, None, cfg)
    want, want_summaries, want_aux = _sequential(units, x, scale, microbatches)
    assert_same_math(got, want)
    np.testing.assert_array_equal(summaries["index"], np.arange(L))
    assert_same_math(summaries["mean_in"], want_summaries["mean_in"])
    assert_same_math(aux["l2"], want_aux)


@pytest.mark.parametrize("stages, microbatches, repeat", [(2, 4, 1), (4, 4, 2)])
def test_gradients_equal_the_sequential_ones(stages, microbatches, repeat):
    """Bubble iterations compute on garbage; none of it may reach a weight's gradient."""
    cfg = PipelineConfig(num_stages=stages, num_microbatches=microbatches, circular_repeat=repeat)
    units = _units()
    x = jax.random.normal(jax.random.key(1), (B, D))
    scale = jnp.linspace(0.5, 1.5, B)
    piped = jax.grad(lambda u: jnp.sum(run_pipeline(_stage, u, x, {"scale": scale}, None, cfg)[0] ** 2))(units)
    plain = jax.grad(lambda u: jnp.sum(_sequential(u, x, scale, microbatches)[0] ** 2))(units)
    for name in ("w", "b"):
        assert_same_math(piped[name], plain[name], rtol=1e-4)


def test_keys_differ_per_iteration_and_stage():
    """A stage that draws randomness gets its own key in each (iteration, stage)."""
    cfg = PipelineConfig(num_stages=2, num_microbatches=2)

    def noisy(stage_units, round_, h, inputs, key):
        return h + jax.random.normal(key, h.shape), {}, {}

    x = jnp.zeros((4, 3))
    out = run_pipeline(noisy, {"w": jnp.zeros((2, 1))}, x, {}, jax.random.key(0), cfg)[0]
    rows = np.asarray(out)
    assert len({tuple(np.round(r, 6)) for r in rows}) == 4


def test_bubble_fractions():
    gpipe = PipelineConfig(num_stages=4, num_microbatches=8)
    assert gpipe.num_iterations == 11 and gpipe.bubble_fraction == pytest.approx(3 / 11)  # (S-1)/(M+S-1)
    circular = PipelineConfig(num_stages=4, num_microbatches=8, circular_repeat=3)
    assert circular.num_iterations == 27 and circular.bubble_fraction == pytest.approx(3 / 27)  # (S-1)/(MR+S-1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_microbatches=4), r"num_microbatches=4 .* no effect with PipelineConfig.num_stages=1"),
        (dict(num_stages=4, num_microbatches=2, circular_repeat=2), r"circular_repeat=2 needs .*num_microbatches"),
        (dict(num_stages=0), r"PipelineConfig.num_stages must be >= 1, got 0"),
    ],
)
def test_bad_pipelines_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PipelineConfig(**kwargs)


def test_layers_and_batch_must_split():
    cfg = PipelineConfig(num_stages=3, num_microbatches=5)
    with pytest.raises(ConfigError, match=r"8 layers .* cannot be cut into num_stages x circular_repeat = 3 x 1"):
        cfg.check(num_units=8)
    with pytest.raises(ConfigError, match=r"num_microbatches=5 does not divide the batch of 12"):
        cfg.check(num_units=9, batch_size=12)
