"""Configs: typos fail at once with a suggestion; JSON round trips; tyro parses nested configs."""

import dataclasses
import json

import pytest
import tyro

from pax_eqx.command_line import cli
from pax_eqx.config import Config, ConfigError, check_number, check_range, config, require_positive
from pax_eqx.layers import (
    ActivationConfig,
    AttentionConfig,
    LinearConfig,
    MLPBlockConfig,
    StackedTransformerConfig,
    TransformerConfig,
    WeightInit,
    gaussian,
    swiglu,
)
from pax_eqx.layers.normalizations import LayerNormConfig, RmsNormConfig


def _stack() -> StackedTransformerConfig:
    block = TransformerConfig(
        norm_policy="primer_hybrid",
        norm=RmsNormConfig(epsilon=1e-5),
        attention=AttentionConfig(logit_cap=30.0, implementation="xla"),
        activation=swiglu(),
        residual_dropout_prob=0.1,
    )
    return StackedTransformerConfig(
        num_layers=3, model_dims=16, hidden_dims=64, num_heads=4, num_kv_heads=2, use_rotary=True,
        init=gaussian(0.02), block=block, repeat=False, remat_policy="full", unroll=1,
    )  # fmt: skip


# Typos --------------------------------------------------------------------------------------
def test_constructor_typo_names_the_field_and_suggests():
    with pytest.raises(ConfigError, match=r"LinearConfig has no field 'input_dim'\. Did you mean 'input_dims'\?"):
        LinearConfig(input_dim=3, output_dims=4)


def test_constructor_lists_valid_fields():
    with pytest.raises(ConfigError, match="Valid fields: axes, fp8, init, input_dims, output_dims"):
        LinearConfig(zzz=1, input_dims=3, output_dims=4)


def test_positional_arguments_are_refused():
    with pytest.raises(ConfigError, match="keyword arguments only"):
        LinearConfig(3, 4)


def test_replace_typo():
    with pytest.raises(ConfigError, match="'hiden_dims'.*'hidden_dims'"):
        _stack().replace(hiden_dims=8)


def test_override_typo_at_any_depth():
    with pytest.raises(ConfigError, match="StackedTransformerConfig has no field 'blok'.*'block'"):
        _stack().override("blok.norm_policy", "pre")
    with pytest.raises(ConfigError, match="AttentionConfig has no field 'logit_cp'.*'logit_cap'"):
        _stack().override("block.attention.logit_cp", 1.0)


def test_a_size_the_parent_decides_is_not_a_child_field():
    """A layer's sizes come from its parent at build time: the child config has no field for them,
    so a value given there fails at once instead of being overwritten."""
    with pytest.raises(ConfigError, match="TransformerConfig has no field 'model_dims'"):
        _stack().override("block.model_dims", 8)
    with pytest.raises(ConfigError, match="AttentionConfig has no field 'num_kv_heads'"):
        _stack().override("block.attention.num_kv_heads", 1)
    with pytest.raises(ConfigError, match="LayerNormConfig has no field 'dims'"):
        LayerNormConfig(dims=8)


def test_override_into_a_non_config_fails():
    with pytest.raises(ConfigError, match="is not a config"):
        _stack().override("num_layers.x", 1)


def test_override_sets_a_nested_field_and_leaves_the_original():
    cfg = _stack()
    new = cfg.override("block.attention.logit_cap", 1.0)
    assert new.block.attention.logit_cap == 1.0 and cfg.block.attention.logit_cap == 30.0
    assert new.model_dims == 16 and new.block.norm == cfg.block.norm


def test_from_json_typo_names_the_path():
    data = json.loads(_stack().to_json())
    data["block"]["attention"]["use_bais"] = True
    with pytest.raises(ConfigError, match="AttentionConfig has no field 'use_bais'.*'use_bias'"):
        StackedTransformerConfig.from_json(json.dumps(data))


def test_from_json_bad_literal_names_the_path():
    data = json.loads(_stack().to_json())
    data["block"]["norm_policy"] = "pree"
    with pytest.raises(ConfigError, match=r"StackedTransformerConfig\.block\.norm_policy: 'pree' is not one of"):
        StackedTransformerConfig.from_json(json.dumps(data))


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        LinearConfig(input_dims=1, output_dims=2).input_dims = 3


# JSON ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cfg",
    [
        _stack(),
        _stack().block,
        StackedTransformerConfig(num_layers=1, model_dims=8, hidden_dims=8, num_heads=2),
        MLPBlockConfig(input_dims=3, hidden_dims=5, output_dims=2),
        LinearConfig(input_dims=3, output_dims=4, axes=("mlp", "embed"), init=WeightInit(method="uniform", scale=0.1)),
    ],
    ids=["stack", "transformer", "default_stack", "mlp_block", "linear"],
)
def test_json_round_trip_is_lossless(cfg):
    text = cfg.to_json()
    back = type(cfg).from_json(text)
    assert back == cfg
    assert back.to_json() == text
    assert type(back.to_dict()) is dict


def test_json_round_trip_keeps_tuple_types():
    back = LinearConfig.from_json(LinearConfig(input_dims=1, output_dims=2, axes=("mlp", "embed")).to_json())
    assert back.axes == ("mlp", "embed") and isinstance(back.axes, tuple)


def test_json_of_a_nested_config_is_readable():
    data = json.loads(_stack().to_json())
    assert data["num_kv_heads"] == 2 and data["block"]["attention"]["logit_cap"] == 30.0
    assert data["block"]["activation"] == {"gated": True, "name": "silu", "negative_slope": 0.01}


