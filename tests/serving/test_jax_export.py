"""jax.export artifacts (pax_eqx.serving.exported_programs, python -m pax_eqx.export): run_exported.py,
in a process where pax_eqx cannot be imported, continues a prompt with the tokens `generate` and the
Engine give; both programs lower for cuda on this CPU machine; the CLI exports a trained job dir
(its tokens are `decode --strategy greedy`'s) and refuses bad input in one line, writing nothing."""

import json
import os
import runpy
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx import export
from pax_eqx.config import ConfigError
from pax_eqx.models import GreedyStrategy, LanguageModelConfig, SampleConfig, generate
from pax_eqx.serving import exported_programs
from pax_eqx.serving.engine import Engine
from pax_eqx.serving.exported_programs import check_language_model, export_slot_programs
from pax_eqx.serving.requests import Request, Token

PROMPT, N = list(range(1, 11)), 12  # 10 prompt tokens: 3 prefill calls of 4 (the last has 2)
JOB_DIR = Path(__file__).parents[1] / "fixtures" / "job_dir_2026_11_25"  # 4 steps of a tiny shakespeare_char
ONE_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
BLOCK_PAX_EQX = textwrap.dedent("""
    import importlib.abc, sys
    class BlockPaxEqx(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "pax_eqx":
                raise ModuleNotFoundError(f"{name} is blocked: the artifacts must run without pax_eqx")
    sys.meta_path.insert(0, BlockPaxEqx())
""")


def without_pax_eqx(cwd: Path, code: str, *argv: str) -> subprocess.Popen:
    """`code` started in a Python in which importing pax_eqx fails (a meta-path finder refuses it
    before the installed package is found), from `cwd`, without PYTHONPATH. It shares the test
    run's compilation cache (conftest.py), so the script run in this process later reads its
    compiled programs instead of compiling them again."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if jax.config.jax_compilation_cache_dir:
        env |= {
            "JAX_COMPILATION_CACHE_DIR": jax.config.jax_compilation_cache_dir,
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        }
    return subprocess.Popen(
        [sys.executable, "-c", BLOCK_PAX_EQX + code, *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def run_script(out: Path, *argv: str, monkeypatch, capsys) -> list[int]:
    """run_exported.py in this process (faster than a subprocess; it imports no pax_eqx either)."""
    monkeypatch.setattr(sys, "argv", ["run_exported.py", str(out), *argv])
    runpy.run_path(str(out / "run_exported.py"), run_name="__main__")
    return [int(t) for t in capsys.readouterr().out.split()]


class Letters:
    """Token i is the letter chr(97 + i) (the Engine streams text)."""

    eos_id = -5

    def decode(self, ids):
        return "".join(chr(97 + i) for i in ids)


def greedy(model, prompt: list[int], n: int) -> list[int]:
    cfg = SampleConfig(max_new_tokens=n, eos_id=-1, strategy=GreedyStrategy())
    return generate(model, [prompt], cfg, jax.random.key(0))[0]


@pytest.fixture(scope="module")
def model():
    cfg = LanguageModelConfig(vocab_size=13, max_seq_len=32, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4)
    return eqx.filter_jit(cfg.build)(jax.random.key(0))  # one compile, not one per initialiser


@pytest.fixture(scope="module")
def continuation(model) -> list[int]:
    """`generate`'s greedy continuation of PROMPT: N tokens."""
    return greedy(model, PROMPT, N)


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    """The artifacts of `model` for cpu and cuda: 3 slots, prompts prefilled 4 tokens a call."""
    programs = export_slot_programs(model, slots=3, chunk=4, platforms=("cpu", "cuda"), name="tiny")
    out = tmp_path_factory.mktemp("export") / "out"
    programs.write(out)
    return programs, out


