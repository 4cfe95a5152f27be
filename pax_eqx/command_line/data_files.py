"""A prepared directory configures itself: what the data's own files say, unless a flag says otherwise.

`--data.source array_record --data.path DIR` alone trains: DIR's manifest names the tokenizer the
corpus was tokenized with (and the length of pre-packed rows), so the experiment takes them
(`DataSource.configured`), and the model's vocabulary follows that tokenizer when the
experiment's own was sized for another one. A flag the user gave is kept (`--data.tokenizer ...`,
`--data.seq-len`, `--model.vocab-size`); where it contradicts the manifest, the source's check
refuses it naming both values before anything is written. The experiment's default prompt, if
the corpus's tokenizer cannot encode it ("ROMEO:" in a vocabulary of lower-case pieces), becomes
the corpus's first words instead of an error; a prompt the user gave is never changed.
"""

from __future__ import annotations

from collections.abc import Sequence

from pax_eqx.data import build_input, build_tokenizer, required_vocab_size
from pax_eqx.experiment import ExperimentConfig

_PROMPT_TOKENS = 8  # the corpus's first tokens that replace an unencodable default prompt


def _given(args: Sequence[str], *paths: str) -> bool:
    """Whether a flag of `args` sets one of the dotted `paths` or a field below it."""
    flags = [a[2:].split("=", 1)[0].replace("-", "_") for a in args if a.startswith("--")]
    return any(f == p or f.startswith(p + ".") for f in flags for p in paths)


def follow_data_files(exp: ExperimentConfig, args: Sequence[str]) -> ExperimentConfig:
    """`exp` with what its data's files say adopted where no flag of `args` set it (module doc)."""
    classes = exp.data.source.classes_in_files()
    if classes is not None and not _given(args, "model.num_classes"):
        exp = exp.replace(model=exp.model.with_num_classes(classes))
    data = exp.data
    said = data.source.configured(data)
    if said == data:
        return exp
    adopted = {
        name: getattr(said, name)
        for name in ("tokenizer", "seq_len")
        if getattr(said, name) != getattr(data, name) and not _given(args, f"data.{name}")
    }
    if not adopted:
        return exp
    exp = exp.replace(data=data.replace(**adopted))
    if "tokenizer" not in adopted:
        return exp
    tokenizer = build_tokenizer(exp.data)
    if exp.model.token_vocab_size() is not None and not _given(args, "model.vocab_size"):
        # The experiment's vocabulary was sized for its own tokenizer, not this corpus's.
        exp = exp.replace(model=exp.model.with_token_vocab_size(required_vocab_size(exp.data, tokenizer)))
    prompt = exp.decode.prompt
    if exp.model.decodes and prompt and tokenizer.unknown_characters(prompt) and not _given(args, "decode.prompt"):
        first = build_input(exp.data, "eval", tokenizer, num_infeed_hosts=1, infeed_host_index=0).get_next()
        text = tokenizer.decode(first["ids"][0][1 : 1 + _PROMPT_TOKENS]).strip()
        exp = exp.replace(decode=exp.decode.replace(prompt=text))
    return exp
