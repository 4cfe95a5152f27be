"""The tutorials in docs/tutorials run, print what they say, and use only public names."""

import ast
import contextlib
import io
import pathlib
import re
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx import layers
from pax_eqx.command_line import registry

TUTORIALS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "tutorials"
LAYER_BASICS = TUTORIALS / "layer_basics.py"
LEARNING_PAX = TUTORIALS / "learning_pax.py"


@pytest.fixture(scope="module")
def layer_basics():
    """Runs the tutorial once as a script; returns its globals and its printed `name: value` lines."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        namespace = runpy.run_path(str(LAYER_BASICS), run_name="__main__")
    printed = dict(line.partition(": ")[::2] for line in out.getvalue().splitlines())
    return namespace, printed


def test_layer_basics_prints_the_collections(layer_basics):
    _, printed = layer_basics
    assert printed["moving_mean (initial)"] == "[0.0, 0.0]"
    assert printed["moving_mean (updated)"] == "[1.0, 1.0]"
    assert printed["moving_mean after 3 steps"] == "[3.0, 3.0]"
    assert printed["mean-synced variables"] == "['FeedForward.moving_mean#mean_sync']"
    assert printed["params"] == "{'.linear.w': (1, 2), '.bias.b': (2,)}"
    assert printed["gradient leaves"] == "[(1, 2), (2,)]"
    assert "Did you mean 'output_dims'?" in printed["typo"]
    assert printed["outputs"] == printed["outputs (mutable)"]


def test_layer_basics_outputs_match_the_formula(layer_basics):
    """relu((inputs + uniform noise) @ w + b), recomputed here from the tutorial's keys."""
    ns, printed = layer_basics
    ffn, _ = layers.init(ns["ffn_cfg"], ns["init_key"])  # the weights before the SGD steps
    inputs = np.asarray(ns["inputs"], np.float64)
    # Context.next_key splits the key it holds and hands out the second half.
    noise = np.asarray(jax.random.uniform(jax.random.split(ns["noise_key"])[1], inputs.shape, jnp.float32))
    expected = np.maximum((inputs + noise) @ np.asarray(ffn.linear.w) + np.asarray(ffn.bias.b), 0.0)
    np.testing.assert_allclose(ns["outputs"], expected, rtol=1e-5, atol=1e-6)
    assert np.any(expected == 0) and np.any(expected > 0)  # the ReLU is visibly at work
    np.testing.assert_allclose(np.asarray(ast.literal_eval(printed["outputs"])), expected, atol=1e-4)
    ctx = ns["ctx"]
    np.testing.assert_allclose(ctx.summaries["inputs_mean"], inputs.mean(), rtol=1e-6)
    np.testing.assert_allclose(ctx.aux_losses["dummy_aux_loss"], expected.mean(), rtol=1e-5)
    assert ast.literal_eval(printed["aux_losses"]) == {"dummy_aux_loss": round(float(expected.mean()), 4)}
    # apply(mutable=True) returned a new state; the initial one is unchanged.
    np.testing.assert_array_equal(ns["initial_state"].get(ns["ffn"].moving_mean), [0.0, 0.0])


def test_layer_basics_feedforward_is_under_40_lines():
    text = LAYER_BASICS.read_text()
    block = text.split("# [feedforward-start]")[1].split("# [feedforward-end]")[0]
    assert 10 < len(block.strip().splitlines()) < 40


def test_layer_basics_uses_only_public_pax_eqx_names():
    tree = ast.parse(LAYER_BASICS.read_text())
    allowed_modules = {"equinox", "jax", "jax.numpy", "numpy", "jaxtyping", "pax_eqx", "pax_eqx.config"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {alias.name for alias in node.names} <= allowed_modules
        if isinstance(node, ast.ImportFrom):
            assert node.module in allowed_modules, node.module
            assert all(not alias.name.startswith("_") for alias in node.names)
            if node.module == "pax_eqx":
                assert [alias.name for alias in node.names] == ["layers"]
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "layers":
            assert node.attr in layers.__all__, f"layers.{node.attr} is not public"


def test_pax_to_pax_eqx_names_only_layers_that_exist():
    """docs/pax_to_pax_eqx.md stays accurate for pax_eqx.layers as the code changes."""
    text = (TUTORIALS.parent / "pax_to_pax_eqx.md").read_text()
    # `layers.X` names a layer; `stack.layers.X` is a parameter path inside a stack, not one.
    named = set(re.findall(r"(?<!stack\.)\blayers\.([A-Za-z_]\w*)", text))
    praxis_layers = text.split("## Praxis layers")[1].split("## Key components")[0]
    named |= set(re.findall(r"\b([A-Z]\w*Config)\b", praxis_layers))
    assert named, "the map names no layers"
    missing = sorted(name for name in named if not hasattr(layers, name))
    assert not missing, f"docs/pax_to_pax_eqx.md names layers that do not exist: {missing}"


def test_resnet_on_digits_trains_and_evaluates_every_held_out_image():
    """docs/tutorials/resnet_on_digits.py: a ResNet composed in user code learns the digits in
    60 steps, and its eval counts each of the 180 held-out images once."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(TUTORIALS / "resnet_on_digits.py"), run_name="__main__")
    printed = dict(line.partition(": ")[::2] for line in out.getvalue().splitlines())
    assert printed["eval images"] == "180"
    assert float(printed["eval accuracy"]) > 0.85


@pytest.fixture(scope="module")
def learning_pax():
    """Runs docs/tutorials/learning_pax.py once; returns its printed `name: value` lines. The
    experiment it registers is removed afterwards, so tests that walk every registered
    experiment in this process see only the real ones."""
    registry.load_entry_points()
    saved = dict(registry._REGISTRY), dict(registry._ALIASES)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(LEARNING_PAX), run_name="__main__")
    finally:
        for table, before in zip((registry._REGISTRY, registry._ALIASES), saved, strict=True):
            table.clear()
            table.update(before)
    return dict(line.partition(": ")[::2] for line in out.getvalue().splitlines())


def test_learning_pax_walks_layer_model_and_task(learning_pax):
    """The tutorial checks its numbers against formulas itself; here, what it prints."""
    assert learning_pax["vmap(squared_norm)"] == "[5.0, 20.0]"
    assert learning_pax["summaries"] == "['eval', 'train']"
    assert "Did you mean 'norm_decay'?" in learning_pax["typo"]
    assert learning_pax["registered"] == "True"
    assert float(learning_pax["eval accuracy after 31 steps"]) > 0.8


def test_learning_pax_trains_through_the_cli_into_a_job_dir(learning_pax):
    written = "['checkpoints', 'command.txt', 'config.json', 'metrics.jsonl', 'plots', 'summaries', 'train.log']"
    assert learning_pax["job dir"] == written
    assert learning_pax["checkpoints after 40 steps"] == "[20, 40]"
    assert learning_pax["checkpoints after resuming to 60"] == "[40, 60]"
    assert learning_pax["train records at steps"] == "[10, 20, 30, 40, 50, 60]"
    assert learning_pax["eval records at steps"] == "[20, 40, 60]"
    assert float(learning_pax["eval accuracy at step 60"]) > 0.85
    assert "learning_pax_digits" not in registry.names()  # the fixture put the registry back


def test_learning_pax_imports_no_private_names():
    for node in ast.walk(ast.parse(LEARNING_PAX.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert not node.module.split(".")[-1].startswith("_"), node.module
            assert all(not alias.name.startswith("_") for alias in node.names)
