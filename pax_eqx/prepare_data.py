"""`python -m pax_eqx.prepare_data`: a corpus, prepared once into ArrayRecord shards + a manifest.

    python -m pax_eqx.prepare_data --input 'c4/en/c4-train.*.json.gz' --output-dir prepared/c4 \\
        --tokenizer sentencepiece --tokenizer.vocab-size 32128 --num-shards 1024 [--num-workers 16]
    python -m pax_eqx.train --exp c4_spmd_adam --data.source array_record --data.path prepared/c4 ...

The same command runs on a cluster with `--runner FlinkRunner|SparkRunner|DataflowRunner` and that
runner's options in `--beam-options` (docs/data.md, "Preparing a corpus"). The flags are the
fields of `PrepareConfig` (pax_eqx/data/prepare/config.py); the work is an Apache Beam pipeline
(pax_eqx/data/prepare/pipeline.py), installed with `pip install -e '.[prepare]'`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence

from pax_eqx.data.prepare.config import PrepareConfig

PROG = "python -m pax_eqx.prepare_data"
_EXIT_FOR = {"SIGINT": 130, "SIGTERM": 143}


def main(argv: Sequence[str] | None = None) -> int:
    """Prepares the corpus; what a user sees of Beam is its first error in one line (unless
    --verbose), and Ctrl-C / SIGTERM stop it with the complete shards kept (exit 130 / 143)."""
    from pax_eqx.command_line.entry import verbose

    cfg, log = None, None
    signal.signal(signal.SIGTERM, _terminated)
    try:
        cfg = _parse(list(sys.argv[1:] if argv is None else argv))
        if not verbose():  # what Beam and its workers print goes here, shown only when the run fails for them
            _silence_beam()
            fd, log = tempfile.mkstemp(prefix="pax_eqx-prepare_data-", suffix=".log")
            os.close(fd)
        return _prepare(cfg, log)
    except KeyboardInterrupt as e:
        if log is not None and os.path.exists(log):
            os.remove(log)
        return _interrupted(cfg, str(e) or "SIGINT")


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _parse(args: list[str]) -> PrepareConfig:
    from pax_eqx.command_line import cli, entry

    if "--verbose" in args:  # every program's flag: Beam's log and the tracebacks on the terminal
        entry.set_verbose()
        args = [a for a in args if a != "--verbose"]

    if "-h" in args or "--help" in args:  # each flag with its sentence of PrepareConfig's docstring
        import tyro

        default, _ = cli.apply_switches(PrepareConfig(), [a for a in args if a not in ("-h", "--help")])
        spec = cli.help_spec(type(default), default)
        tyro.cli(spec, default=cli._as(spec, default), args=["--help"], prog=PROG, description=__doc__)
    try:
        return cli.parse_fields(PrepareConfig(), args, PROG)
    except cli.FlagError as e:
        raise cli.fail(str(e)) from None


class _BeamNoise(logging.Filter):
    """Drops what Apache Beam logs through the root logger as it is imported ('apitools not
    found, and bigquery client libraries are not available'): nothing a user can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}apache_beam{os.sep}" not in record.pathname


def _silence_beam() -> None:
    logging.getLogger().addFilter(_BeamNoise())
    # Above CRITICAL: its errors come back as the one line below, and after Ctrl-C its job service
    # relays each killed worker's traceback as a CRITICAL record (a child logger: this level is theirs).
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL + 1)
    warnings.filterwarnings("ignore", module=r"apache_beam(\..*)?$")


def _prepare(cfg: PrepareConfig, log: str | None) -> int:
    try:
        from pax_eqx.data.prepare import pipeline
    except ImportError as e:
        from pax_eqx.job.errors import RunError

        raise RunError(
            f"preparing a corpus needs Apache Beam and ArrayRecord ({e}); install them: pip install -e '.[prepare]'."
        ) from None
    keep = False
    try:
        manifest = pipeline.prepare(cfg, beam_log=log)
    except pipeline.PipelineError as e:
        from pax_eqx.job.errors import RunError

        keep = log is not None and os.path.getsize(log) > 0
        where = f"Beam's log is {log}" if keep else "add --verbose for Beam's log"
        raise RunError(f"{e}; {where}. Rerun the same command to finish (its complete shards are kept).") from e
    finally:
        if log is not None and not keep:
            os.remove(log)
    print(
        f"{cfg.output_dir}: {len(manifest.shards)} shards, {manifest.num_records} records, "
        f"{manifest.num_documents} documents, {manifest.num_tokens} tokens, layout {manifest.layout}, "
        f"tokenizer {manifest.tokenizer['kind']} ({manifest.tokenizer['fingerprint']})"
    )
    return 0


def _interrupted(cfg: PrepareConfig | None, signal_name: str) -> int:
    """One line saying what is kept, then the exit status; Beam's threads (which would keep the
    process alive, waiting for workers that are gone) end with the process."""
    code = _EXIT_FOR.get(signal_name, 130)
    kept = "before it started; nothing was written"
    if cfg is not None and "://" in cfg.output_dir:
        kept = f"the complete shards in {cfg.output_dir} are kept"
    elif cfg is not None and os.path.isdir(cfg.output_dir):
        done = len([name for name in os.listdir(cfg.output_dir) if name.endswith(".array_record")])
        kept = (
            f"{done} of {cfg.num_shards} shards are complete in {cfg.output_dir} and kept"
            if done
            else f"no shard of {cfg.output_dir} was complete yet"
        )
    print(f"error: interrupted ({signal_name}): {kept}; rerun the same command to finish.", file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        os._exit(code)
    return code


if __name__ == "__main__":
    from pax_eqx.command_line import entry

    entry.run(main)
