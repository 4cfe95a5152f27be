"""`python -m pax_eqx.prepare_data` and `python -m pax_eqx.prepare_images`, as an adversarial user
met them (issue 51, "Reliability IV"):

- a bad corpus (binary, not UTF-8, --format parquet on JSON lines, a text that is null, a number
  or a list, a corpus of empty texts) printed ~170 lines of Beam worker tracebacks, or prepared
  'None' / '123' / U+FFFD documents: now one `error:` line naming the file, the line and the fix,
  exit 2, nothing left behind, and none of Beam's start-up lines;
- Ctrl-C was ignored (the driver hung, its workers gone): now it stops the workers, keeps the
  complete shards, exits 130, and the rerun finishes;
- a failed run's prepare_config.json refused the corrected command; an output directory inside
  the input directory was read as input by the rerun;
- prepare_images into a path under a file, or where the user cannot write, was a traceback.

Tiny corpora and the DirectRunner. Each bad corpus goes through `pipeline.prepare` in this
process (the reader's error as the Beam pipeline hands it back, and what is left behind); two of
them go through the real command line too (the one line, exit 2, no Beam output: one with worker
processes, one with --verbose), as do Ctrl-C, the failed run and one prepare_images path. What
is decided inside `pipeline.prepare` alone (a rerun's settings, the output dir inside the input)
is checked in this process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")

REPO = Path(__file__).resolve().parents[2]
SLOW_WRITES = REPO / "tests" / "data" / "prepare_slow_writes"
TIMEOUT_S = 240
BEAM_NOISE = ("Traceback", "apitools", "Logging handler", "WARNING", "INFO:", "sdk_worker")


def environment(shard_delay_s: float = 0) -> dict[str, str]:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    for name in ("PAX_EQX_VERBOSE", "PAX_EQX_TRACEBACK"):
        env.pop(name, None)
    if shard_delay_s:  # every process of the run waits this long before writing each shard (sitecustomize)
        env["PYTHONPATH"] = f"{SLOW_WRITES}{os.pathsep}{env.get('PYTHONPATH', '')}"
        env["PAX_EQX_TEST_SHARD_DELAY_S"] = str(shard_delay_s)
    return env


def prepare(*args: str, program: str = "pax_eqx.prepare_data") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", program, *args], cwd=REPO, env=environment(), capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip


def error_line(done: subprocess.CompletedProcess, code: int = 2) -> str:
    """The run's one `error:` line, after checking the exit status and that nothing else was said
    but pax_eqx's own `prepare_data:` progress lines."""
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), done.stderr
    assert all(line.startswith("prepare_data: ") for line in lines[:-1]), done.stderr
    assert not any(noise in done.stderr for noise in BEAM_NOISE), done.stderr
    return lines[-1]


def jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def corpus(root: Path, files: int = 3, docs: int = 40, tag: str = "doc") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in "abcdefgh"[:files]:
        jsonl(root / f"{name}.jsonl", [{"text": f"{name} {tag} {i} " + "words " * (i % 7)} for i in range(docs)])
    return root


def bad_corpus(tmp_path: Path, case: str) -> tuple[Path, list[str]]:
    """The input file of one bad case, and extra flags."""
    path = tmp_path / "in.jsonl"
    if case == "binary":  # an ELF header and code bytes under a .jsonl name
        path.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(0x80, 0x100)) * 4)
    elif case == "latin1":
        path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    elif case == "parquet_on_jsonl":
        jsonl(path, [{"text": "a page"}])
        return path, ["--format", "parquet"]
    elif case in ("null", "number", "list"):
        value = {"null": None, "number": 123, "list": ["a", "b"]}[case]
        jsonl(path, [{"text": "a page"}, {"text": value}])
    elif case == "binary_text":
        path = tmp_path / "image.bin"  # --format auto reads it as text
        path.write_bytes(b"\x00\x01\x02" + bytes(range(0x80, 0x100)) * 8)
    elif case == "empty_texts":
        jsonl(path, [{"text": ""}, {"text": ""}, {"url": "x", "text": ""}])
    return path, []


BAD = {
    "binary": r"/in\.jsonl' line 1 is not UTF-8 \(byte 0x80 at column 9; a binary file\?\); convert it to UTF-8",
    "latin1": r"/in\.jsonl' line 2 is not UTF-8 \(byte 0xe9 at column 14; text in another encoding\?\)",
    "parquet_on_jsonl": r"/in\.jsonl' cannot be read as Parquet \(ArrowInvalid: .*\); it is not a Parquet file: "
    r"give the --format it is written in",
    "null": r"/in\.jsonl' line 2: its 'text' is null, not a string; a document's text must be a JSON string",
    "number": r"/in\.jsonl' line 2: its 'text' is a number \(123\), not a string",
    "list": r"/in\.jsonl' line 2: its 'text' is a list \(\[\"a\", \"b\"\]\), not a string",
    "binary_text": r"/image\.bin' line 1 is not UTF-8 \(byte 0x80 at column 4; a binary file\?\)",
    "empty_texts": r"its 3 document\(s\) are all empty \(no text in --text-key 'text'\), so a model would have nothing "
    r"to learn; nothing was prepared",
}