def test_a_user_config_gets_the_same_guarantees():
    @config
    class MyConfig(Config):
        width: int = 4
        ff: ActivationConfig = ActivationConfig()

    cfg = MyConfig(width=8, ff=ActivationConfig(name="gelu"))
    assert MyConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="'widht'.*'width'"):
        MyConfig(widht=3)


# tyro ---------------------------------------------------------------------------------------
def test_the_command_line_parses_a_nested_config_and_switches_its_choices():
    args = [
        "--num-layers", "4",
        "--no-repeat",  # booleans are flags
        "--remat-policy", "dots_with_no_batch_dims_saveable",
        "--model-dims", "32",
        "--num-kv-heads", "1",
        "--init.method", "gaussian",
        "--init.scale", "0.02",
        "--block.norm.epsilon", "1e-3",  # a field of the variant switched to, before the switch
        "--block.norm", "layer_norm",
        "--block.attention.no-causal",
        "--block.activation.name", "gelu",
    ]  # fmt: skip
    cfg = cli.parse_fields(_stack(), args, "test")
    block = _stack().block
    expected = _stack().replace(
        num_layers=4, model_dims=32, num_kv_heads=1, init=gaussian(0.02), repeat=False,
        remat_policy="dots_with_no_batch_dims_saveable",
        block=block.replace(
            norm=LayerNormConfig(epsilon=1e-3),  # the switch starts from layer_norm's defaults, but epsilon is shared
            attention=block.attention.replace(causal=False),
            activation=block.activation.replace(name="gelu"),
        ),
    )  # fmt: skip
    assert cfg == expected


def test_tyro_overrides_a_default_instance():
    cfg = tyro.cli(StackedTransformerConfig, default=_stack(), args=["--block.attention.logit-cap", "50"])
    assert cfg == _stack().override("block.attention.logit_cap", 50.0)


def test_tyro_rejects_a_bad_choice(capsys):
    with pytest.raises(SystemExit):
        tyro.cli(StackedTransformerConfig, default=_stack(), args=["--remat-policy", "dots"])
    assert "remat-policy" in capsys.readouterr().err


# Range checks -------------------------------------------------------------------------------
@config
class _Ranged(Config):
    steps: int = 1
    rate: float = 0.5
    sizes: tuple[int, ...] = (2, 3)
    name: str = ""


@pytest.mark.parametrize(
    "where, value, bounds, message",
    [
        ("a.warmup_steps", -1, dict(integer=True, ge=0), "a.warmup_steps must be >= 0, got -1."),
        ("x.steps", 1.5, dict(integer=True, ge=0), "x.steps must be an int >= 0, got 1.5."),
        ("x.steps", True, dict(integer=True, ge=0), "x.steps must be an int >= 0, got True."),
        ("x.steps", 2**31, dict(integer=True, ge=0), "x.steps must be <= 2147483647 (int32), got 2147483648."),
        ("x.steps", -(2**31) - 1, dict(integer=True), "x.steps must be >= -2147483648 (int32), got -2147483649."),
        ("x.rate", float("nan"), dict(ge=0, lt=1), "x.rate must be a finite number in [0, 1), got nan."),
        ("x.rate", float("-inf"), dict(), "x.rate must be a finite number, got -inf."),
        ("x.rate", "0.5", dict(gt=0), "x.rate must be a number > 0, got '0.5'."),
        ("x.rate", 1.0, dict(gt=0, lt=1, note="1 = off"), "x.rate must be in (0, 1) (1 = off), got 1.0."),
        ("x.seed", 2**32, dict(integer=True, ge=0, le=2**32 - 1), "x.seed must be in [0, 4294967295], got 4294967296."),
        ("x.n", 0, dict(integer=True, gt=0, fix="Pass e.g. --x.n 4."), "x.n must be > 0, got 0. Pass e.g. --x.n 4."),
    ],
)  # fmt: skip
def test_check_number_names_the_flag_the_bound_and_the_value(where, value, bounds, message):
    with pytest.raises(ConfigError) as error:
        check_number(where, value, **bounds)
    assert str(error.value) == message


@pytest.mark.parametrize(
    "value, bounds", [(0, dict(integer=True, ge=0)), (2**31 - 1, dict(integer=True)), (1, dict(gt=0, le=1))]
)
def test_check_number_accepts_values_in_range(value, bounds):
    check_number("x", value, **bounds)


def test_check_range_reads_the_kind_from_the_annotation_and_checks_tuples_element_by_element():
    check_range(_Ranged(rate=1), "rate", gt=0)  # an int is a float
    with pytest.raises(ConfigError, match=r"^_Ranged.steps must be an int > 0, got 2.0\.$"):
        check_range(_Ranged(steps=2.0), "steps", gt=0)
    with pytest.raises(ConfigError, match=r"^model.sizes\[1\] must be > 0, got 0\.$"):
        check_range(_Ranged(sizes=(2, 0)), ("steps", "sizes"), gt=0, prefix="model")
    with pytest.raises(TypeError, match="not a number"):
        check_range(_Ranged(), "name")


def test_require_positive_checks_the_kind_too():
    with pytest.raises(ConfigError, match=r"^_Ranged.rate must be a finite number > 0, got inf\.$"):
        require_positive(_Ranged(rate=float("inf")), ("rate",))
    with pytest.raises(ConfigError, match=r"^model.steps must be > 0, got 0\.$"):
        require_positive(_Ranged(steps=0), ("steps",), "model")
