"""PrepareConfig: the flags of `python -m pax_eqx.prepare_data` (one frozen config, parsed like
an experiment's fields: `--tokenizer sentencepiece --tokenizer.vocab-size 32000`).

The output directory records the config it was started with (`prepare_config.json`); a rerun
into the same directory must give the same one, so a restarted preparation can never mix
shards of two configurations.
"""

from __future__ import annotations

import difflib
from typing import Literal

from pax_eqx.config import Config, ConfigError, check_number, config
from pax_eqx.data.tokenizers import ByteTokenizerConfig, TokenizerConfig

InputFormat = Literal["auto", "jsonl", "parquet", "text", "hf_dataset"]
Layout = Literal["documents", "rows"]
DIRECT_RUNNER = "DirectRunner"
# Beam's runners by the names its --runner takes (a fully qualified class name is taken as it is).
RUNNERS = (DIRECT_RUNNER, "FlinkRunner", "SparkRunner", "DataflowRunner", "PortableRunner", "PrismRunner")


@config
class PrepareConfig(Config):
    """input: the corpus: files, directories (every file under them), globs, comma-separated; any
    path Beam's file systems read (gs://, s3://, hdfs://). A Hugging Face `datasets` directory
    (save_to_disk output) is given as its directory.
    format: auto (from the names: .jsonl/.json/.ndjson, optionally .gz/.zst; .parquet; a directory
    with state.json = hf_dataset; anything else text) or one of jsonl, parquet, text (one document
    per file), hf_dataset.
    text_key: the record field holding a document's text (jsonl, parquet, hf_dataset).
    output_dir: where the shards, the manifest and the tokenizer are written (local or a Beam path).
    tokenizer: byte, sentencepiece (trained on a sample of the corpus: tokenizer.max_training_chars
    characters in equal shares from up to 64 evenly spaced input files, unless
    tokenizer.model_path is given) or tokenizer_json (`--tokenizer sentencepiece` switches, then
    `--tokenizer.vocab-size 32000` and the other fields of the chosen one).
    layout: "documents" (one record per document, packed into rows when read, any seq_len) or
    "rows" (packed here into rows of seq_len with segment ids).
    seq_len: the rows' length (layout rows only).
    num_shards: ArrayRecord files written; a document goes to shard hash(position) % num_shards.
    runner: the Beam runner: DirectRunner (this machine), FlinkRunner, SparkRunner, DataflowRunner,
    PortableRunner.
    num_workers: DirectRunner processes (multi_processing mode when > 1).
    beam_options: more Beam pipeline options, each NAME=VALUE without its dashes (`--beam-options
    project=P region=R temp_location=gs://b/tmp` for Dataflow, `flink_master=host:8081`).
    """

    input: str = ""
    format: InputFormat = "auto"
    text_key: str = "text"
    output_dir: str = ""
    tokenizer: TokenizerConfig = ByteTokenizerConfig()
    layout: Layout = "documents"
    seq_len: int = 0
    num_shards: int = 16
    runner: str = DIRECT_RUNNER
    num_workers: int = 2
    beam_options: tuple[str, ...] = ()

    def inert_fields(self) -> dict[str, str]:
        inert = {}
        if self.format == "text":
            inert["text_key"] = "format 'text' reads each file as one document, with no record fields"
        if self.layout == "documents":
            inert["seq_len"] = "layout 'documents' stores whole documents; the reader packs them to its data.seq_len"
        if self.runner != DIRECT_RUNNER:
            inert["num_workers"] = (
                f"runner {self.runner!r} sizes itself from its own options (pass them with --beam-options, "
                "e.g. parallelism=N for Flink); num_workers sets the DirectRunner's processes"
            )
        return inert

    def validate(self) -> None:
        """One ConfigError naming the field, the value and the fix."""
        if not self.input.strip():
            raise ConfigError("--input is empty; give the corpus files, e.g. --input 'c4/en/c4-train.*.json.gz'.")
        if not self.output_dir.strip():
            raise ConfigError("--output-dir is empty; give the directory to write the shards and manifest into.")
        if not self.text_key and self.format != "text":
            raise ConfigError("--text-key is empty; name the record field holding the text, e.g. --text-key text.")
        check_number("--num-shards", self.num_shards, integer=True, gt=0)
        check_number("--num-workers", self.num_workers, integer=True, gt=0)
        if self.layout == "rows":
            check_number("--seq-len", self.seq_len, integer=True, gt=0, fix="--layout rows packs rows of --seq-len.")
        elif self.seq_len:
            raise ConfigError(
                f"--seq-len {self.seq_len} would do nothing with --layout documents (the reader packs documents to "
                "its own data.seq_len); remove it, or use --layout rows."
            )
        if "." not in self.runner and self.runner not in RUNNERS:
            close = difflib.get_close_matches(self.runner, RUNNERS, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"--runner {self.runner!r} is not a Beam runner. {hint}Use one of {', '.join(RUNNERS)}, or a "
                "runner's fully qualified class name."
            )
