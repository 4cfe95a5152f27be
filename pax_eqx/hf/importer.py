"""A Hugging Face model directory -> a pax_eqx experiment and its parameters (no files written).

    source = HfSource.open("Llama-3.1-8B")                # config.json, safetensors, tokenizer
    exp = source.experiment(job_dir)                     # the model config.json describes
    params = source.load_params(programs)                # streamed into the state's shardings

`import_hf` (the command) writes these into a job dir; tests use them directly.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.data import DataConfig, InputConfig
from pax_eqx.data.tokenizers import TokenizerJsonConfig
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.extras import require
from pax_eqx.hf.families import HfConfigError, model_config, model_type
from pax_eqx.hf.safetensors_files import SafetensorsFiles
from pax_eqx.hf.streaming import load_params
from pax_eqx.hf.weights import Dims, WeightPlan, check_complete, weight_plan
from pax_eqx.learners.variables import path_name
from pax_eqx.models.language_model import LanguageModelConfig
from pax_eqx.sharding.mesh import MeshConfig

TOKENIZER_DIR = "tokenizer"
SOURCE_DIR = "hf"  # DIR/hf/config.json: the imported model's own config, for export_hf
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_SEQ_LEN = 512  # the imported experiment's data.seq_len, at most the model's context


@dataclass
class HfSource:
    """A local Hugging Face directory, read: its config.json, model, tensors and tokenizer specials."""

    directory: Path
    config: dict[str, Any]
    family: str
    model: LanguageModelConfig
    notes: list[str]
    files: SafetensorsFiles
    specials: dict[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, directory: str | os.PathLike) -> HfSource:
        d = Path(directory)
        if not d.is_dir():
            raise MissingFileError(f"SRC={str(d)!r} is not a directory; give a local Hugging Face model directory.")
        if not (d / "config.json").is_file():
            raise MissingFileError(f"SRC={str(d)!r} has no config.json; give a Hugging Face model directory.")
        try:
            config = json.loads((d / "config.json").read_text())
        except json.JSONDecodeError as e:
            raise HfConfigError(f"{str(d / 'config.json')!r} is not valid JSON ({e}).") from None
        family = model_type(config)
        try:  # the configs it is made of check themselves when made; the model's sizes here
            model, notes = model_config(config)
            model.ensure_valid()
        except HfConfigError:
            raise
        except ConfigError as e:
            raise HfConfigError(f"config.json gives a model pax_eqx refuses: {e}") from None
        files = SafetensorsFiles.open(d)
        return cls(d, config, family, model, notes, files, _specials(d, config))

    def dims(self, model: LanguageModelConfig | None = None) -> Dims:
        m = model or self.model
        return Dims(m.model_dims, m.num_heads, m.num_kv_heads or m.num_heads, m.head_dim)

    def experiment(self, job_dir: str | os.PathLike, num_devices: int = 1) -> ExperimentConfig:
        """The experiment of this model: its tokenizer at JOB_DIR/tokenizer/tokenizer.json (written
        by `copy_tokenizer`), the default data (Shakespeare) at up to DEFAULT_SEQ_LEN tokens, the
        parameters sharded over every device (fsdp: a model too large for one device's memory
        still loads), the batches a multiple of the device count."""
        tokenizer = TokenizerJsonConfig(
            path=str((Path(job_dir) / TOKENIZER_DIR / TOKENIZER_FILE).absolute()), **self.specials
        )
        batch = -(-InputConfig().batch_size // num_devices) * num_devices
        data = DataConfig(
            tokenizer=tokenizer, seq_len=min(self.model.max_seq_len, DEFAULT_SEQ_LEN),
            train=DataConfig().train.replace(batch_size=batch), eval=DataConfig().eval.replace(batch_size=batch),
        )  # fmt: skip
        mesh = MeshConfig(ici_mesh_shape=(1, num_devices, 1))
        return ExperimentConfig(name=f"hf_{self.family}", model=self.model, data=data, mesh=mesh)

    def copy_source_config(self, job_dir: str | os.PathLike) -> None:
        """DIR/hf/config.json (and generation_config.json): what export_hf writes back out."""
        out = Path(job_dir) / SOURCE_DIR
        out.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "generation_config.json"):
            if (self.directory / name).is_file():
                shutil.copyfile(self.directory / name, out / name)

    def copy_tokenizer(self, job_dir: str | os.PathLike) -> Path:
        out = Path(job_dir) / TOKENIZER_DIR
        out.mkdir(parents=True, exist_ok=True)
        for name in (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"):
            if (self.directory / name).is_file():
                shutil.copyfile(self.directory / name, out / name)
        return out / TOKENIZER_FILE

    def plan(self, model: LanguageModelConfig, our_names: list[str]) -> WeightPlan:
        """The weight plan for `model` (the experiment's, which flags may have changed: refused
        here if its parameters no longer fit the checkpoint)."""
        if not model.repeat:
            raise HfConfigError(
                "model.repeat=False: import_hf writes the scanned stack's layout ([num_layers, ...] leaves); leave "
                "model.repeat at True (fine-tune with it too)."
            )
        tied = not model.separate_embedding
        plan = weight_plan(self.family, self.dims(model), model.num_layers, our_names, tied)
        check_complete(plan, our_names, set(self.files.names()), self.family)
        return plan

    def load_params(self, abstract_params: Any, shardings: Any, model: LanguageModelConfig) -> Any:
        names = [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(abstract_params)[0]]
        return load_params(abstract_params, shardings, self.plan(model, names), self.files, self.family)


def _specials(d: Path, config: dict[str, Any]) -> dict[str, str]:
    """bos_token / eos_token / pad_token for TokenizerJsonConfig: from tokenizer_config.json, else
    from config.json's ids looked up in tokenizer.json; "" where the model has none."""
    if not (d / TOKENIZER_FILE).is_file():
        other = (
            " (it has tokenizer.model: write a tokenizer.json with transformers' "
            "AutoTokenizer.from_pretrained(SRC).save_pretrained(SRC))"
            if (d / "tokenizer.model").is_file()
            else ""
        )
        raise MissingFileError(f"SRC={str(d)!r} has no tokenizer.json{other}; import_hf needs the model's tokenizer.")
    hf_tokenizers = require("tokenizers", "hf", "python -m pax_eqx.import_hf")
    try:
        tok = hf_tokenizers.Tokenizer.from_file(str(d / TOKENIZER_FILE))
    except Exception as e:  # noqa: BLE001 -- the Rust library raises a bare Exception for any unreadable file
        raise HfConfigError(
            f"{d / TOKENIZER_FILE} is not a tokenizer the tokenizers library can read ({' '.join(str(e).split())}); "
            "copy the model's tokenizer.json again (transformers' save_pretrained writes one)."
        ) from None
    named: dict[str, Any] = {}
    if (d / "tokenizer_config.json").is_file():
        named = json.loads((d / "tokenizer_config.json").read_text())
    out = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        value = named.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            ids = config.get(f"{key}_id")
            ids = ids[0] if isinstance(ids, list) and ids else ids
            value = tok.id_to_token(ids) if isinstance(ids, int) else None
        if value is not None and tok.token_to_id(value) is None:
            value = None
        out[key] = value or ""
    if not out["eos_token"]:
        raise HfConfigError(
            f"SRC={str(d)!r}: no end-of-sequence token is named (tokenizer_config.json eos_token or config.json "
            "eos_token_id); documents end with it. Add one to tokenizer_config.json."
        )
    return out
