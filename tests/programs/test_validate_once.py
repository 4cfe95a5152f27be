"""Validation runs once (issue 47): each config checks its own fields when it is made, the
experiment checks only what crosses configs, and builders trust what they are given. Every
`validate` / `check` a command runs is counted per config object: none may run twice on one
object in one command (they used to: 37 configs checked themselves when made and again in
ExperimentConfig.validate, and the decode settings were checked three times a run)."""

from __future__ import annotations

import collections
import functools

import jax
import pytest

from pax_eqx import config as config_module
from pax_eqx.command_line import cli
from pax_eqx.data.data_source import DataSource


def _config_classes() -> list[type]:
    found, todo = [], [config_module.Config]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if "_specialised_from" not in vars(sub) and sub not in found:  # a diamond reaches a class twice
                found.append(sub)
                todo.append(sub)
    return found


@pytest.fixture
def calls(monkeypatch):
    """{(class, method): Counter of the ids of the objects it ran on} while the test runs."""
    counted: dict = collections.defaultdict(collections.Counter)
    alive = []  # every object counted stays alive, so no id is reused by a later object
    for cls in _config_classes():
        for name in ("validate", "check", "check_devices"):
            method = vars(cls).get(name)
            if method is None:
                continue

            @functools.wraps(method)
            def counting(self, *args, _method=method, _key=(cls.__qualname__, name), **kwargs):
                counted[_key][id(self)] += 1
                alive.append(self)
                return _method(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, counting)
    return counted


def _twice(counted) -> dict:
    return {key: n for key, ids in counted.items() for n in ids.values() if n > 1}


@pytest.mark.parametrize(
    "args",
    [
        ["--exp", "shakespeare_char", "--model.num-layers", "1", "--decode.strategy", "beam"],
        ["--exp", "shakespeare_span_corruption", "--data.train.batch-size", "4"],
        ["--exp", "digits_resnet", "--data.augment.crop-padding", "2"],
    ],
)
def test_no_check_runs_twice_in_one_command(calls, args):
    exp, _, _ = cli.parse(args, "train", "", job_dir_required=False, saved_experiment=True)
    exp.validate(num_devices=1, num_hosts=1)  # the entry point's one validation
    assert calls[("ExperimentConfig", "validate")]
    assert any(key[1] == "check" and issubclass(DataSource, object) for key in calls)  # the source's was run
    assert _twice(calls) == {}, _twice(calls)


def test_builders_trust_what_they_are_given(calls):
    """The run's builders (tokenizer, both inputs, the Task and its model) check nothing again."""
    from pax_eqx.data import build_input, build_tokenizer
    from pax_eqx.programs.runtime import build_task

    args = ["--exp", "shakespeare_char", "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims",
            "64", "--model.num-heads", "2"]  # fmt: skip
    exp, _, _ = cli.parse(args, "train", "", job_dir_required=False, saved_experiment=True)
    exp.validate(num_devices=1, num_hosts=1)
    tokenizer = build_tokenizer(exp.data)
    for split in ("train", "eval"):
        build_input(exp.data, split, tokenizer, num_infeed_hosts=1, infeed_host_index=0).get_next()
    build_task(exp).init_state(jax.random.key(0))
    assert _twice(calls) == {}, _twice(calls)