def _prepare_in_process(**fields):
    from pax_eqx.data.prepare import pipeline
    from pax_eqx.data.prepare.config import PrepareConfig

    return pipeline.prepare(PrepareConfig(num_workers=1, **fields))


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_corpus_is_one_error_naming_file_and_line(tmp_path, case):
    """Through the pipeline (Beam's in-process runner): the error the command line prints after
    `error: `; the refused run leaves no output directory, or, for one that existed, nothing in it."""
    import re

    from pax_eqx.config import ConfigError

    source, flags = bad_corpus(tmp_path, case)
    out = tmp_path / "out"
    existing = case in ("null", "empty_texts")
    if existing:
        out.mkdir()
    fields = {"format": flags[1]} if flags else {}
    with pytest.raises(ConfigError) as refused:
        _prepare_in_process(input=str(source), output_dir=str(out), num_shards=2, **fields)
    message = str(refused.value)
    assert len(message.splitlines()) == 1, message
    assert re.search(BAD[case], message), message
    assert message.startswith(f"--input{':' if case != 'empty_texts' else ''} "), message
    assert (list(out.iterdir()) == []) if existing else not out.exists()


@pytest.mark.parametrize("case", ["binary", "latin1"])
def test_a_bad_corpus_through_the_command_line_is_one_line_and_exit_2(tmp_path, case):
    """The command line's wiring of the error above: the binary file read by worker processes
    (their start-up lines and tracebacks silenced: the ~170 lines), nothing left; with --verbose
    (one worker), the traceback and Beam's log first, then the same line and status."""
    import re

    source, _ = bad_corpus(tmp_path, case)
    out = tmp_path / "out"
    workers = "2" if case == "binary" else "1"  # worker processes once (their start costs ~7 s)
    verbose = ["--verbose"] if case == "latin1" else []
    done = prepare("--input", str(source), "--output-dir", str(out), "--num-workers", workers, *verbose)
    if verbose:
        assert done.returncode == 2 and "Traceback (most recent call last)" in done.stderr, done.stderr
        line = done.stderr.strip().splitlines()[-1]
    else:
        line = error_line(done)
    assert re.search(BAD[case], line), line
    assert line.startswith("error: --input: "), line
    assert not out.exists()


def _shards(out: Path) -> list[Path]:
    return sorted(out.glob("shard-*.array_record"))