def test_run_exported_without_pax_eqx_gives_the_tokens_of_generate_and_the_engine(model, exported, continuation,
                                                                                  tmp_path):  # fmt: skip
    """A 10-token prompt (3 prefill calls of 4) and 12 new tokens: the script's ids are
    `generate`'s greedy continuation and the Engine's greedy tokens for the same request."""
    _, out = exported
    blocked = without_pax_eqx(tmp_path, "import pax_eqx")
    _, errors = blocked.communicate(timeout=60)
    assert blocked.returncode != 0 and "pax_eqx is blocked" in errors  # the blocker works
    script = "import runpy; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    ran = without_pax_eqx(tmp_path, script, str(out / "run_exported.py"), str(out), *map(str, PROMPT),
                          "--max-tokens", str(N))  # fmt: skip
    engine = Engine(model, Letters(), slots=3, chunk=4)  # while the script runs
    completion = engine.submit(Request(tuple(PROMPT), max_tokens=N, temperature=0.0))
    while engine.busy():
        engine.step()
    events = []
    while not completion.events.empty():
        events.append(completion.events.get())
    assert [e.id for e in events if isinstance(e, Token) and e.id >= 0] == continuation
    printed, errors = ran.communicate(timeout=120)
    assert ran.returncode == 0, errors[-3000:]
    assert [int(t) for t in printed.split()] == continuation


def test_the_script_stops_at_eos_and_refuses_a_prompt_that_does_not_fit(exported, continuation, tmp_path,
                                                                        monkeypatch, capsys):  # fmt: skip
    """With the manifest's eos_id set to the 3rd token of the greedy continuation, the script
    prints the tokens before its first occurrence (the Engine's rule: EOS ends the request, unsent)."""
    _, artifacts = exported
    out = tmp_path / "out"
    shutil.copytree(artifacts, out)
    eos = continuation[2]
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "eos_id": eos}))
    tokens = run_script(out, *map(str, PROMPT), "--max-tokens", str(N), monkeypatch=monkeypatch, capsys=capsys)
    assert tokens == continuation[: continuation.index(eos)]
    with pytest.raises(SystemExit) as refused:
        run_script(out, *["1"] * 30, "--max-tokens", "8", monkeypatch=monkeypatch, capsys=capsys)
    assert refused.value.code == 2 and "exceed the model's max_seq_len, 32" in capsys.readouterr().err


def test_both_programs_lower_for_cpu_and_cuda_and_match_the_manifest(model, exported):
    """jax.export lowers for a platform this machine lacks: each file holds both, and its inputs
    and outputs are the manifest's, in order; weights.npz holds the model's arrays, state.npz a
    zero cache."""
    programs, out = exported
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["platforms"] == ["cpu", "cuda"] and manifest["model"] == "tiny"
    assert (manifest["slots"], manifest["chunk"], manifest["cache_len"], manifest["vocab_size"]) == (3, 4, 32, 13)
    for program in ("prefill", "generate"):
        loaded = jax.export.deserialize((out / f"{program}.stablehlo").read_bytes())
        assert loaded.platforms == ("cpu", "cuda") and loaded.nr_devices == 1
        for avals, entries in ((loaded.in_avals, manifest[program]["inputs"]),
                               (loaded.out_avals, manifest[program]["outputs"])):  # fmt: skip
            assert [(list(a.shape), a.dtype.name) for a in avals] == [(e["shape"], e["dtype"]) for e in entries]
    weights = np.load(out / "weights.npz")
    leaves = jax.tree.leaves(model)
    assert len(manifest["weights"]) == len(leaves)
    for entry, leaf in zip(manifest["weights"], leaves, strict=True):
        np.testing.assert_array_equal(weights[entry["name"]], np.asarray(leaf))
    state = np.load(out / "state.npz")
    assert [e["name"] for e in manifest["state"]] == ["cache.k", "cache.v", "key_valid", "length"]
    assert all(not state[e["name"]].any() for e in manifest["state"])


def test_bfloat16_arrays_are_stored_as_their_bits(model, tmp_path):
    """numpy cannot save bfloat16: weights.npz holds its bits as uint16, and `.view(dtype)` (what
    the loader does) gives back the same array."""
    bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if jnp.issubdtype(a.dtype, jnp.floating) else a, model)
    programs = export_slot_programs(bf16, slots=1, chunk=8)
    programs.write(tmp_path / "out")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    weights, state = np.load(tmp_path / "out" / "weights.npz"), np.load(tmp_path / "out" / "state.npz")
    first = manifest["weights"][0]
    assert first["dtype"] == "bfloat16" and weights[first["name"]].dtype == np.uint16
    np.testing.assert_array_equal(weights[first["name"]].view(first["dtype"]), np.asarray(jax.tree.leaves(bf16)[0]))
    assert manifest["state"][0]["dtype"] == "bfloat16" and state["cache.k"].dtype == np.uint16


