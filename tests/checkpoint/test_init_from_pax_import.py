"""Partial init from an imported Paxml checkpoint: `python -m pax_eqx.import_pax` writes a pax_eqx
job dir, and `checkpoint.init_from_checkpoint_rules` copies exactly the parameters its rules name
from it into a fresh run (Pax's fine-tuning recipe); the others keep their initialisation."""

import sys
from pathlib import Path

import jax
import numpy as np

from pax_eqx import import_pax
from pax_eqx.checkpoint.config import InitFromCheckpointConfig
from pax_eqx.command_line import cli
from pax_eqx.learners.variables import param_names
from pax_eqx.programs.restore import restore_for_inference
from pax_eqx.programs.runtime import Runtime
from pax_eqx.programs.train.opening import state_from_checkpoint_rules

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "paxml"
sys.path.insert(0, str(FIXTURES))

from test_pax_import import _flags, spm_model  # noqa: E402, F401 -- the fixture and the flags


def _named(params) -> dict[str, np.ndarray]:
    return dict(zip(param_names(params), (np.asarray(x) for x in jax.tree.leaves(params)), strict=True))


def test_attention_initialised_from_an_imported_pax_checkpoint(tmp_path, spm_model):  # noqa: F811
    imported = tmp_path / "imported"
    assert import_pax.main(["--pax-checkpoint", str(FIXTURES / "layers"), *_flags(imported, spm_model)]) == 0
    exp, job_dir, _ = cli.parse(_flags(imported, spm_model), "test", "test")
    _, pax_state, _ = restore_for_inference(exp, job_dir)
    pax = _named(pax_state.params)

    new = tmp_path / "new"
    new.mkdir()
    exp, _, _ = cli.parse(_flags(new, spm_model), "test", "test")
    rule = InitFromCheckpointConfig(job_dir=str(imported), rules=((r"(.*)\.attention\.(.*)", "{0}.attention.{1}"),))
    exp = exp.replace(checkpoint=exp.checkpoint.replace(init_from_checkpoint_rules=(rule,)))
    rt = Runtime.create(exp, new, log=lambda *a: None)
    fresh = rt.programs.init_state(exp.train.seed)
    before = _named(fresh.params)
    after = _named(state_from_checkpoint_rules(rt, fresh, exp, log=lambda *a: None).params)
    copied = [n for n in after if ".attention." in n]
    assert copied and len(copied) < len(after)
    for name in after:
        expected = pax[name] if name in copied else before[name]
        np.testing.assert_array_equal(after[name], expected, err_msg=name)


def test_import_with_frozen_variables_starts_the_optimizer_afresh(tmp_path, spm_model, recwarn):  # noqa: F811
    out = tmp_path / "imported"
    flags = [*_flags(out, spm_model), "--learner.frozen", r".*\.attention\..*"]
    assert import_pax.main(["--pax-checkpoint", str(FIXTURES / "layers"), *flags]) == 0
    assert any("learner.frozen / learner.variable_groups split the optimizer state" in str(w.message) for w in recwarn)
    exp, job_dir, _ = cli.parse(flags, "test", "test")
    _, state, step = restore_for_inference(exp, job_dir)
    assert step == 3 and int(state.step) == 3