def _wait(condition, proc: subprocess.Popen, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _group_gone(pgid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _interrupted(proc: subprocess.Popen, out: Path, num_shards: int) -> tuple[int, str]:
    """Waits for the interrupted run's exit; returns (complete shards, its error line)."""
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    done = len(_shards(out))
    line = stderr.strip().splitlines()[-1]
    assert line == (
        f"error: interrupted (SIGINT): {done} of {num_shards} shards are complete in {out} and kept; rerun the same "
        "command to finish."
    ), stderr
    assert not any(noise in stderr for noise in BEAM_NOISE), stderr
    assert _group_gone(proc.pid), "worker processes outlived the interrupted run"
    return done, line


def test_ctrl_c_stops_the_workers_keeps_complete_shards_and_the_rerun_finishes(tmp_path):
    """Ctrl-C to the driver alone (it hung before, its workers gone) and to the whole process
    group (a terminal's), each mid-run with 2 worker processes; then the rerun completes (in
    this process's runner: the workers are not the point of it, and --num-workers may change)."""
    source = corpus(tmp_path / "in")
    out = tmp_path / "out"
    flags = ["--input", str(source), "--output-dir", str(out), "--num-shards", "8", "--num-workers", "2"]
    cmd = [sys.executable, "-m", "pax_eqx.prepare_data", *flags]

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            cmd, cwd=REPO, env=environment(shard_delay_s=2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip

    proc = start()
    _wait(lambda: len(_shards(out)) >= 1, proc, "a complete shard")
    proc.send_signal(signal.SIGINT)  # the driver only
    first, _ = _interrupted(proc, out, 8)
    assert 1 <= first < 8

    proc = start()
    _wait(lambda: len(_shards(out)) > first, proc, "another complete shard")
    os.killpg(proc.pid, signal.SIGINT)  # every process of the run, as a terminal's Ctrl-C
    second, _ = _interrupted(proc, out, 8)
    assert first < second

    done = prepare(*flags[:-1], "1")
    assert done.returncode == 0, done.stderr
    assert f"{second} complete from an earlier run (skipped)" in done.stderr
    assert all(line.startswith("prepare_data: ") for line in done.stderr.strip().splitlines()), done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_documents"] == 120 and len(manifest["shards"]) == 8
    assert not list(out.glob(".tmp-*"))


def test_leftovers_of_a_failed_run_do_not_pin_the_corrected_command(tmp_path, capsys):
    """A run that fails writing its shards (a file-size limit: EFBIG, as a full disk's ENOSPC)
    exits 1 and leaves prepare_config.json; a command with other settings then runs. Once a
    directory holds complete shards, other settings are refused, naming each one (both decided
    in pipeline.prepare: in this process)."""
    from pax_eqx.config import ConfigError

    source = corpus(tmp_path / "in")
    out = tmp_path / "out"
    launcher = (
        "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY)); "
        "sys.argv[0] = 'prepare_data'; runpy.run_module('pax_eqx.prepare_data', run_name='__main__')"
    )
    failed = subprocess.run(
        [sys.executable, "-c", launcher, "--input", str(source), "--output-dir", str(out), "--num-shards", "3",
         "--num-workers", "1"],
        cwd=REPO, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    line = error_line(failed, code=1)
    assert "writing shard shard-0000" in line and "File too large" in line, line
    assert line.endswith("Rerun the same command to finish (its complete shards are kept)."), line
    assert (out / "prepare_config.json").exists() and not _shards(out)

    capsys.readouterr()
    _prepare_in_process(input=str(source), output_dir=str(out), num_shards=2)
    assert "an earlier run with other settings completed no shard; starting afresh" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["num_documents"] == 120

    with pytest.raises(ConfigError) as other:
        _prepare_in_process(input=str(source), output_dir=str(out), num_shards=3, text_key="body")
    line = str(other.value)
    assert "holds 2 complete shard(s) of a preparation started with other settings (num_shards: 2 -> 3; " in line
    assert "text_key: 'text' -> 'body'" in line and line.endswith("or use a new --output-dir."), line
    assert len(_shards(out)) == 2  # the complete shards of the first settings are kept


def test_an_output_dir_inside_the_input_dir_is_not_input(tmp_path, capsys):
    """The rerun was refused as 'input files differ': it listed the first run's shards as input
    (readers.list_inputs, in pipeline.prepare: in this process)."""
    source = corpus(tmp_path / "in", files=2, docs=10)
    out = source / "prepared"
    _prepare_in_process(input=str(source), output_dir=str(out), num_shards=2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [Path(s["path"]).name for s in manifest["sources"]] == ["a.jsonl", "b.jsonl"]
    capsys.readouterr()
    _prepare_in_process(input=str(source), output_dir=str(out), num_shards=2)
    again = capsys.readouterr().err
    assert "is already prepared (manifest.json; its 2 input file(s) unchanged); nothing to do." in again, again


def test_prepare_images_into_a_path_it_cannot_create_is_one_line(tmp_path, capsys):
    """A path under a file through the command line; one this user cannot create through its
    main() in this process (the same printing and status)."""
    from PIL import Image

    from pax_eqx import prepare_images

    images = tmp_path / "images"
    for folder in ("n01", "n02"):
        (images / "train" / folder).mkdir(parents=True)
        Image.new("RGB", (8, 8), (40, 80, 120)).save(images / "train" / folder / "a.JPEG")
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    done = prepare("--input", str(images), "--output", str(a_file / "out"), program="pax_eqx.prepare_images")
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: --output '{a_file}/out' cannot be created: '{a_file}' is a file, not a directory; choose a path "
        "under a directory."
    ), done.stderr
    assert a_file.read_text() == "not a directory"

    if os.geteuid() == 0:  # root writes through permissions; sysfs refuses even root a directory
        target, created = Path("/sys/pax_eqx_test/out"), Path("/sys/pax_eqx_test")
    else:
        locked = tmp_path / "read_only"
        locked.mkdir()
        locked.chmod(0o555)
        target, created = locked / "out", locked / "out"
    capsys.readouterr()
    assert prepare_images.main(["--input", str(images), "--output", str(target)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().startswith(f"error: --output '{target}' cannot be created ("), stderr
    assert stderr.strip().endswith("); choose a directory this user can write."), stderr
    assert len(stderr.strip().splitlines()) == 1 and not created.exists()
