"""A kind is asked, not tested (issue 47): no code compares which data source or decode strategy
it holds (`data.source == "jsonl"`, `cfg.beam_size > 1`, `source.kind in (...)`), or tests a
variant's class with isinstance, outside the variant's own class. An AST scan of pax_eqx."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[2] / "pax_eqx"
OWNERS = {"beam_size": {"models/decode_strategies/beam.py", "models/beam_search.py"}}
VARIANT_BASES = {"DataSource", "DecodeStrategy"}


def _name(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


def _found() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    name = _name(side)
                    kind_of = isinstance(side, ast.Attribute) and side.attr == "kind" and _name(side.value) in (
                        "source", "strategy")  # fmt: skip
                    if name == "source" or kind_of or (name == "beam_size" and rel not in OWNERS["beam_size"]):
                        found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Call) and _name(node.func) == "isinstance" and len(node.args) == 2:
                classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                named = {_name(c) for c in classes}
                if any(n and (n.endswith("Source") or n.endswith("Strategy")) for n in named):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_asks_which_source_or_strategy_it_holds():
    assert _found() == []


def test_the_scan_sees_a_comparison():
    tree = ast.parse("if data.source == 'jsonl' or cfg.strategy.kind == 'beam': pass")
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
    assert {_name(c.left) for c in compares} == {"source", "kind"}
