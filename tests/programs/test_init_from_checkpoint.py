"""Partial init from another job dir's checkpoint (Pax's init_from_checkpoint_rules): exactly the
parameters the rules name are copied, the rest keep their fresh init; a rule that names nothing,
a source name the source lacks, or a different shape is a ConfigError naming it."""

import jax
import numpy as np
import pytest
from tiny import tiny_args

from pax_eqx import train
from pax_eqx.checkpoint.config import InitFromCheckpointConfig
from pax_eqx.command_line import cli
from pax_eqx.config import ConfigError
from pax_eqx.learners.variables import param_names
from pax_eqx.programs.runtime import Runtime
from pax_eqx.programs.train.init_from import _source_params
from pax_eqx.programs.train.opening import state_from_checkpoint_rules


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    job = tmp_path_factory.mktemp("source")
    assert train.main(tiny_args(job, "--train.num-steps", "3", "--train.seed", "7")) == 0
    return job


def _runtime(tmp_path, *rules: InitFromCheckpointConfig, extra=()) -> Runtime:
    args = tiny_args(tmp_path / "new", "--train.seed", "1", *extra)
    exp, job_dir, _ = cli.parse(args, "test", "test")
    exp = exp.replace(checkpoint=exp.checkpoint.replace(init_from_checkpoint_rules=rules))
    (tmp_path / "new").mkdir(exist_ok=True)
    return Runtime.create(exp, tmp_path / "new", log=lambda *a: None)


def _named(params) -> dict[str, np.ndarray]:
    leaves = jax.tree.leaves(params)
    return dict(zip(param_names(params), (np.asarray(x) for x in leaves), strict=True))


def test_exactly_the_matched_parameters_are_copied(source, tmp_path):
    rule = InitFromCheckpointConfig(
        job_dir=str(source), rules=((r"stack\.layers\.0\.attention\.(.*)", "stack.layers.0.attention.{0}"),)
    )
    rt = _runtime(tmp_path, rule, extra=("--learner.ema-decay", "0.9"))
    fresh = rt.programs.init_state(rt.exp.train.seed)
    before = _named(fresh.params)
    state = state_from_checkpoint_rules(rt, fresh, rt.exp, log=lambda *a: None)
    after = _named(state.params)
    src = {k: np.asarray(v) for k, v in _source_params(rule, rt.programs.mesh, type(rt.exp.model))[0].items()}
    copied = {n for n in after if n.startswith("stack.layers.0.attention.")}
    assert copied
    for name in after:
        if name in copied:
            np.testing.assert_array_equal(after[name], src[name], err_msg=name)
            assert not np.array_equal(after[name], before[name]), name
        else:
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    np.testing.assert_array_equal(_named(state.ema)[next(iter(copied))], after[next(iter(copied))])


def test_a_source_name_can_differ_and_the_run_trains_from_it(source, tmp_path):
    """The CLI path: a fresh run initialised from the source's embedding trains and says so."""
    rule = InitFromCheckpointConfig(job_dir=str(source), rules=((r"emb(.*)", "emb{0}"),))
    logs = []
    rt = _runtime(tmp_path, rule)
    state = state_from_checkpoint_rules(rt, rt.programs.init_state(1), rt.exp, log=logs.append)
    assert logs == [f"Initialised 1 parameter(s) from {source} (step 3)."]
    assert np.isfinite(np.asarray(jax.tree.leaves(state.params)[0])).all()


@pytest.mark.parametrize(
    "rules, match",
    [
        (((r"nothing\.here", "x"),), r"the rule \('nothing\\\\.here', 'x'\) for .* matches none of this model's"),
        (((r"embedding\.w", "embedding.v"),), r"the source has no parameter 'embedding.v'"),
        (((r"embedding\.w", "stack.layers.0.ff_out.w"),), r"shapes differ"),
    ],
)
def test_rules_that_do_not_fit_are_config_errors_naming_them(source, tmp_path, rules, match):
    rt = _runtime(tmp_path, InitFromCheckpointConfig(job_dir=str(source), rules=rules))
    with pytest.raises(ConfigError, match=match):
        state_from_checkpoint_rules(rt, rt.programs.init_state(1), rt.exp, log=lambda *a: None)


def test_bad_rule_values_are_refused_by_the_config():
    with pytest.raises(ConfigError, match="init_from_checkpoint_rules: rules for 'x' are empty"):
        InitFromCheckpointConfig(job_dir="x")
    with pytest.raises(ConfigError, match="is not a valid regex"):
        InitFromCheckpointConfig(job_dir="x", rules=(("(", "a"),))
    with pytest.raises(ConfigError, match="step must be >= -1"):
        InitFromCheckpointConfig(job_dir="x", rules=(("a", "a"),), step=-2)