def test_out_is_written_whole_or_not_at_all(exported, tmp_path, monkeypatch):
    """A failed write leaves no OUT and no temporary directory; a non-empty OUT is refused unless
    overwrite, which replaces it whole."""
    programs, _ = exported

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(exported_programs.np, "savez_compressed", full_disk)
        with pytest.raises(OSError, match="No space left"):
            programs.write(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old")
    with pytest.raises(ConfigError, match=r"--out '.*out' is not empty; .* pass --overwrite"):
        programs.write(tmp_path / "out")
    assert programs.write(tmp_path / "out", overwrite=True) == sorted(
        ["generate.stablehlo", "manifest.json", "prefill.stablehlo", "run_exported.py", "state.npz", "weights.npz"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_cli_exports_a_trained_job_dir_whose_tokens_are_decodes(tmp_path, monkeypatch, capsys):
    """python -m pax_eqx.export on a 4-step shakespeare_char job dir (bytes: id = byte + 4, EOS 3),
    for cpu and cuda; the script's greedy continuation of "ROMEO:" is decode's greedy text."""
    job, out = tmp_path / "job", tmp_path / "out"
    shutil.copytree(JOB_DIR, job)
    env = {**os.environ, **ONE_DEVICE}  # the job's mesh: one device
    decoding = subprocess.Popen(  # alongside the export: both only read the job dir
        [sys.executable, "-m", "pax_eqx.decode", "--job-log-dir", str(job), "--prompt", "ROMEO:", "--strategy",
         "greedy", "--max-new-tokens", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    ran = subprocess.run(
        [sys.executable, "-m", "pax_eqx.export", "--job-log-dir", str(job), "--out", str(out), "--platforms", "cpu",
         "cuda", "--slots", "2", "--chunk", "4"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"Exported step 4 of {job} for cpu, cuda to {out}" in ran.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    described = [manifest[k] for k in ("model", "step", "vocab_size", "eos_id", "platforms")]
    assert described == ["shakespeare_char", 4, 260, 3, ["cpu", "cuda"]]
    assert manifest["tokenizer"]["kind"] == "byte" and manifest["tokenizer"]["offset"] == 4
    prompt = [b + 4 for b in b"ROMEO:"]  # 6 ids: two prefill calls of 4
    tokens = run_script(out, *map(str, prompt), "--max-tokens", "10", monkeypatch=monkeypatch, capsys=capsys)
    decoded, errors = decoding.communicate(timeout=300)
    assert decoding.returncode == 0, errors[-3000:]
    assert decoded.splitlines()[-1] == "ROMEO:" + bytes(t - 4 for t in tokens).decode()
    assert sorted(p.name for p in job.iterdir()) == ["checkpoints", "command.txt", "config.json"]  # read only


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", "{out}", "--platforms", "gpu"], "--platforms 'gpu' is not a platform jax.export lowers for (an"),
        (["--out", "{full}"], "--out '{full}' is not empty; choose a new directory, or pass --overwrite"),
        (["--out", "{out}", "--job-log-dir", "{missing}", "--exp", "mnist_cnn"], "a ClassificationModelConfig, not"),
        (["--out", "{out}", "--job-log-dir", "{missing}"], "--job-log-dir '{missing}' does not exist"),
        (["--out", "{out}", "--slots", "0"], "--slots 0: it must be at least 1"),
    ],
    ids=["platform", "out-not-empty", "not-a-language-model", "missing-job-dir", "slots"],
)  # fmt: skip
def test_the_cli_refuses_bad_input_in_one_line_and_writes_nothing(argv, message, tmp_path, capsys):
    """Each refusal is a ConfigError (entry.run: its message on one `error:` line, exit 2), raised
    before OUT or the job dir is touched."""
    paths = {"out": tmp_path / "out", "full": tmp_path / "full", "missing": tmp_path / "missing"}
    paths["full"].mkdir()
    (paths["full"] / "keep.txt").write_text("keep")
    argv = ["--job-log-dir", str(JOB_DIR), *(a.format(**paths) for a in argv)]
    with pytest.raises(ConfigError) as refused:
        export.main(argv)
    assert message.format(**paths) in str(refused.value) and "\n" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"] and os.listdir(paths["full"]) == ["keep.txt"]
    with pytest.raises(ConfigError, match=r"the model \(object\) is not a language model"):
        check_language_model(object())
