"""Importing Paxml checkpoints (pax_eqx.checkpoint.pax_import, `python -m pax_eqx.import_pax`).

The fixtures in tests/fixtures/paxml/ were written by Paxml 1.4 itself (generate_fixtures.py): a
tiny TransformerLm trained 3 steps, with a StackedTransformerRepeated or a StackedTransformer,
separate or combined QKV, and the logits Praxis computes for fixed ids. The imported model must
give those logits (<= 1e-5) in both of pax_eqx's stack forms; a model that does not fit is refused
with every misfit listed in one error; and the command line imports a checkpoint that `train`
resumes and fine-tunes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx.checkpoint.pax_import import (
    PaxImportError,
    adam_moments,
    read_checkpoint,
    to_model_params,
    with_adam_moments,
)
from pax_eqx.data.tokenizers import SentencePieceConfig
from pax_eqx.layers.base import Context

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "paxml"
sys.path.insert(0, str(FIXTURES))
import pax_experiment  # noqa: E402

FORMS = ("repeated", "repeated_qkv", "layers", "layers_qkv")


def _meta(form: str) -> dict:
    return json.loads((FIXTURES / form / "meta.json").read_text())


def _imported(form: str, repeat: bool):
    model = pax_experiment.model_config(_meta(form), repeat=repeat).build(jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    new = to_model_params(read_checkpoint(FIXTURES / form).params, params)
    return eqx.combine(jax.tree.map(jnp.asarray, new), static)


@pytest.mark.parametrize("repeat", [True, False], ids=["scanned", "list"])
@pytest.mark.parametrize("form", FORMS)
def test_the_imported_model_gives_pax_logits(form, repeat):
    expected = np.load(FIXTURES / form / "expected.npz")
    logits, _ = _imported(form, repeat)(jnp.asarray(expected["ids"]), Context())
    np.testing.assert_allclose(np.asarray(logits), expected["logits"], rtol=0, atol=1e-5)


def test_the_checkpoint_is_read_with_its_step_and_adam_moments():
    pax = read_checkpoint(FIXTURES / "repeated" / "checkpoints")
    assert pax.directory.name == "checkpoint_00000003" and pax.step == 3 and pax.adam_count == 3
    w = pax.params["lm.transformer.repeat.sub.x_layers_0.self_attention.query.w"]
    assert w.shape == (2, 16, 2, 8)  # [x_times, D, N, H]
    assert set(pax.moments["m"]) == set(pax.params) == set(pax.moments["v"])


def test_an_ocdbt_checkpoint_is_read_like_the_default_layout(tmp_path):
    """Paxml with --tensorstore_use_ocdbt keeps the same arrays as keys of one OCDBT store in
    state/, its optimizer states named with dots (opt_states.0.2.m.params...: what Paxml 1.4 wrote
    when tried); the store is rebuilt here from the `layers` fixture, which is too small a model to
    be worth a second 240 KB fixture."""
    import tensorstore as ts

    source = FIXTURES / "layers" / "checkpoints" / "checkpoint_00000003" / "state"
    state = tmp_path / "checkpoints" / "checkpoint_00000003" / "state"
    state.mkdir(parents=True)
    base = {"driver": "ocdbt", "base": f"file://{state}"}
    for entry in source.iterdir():
        if not (entry / ".zarray").exists():
            continue
        value = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(entry)}}).result().read().result()
        name = entry.name.replace("opt_states_0_", "opt_states.0.")
        spec = {"driver": "zarr", "kvstore": {**base, "path": name}}
        ts.open(spec, create=True, dtype=value.dtype, shape=value.shape).result().write(value).result()
    assert (state / "manifest.ocdbt").exists()
    ocdbt, default = read_checkpoint(tmp_path), read_checkpoint(FIXTURES / "layers")
    assert (ocdbt.step, ocdbt.adam_count) == (default.step, default.adam_count) == (3, 3)
    for got, want in ((ocdbt.params, default.params), (ocdbt.moments["v"], default.moments["v"])):
        assert sorted(got) == sorted(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_adam_moments_become_optax_uncorrected_moments():
    import optax

    pax = read_checkpoint(FIXTURES / "layers")
    model = pax_experiment.model_config(_meta("layers")).build(jax.random.PRNGKey(0))
    params = eqx.filter(model, eqx.is_array)
    mu, nu, count = adam_moments(pax, params, b1=0.9, b2=0.99)
    m = pax.moments["m"]["lm.final_ln.scale"]
    np.testing.assert_allclose(mu.final_norm.scale, m * (1 - 0.9**3), rtol=1e-6)
    v = pax.moments["v"]["lm.transformer.x_layers_1.self_attention.post.w"]
    np.testing.assert_allclose(nu.stack.layers[1].attention.w_o, np.transpose(v, (1, 2, 0)) * (1 - 0.99**3), rtol=1e-6)
    state = optax.chain(optax.scale_by_adam(), optax.scale_by_learning_rate(1.0)).init(params)
    state, replaced = with_adam_moments(state, mu, nu, count)
    assert replaced == 1 and int(state[0].count) == 3


def _problems(error: PaxImportError) -> list[str]:
    return [line.strip() for line in str(error).splitlines()[1:-1]]


def test_shapes_that_differ_are_listed_in_one_error():
    meta = {**_meta("layers"), "hidden_dims": 64}
    model = pax_experiment.model_config(meta).build(jax.random.PRNGKey(0))
    with pytest.raises(PaxImportError) as caught:
        to_model_params(read_checkpoint(FIXTURES / "layers").params, eqx.filter(model, eqx.is_array))
    problems = _problems(caught.value)
    # ff_in's weight and bias and ff_out's weight, in each of the two layers
    assert len(problems) == 6, problems
    assert (
        "model parameter stack.layers[0].ff_in.linear.w (16, 64): Praxis variable "
        "lm.transformer.x_layers_0.ff_layer.ffn_layer1.linear.w gives shape (16, 32)" in problems
    )
    assert "--model.hidden-dims" in str(caught.value)


def test_variables_without_counterpart_and_parameters_without_value_are_listed():
    pax = read_checkpoint(FIXTURES / "repeated_qkv").params
    pax = {**pax, "lm.transformer.repeat.sub.x_layers_0.self_attention.relative_bias.w": np.zeros((2, 4))}
    meta = {**_meta("repeated_qkv"), "per_dim_scale": True}  # a parameter the checkpoint does not have
    model = pax_experiment.model_config(meta).build(jax.random.PRNGKey(0))
    with pytest.raises(PaxImportError) as caught:
        to_model_params(pax, eqx.filter(model, eqx.is_array))
    problems = _problems(caught.value)
    assert problems == [
        "model parameter stack.layers.attention.per_dim_scale (2, 8): no Praxis variable gives it",
        "Praxis variable lm.transformer.repeat.sub.x_layers_0.self_attention.relative_bias.w (2, 4): no "
        "counterpart in the model",
    ]


def test_a_model_without_biases_lists_every_bias():
    meta = _meta("layers_qkv")
    cfg = pax_experiment.model_config(meta)
    cfg = cfg.replace(block=cfg.block.replace(attention=cfg.block.attention.replace(use_bias=False)))
    with pytest.raises(PaxImportError) as caught:
        to_model_params(
            read_checkpoint(FIXTURES / "layers_qkv").params, eqx.filter(cfg.build(jax.random.PRNGKey(0)), eqx.is_array)
        )
    problems = _problems(caught.value)
    assert sorted(problems) == sorted(
        f"Praxis variable lm.transformer.x_layers_{i}.self_attention.{name} ({shape}): no counterpart in the model"
        for i in (0, 1)
        for name, shape in (("combined_qkv.b", "3, 2, 8"), ("post.b", "16,"))
    )


def test_a_missing_checkpoint_is_a_user_error(tmp_path):
    from pax_eqx.config import ConfigError

    with pytest.raises(ConfigError, match="holds no Paxml checkpoint"):
        read_checkpoint(tmp_path)


def _zarr(path: Path, data: np.ndarray) -> None:
    import tensorstore as ts

    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}}
    meta = {"shape": list(data.shape), "chunks": [2, 2], "dtype": "<f4"}
    ts.open({**spec, "metadata": meta}, create=True).result().write(data).result()


def test_a_variable_missing_one_of_its_chunks_is_refused_not_read_as_zeros(tmp_path):
    """An interrupted copy: three of four chunk files. A plain tensorstore read fills the fourth
    with zeros; a variable with no chunk at all is zeros as tensorstore may write it."""
    from pax_eqx.checkpoint.pax_import import PaxImportError, _read_state

    _zarr(tmp_path / "w", np.arange(1, 17, dtype=np.float32).reshape(4, 4))
    _zarr(tmp_path / "zeros", np.zeros((4, 4), np.float32))
    for chunk in ("0.0", "0.1", "1.0", "1.1"):
        (tmp_path / "zeros" / chunk).unlink(missing_ok=True)  # every chunk left out: the fill value
    state = _read_state(tmp_path)
    assert float(state["w"].sum()) == 136.0 and not state["zeros"].any()
    (tmp_path / "w" / "1.0").unlink()
    with pytest.raises(PaxImportError, match=r"'w' in .*1\.0.* is missing, while 3 other chunk\(s\) of it are there"):
        _read_state(tmp_path)


# ------------------------------------------------------------------------------ command line


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture
def spm_model(tmp_path) -> str:
    """A 32-token SentencePiece model (the fixtures' vocabulary size)."""
    from pax_eqx.data.tokenizers import train_sentencepiece

    letters = "abcdefghijklmnopqrstuvwxyz. "
    lines = [" ".join(letters[(i * 7 + j) % len(letters)] * (1 + j % 3) for j in range(20)) for i in range(200)]
    proto = train_sentencepiece(lines, SentencePieceConfig(vocab_size=32, model_type="char"))
    path = tmp_path / "spm.model"
    path.write_bytes(proto)
    return str(path)


def _flags(out: Path, spm_model: str) -> list[str]:
    """The experiment, with data parallelism over every (fake) device, as tests/programs/tiny.py."""
    n = jax.device_count()
    batch = str(max(4, n))
    return [
        "--exp", "pax_experiment.tiny_pax_lm", "--job-log-dir", str(out), "--data.tokenizer.model-path", spm_model,
        "--mesh.ici-mesh-shape", str(n), "1", "1", "--data.train.batch-size", batch, "--data.eval.batch-size", batch,
    ]  # fmt: skip


def test_import_then_fine_tune_through_the_command_line(tmp_path, spm_model, capsys):
    """The command lines' mains, in this process (`python -m pax_eqx.import_pax` as a process of its
    own: the refusal below; `python -m pax_eqx.train`: tests/programs/test_cli_end_to_end.py)."""
    from pax_eqx import import_pax, train

    out = tmp_path / "run"
    flags = _flags(out, spm_model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert import_pax.main(["--pax-checkpoint", str(FIXTURES / "layers"), *flags]) == 0
    printed = capsys.readouterr().out
    assert "Imported step 3" in printed
    # the fine-tuning hint names the experiment as given (a dotted path, not its short name)
    assert "python -m pax_eqx.train --exp pax_experiment.tiny_pax_lm --job-log-dir" in printed
    # the learner matches: Adam's moments were imported
    assert not [w for w in caught if issubclass(w.category, import_pax.PaxImportWarning)], caught
    assert sorted(os.listdir(out / "checkpoints")) == ["3"]
    _check_restores_as_pax(flags)

    assert train.main([*flags, "--train.num-steps", "5"]) == 0
    assert "Resuming tiny_pax_lm from checkpoint at step 3" in capsys.readouterr().out
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert 4 in steps and 5 in steps and min(steps) > 3
    assert "5" in os.listdir(out / "checkpoints")


def _check_restores_as_pax(flags: list[str]) -> None:
    """What eval and decode restore from the imported job dir is Pax's model at step 3: Pax's
    logits, and Adam's moments at Praxis' update count."""
    import optax

    from pax_eqx.command_line import cli
    from pax_eqx.programs.restore import restore_for_inference

    exp, job_dir, _ = cli.parse(flags, "test", "test")
    rt, state, step = restore_for_inference(exp, job_dir)
    assert step == 3 and int(state.step) == 3
    expected = np.load(FIXTURES / "layers" / "expected.npz")
    logits, _ = rt.programs.task.model(state.params)(jnp.asarray(expected["ids"]), Context())
    np.testing.assert_allclose(np.asarray(logits), expected["logits"], rtol=0, atol=1e-5)
    adam = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
            if isinstance(s, optax.ScaleByAdamState)]  # fmt: skip
    assert len(adam) == 1 and int(adam[0].count) == 3
    assert float(jnp.abs(adam[0].mu.final_norm.scale).max()) > 0


def test_the_command_line_refuses_a_model_that_does_not_fit(tmp_path, spm_model):
    out = tmp_path / "run"
    flags = _flags(out, spm_model)
    result = _run("pax_eqx.import_pax", "--pax-checkpoint", str(FIXTURES / "repeated_qkv"), *flags)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error: the Paxml checkpoint does not fit the experiment's model" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()  # nothing was written


def test_without_adam_moments_the_optimizer_starts_afresh_with_a_warning(tmp_path, spm_model):
    from pax_eqx import import_pax
    from pax_eqx.job.job_dir import JobDirError

    source = tmp_path / "pax" / "checkpoints" / "checkpoint_00000003"
    shutil.copytree(FIXTURES / "layers" / "checkpoints" / "checkpoint_00000003", source)
    for state in (source / "state").iterdir():
        if state.name.startswith("opt_states"):
            shutil.rmtree(state)
    out = tmp_path / "run"
    with pytest.warns(import_pax.PaxImportWarning, match="holds no Adam moments .* starts afresh"):
        assert import_pax.main(["--pax-checkpoint", str(tmp_path / "pax"), *_flags(out, spm_model)]) == 0
    assert sorted(os.listdir(out / "checkpoints")) == ["3"]
    with pytest.raises(JobDirError, match="already holds checkpoints"):
        import_pax.main(["--pax-checkpoint", str(tmp_path / "pax"), *_flags(out, spm_model)])


def test_an_import_into_a_job_dir_that_holds_a_run_is_refused(tmp_path, spm_model):
    """A run's config.json and metrics without a checkpoint: the import would have replaced the
    config and kept the metrics, one job dir of two experiments."""
    from pax_eqx import import_pax
    from pax_eqx.job.job_dir import JobDirError

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text('{"name": "another"}')
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    with pytest.raises(JobDirError, match="already holds a run \\(config.json, metrics.jsonl\\)"):
        import_pax.main(["--pax-checkpoint", str(FIXTURES / "layers"), *_flags(out, spm_model)])
    assert (out / "config.json").read_text() == '{"name": "another"}'


def test_an_empty_newest_checkpoint_falls_back_to_the_newest_complete_one(tmp_path):
    """It stopped the import; an interrupted copy leaves the newest step's state/ empty."""

    from pax_eqx.checkpoint.errors import CheckpointFallbackWarning
    from pax_eqx.checkpoint.pax_import import PaxImportError, find_checkpoint

    root = tmp_path / "checkpoints"
    shutil.copytree(FIXTURES / "layers" / "checkpoints" / "checkpoint_00000003", root / "checkpoint_00000003")
    (root / "checkpoint_00000010" / "state").mkdir(parents=True)
    with pytest.warns(CheckpointFallbackWarning, match="checkpoint_00000010 in .* has an empty state/ directory"):
        assert find_checkpoint(tmp_path) == root / "checkpoint_00000003"
    assert read_checkpoint(tmp_path).step == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for by name: not replaced by another step
        with pytest.raises(PaxImportError, match="holds no tensorstore arrays"):
            read_checkpoint(root / "checkpoint_00000010")
    shutil.rmtree(root / "checkpoint_00000003" / "state")
    (root / "checkpoint_00000003" / "state").mkdir()
    with pytest.raises(PaxImportError, match="every checkpoint in it has an empty state/ directory"):
        find_checkpoint(tmp_path)
