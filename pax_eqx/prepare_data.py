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
import sys
from collections.abc import Sequence

from pax_eqx.data.prepare.config import PrepareConfig

PROG = "python -m pax_eqx.prepare_data"


def main(argv: Sequence[str] | None = None) -> int:
    from pax_eqx.command_line import cli
    from pax_eqx.command_line.entry import verbose

    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:  # each flag with its sentence of PrepareConfig's docstring
        import tyro

        default, _ = cli.apply_switches(PrepareConfig(), [a for a in args if a not in ("-h", "--help")])
        spec = cli.help_spec(type(default), default)
        tyro.cli(spec, default=cli._as(spec, default), args=["--help"], prog=PROG, description=__doc__)
    try:
        cfg = cli.parse_fields(PrepareConfig(), args, PROG)
    except cli.FlagError as e:
        raise cli.fail(str(e)) from None
    logging.getLogger("apache_beam").setLevel(logging.ERROR)  # Beam's start-up warnings, not ours to act on
    try:
        from pax_eqx.data.prepare import pipeline
    except ImportError as e:
        raise cli.fail(
            f"preparing a corpus needs Apache Beam and ArrayRecord ({e}); install them: pip install -e '.[prepare]'."
        ) from None
    if not verbose():  # the workers' own error logs repeat, as tracebacks, the one line printed below
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    try:
        manifest = pipeline.prepare(cfg)
    except pipeline.PipelineError as e:
        from pax_eqx.job.errors import RunError

        raise RunError(f"{e}; rerun the same command (complete shards are kept), or add --verbose for its log.") from e
    print(
        f"{cfg.output_dir}: {len(manifest.shards)} shards, {manifest.num_records} records, "
        f"{manifest.num_documents} documents, {manifest.num_tokens} tokens, layout {manifest.layout}, "
        f"tokenizer {manifest.tokenizer['kind']} ({manifest.tokenizer['fingerprint']})"
    )
    return 0


if __name__ == "__main__":
    from pax_eqx.command_line import entry

    entry.run(main)
