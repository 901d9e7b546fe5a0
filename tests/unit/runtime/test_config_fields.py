"""What a node config's entries may hold (runtime/config_fields.py, issue 46 item 4): each
field typed, finite and in range, table by table; model names in the catalog's grammar
(core/model_spec.py ``MODEL_NAME``); a node TOML that breaks either is one line at start (exit
status 2) naming the file, the model and the field, never a node that starts and stops."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from talaria.cli import app
from talaria.core.catalog import load_catalog
from talaria.core.catalog_error import CatalogError
from talaria.core.model_spec import model_name_fault
from talaria.runtime import serve
from talaria.runtime.config import NodeConfigError, load_node_config
from talaria.runtime.config_fields import (
    NODE_FIELDS,
    RATE_FIELDS,
    UPSTREAM_FIELDS,
    VLLM_FIELDS,
    Field,
    FieldError,
    check_fields,
)
from talaria.runtime.engine_kinds import ENGINES
from talaria.runtime.engines.timing import RateModel
from talaria.runtime.engines.upstream.options import KNOWN, UPSTREAM_RATES, UpstreamOptions
from talaria.runtime.placement_rules import UPSTREAM_PLACEABLE, VLLM_PLACEABLE
from talaria.runtime.scheduling.config import SchedulerConfig
from tests.support import flat

runner = CliRunner()

SECONDS = Field("float", 0, 60, above=True, unit="s")
TOKENS = Field("int", 1, 2**24, unit="tokens")


@pytest.mark.parametrize(
    ("field", "value", "refusal"),
    [
        (SECONDS, 1, None),  # an integer is a number
        (SECONDS, 0.5, None),
        (SECONDS, 60.0, None),  # the high end is in
        (SECONDS, 0, "must be in (0, 60] s, not 0"),  # the open low end is out
        (SECONDS, 60.5, "must be in (0, 60] s, not 60.5"),
        (SECONDS, "1e-4", "must be a number, not the string '1e-4'"),  # a quoted number
        (SECONDS, True, "must be a number, not true"),  # a bool is not a number
        (SECONDS, None, "must be a number, not NoneType"),
        (SECONDS, [1], "must be a number, not list"),
        (SECONDS, math.nan, "must be a finite number, not nan"),
        (SECONDS, math.inf, "must be a finite number, not inf"),
        (SECONDS, -math.inf, "must be a finite number, not -inf"),
        (SECONDS, 1e308, "must be in (0, 60] s, not 1e+308"),
        (SECONDS, 10**400, "must be a finite number, not a huge integer"),
        (TOKENS, 2048, None),
        (TOKENS, 2048.0, "must be an integer, not 2048"),
        (TOKENS, 0, "must be in [1, 1.67772e+07] tokens, not 0"),
        (TOKENS, "2048", "must be an integer, not the string '2048'"),
        (TOKENS, False, "must be an integer, not false"),
        (Field("str"), "x", None),
        (Field("str"), 1, "must be a string, not 1"),
        (Field("bool"), False, None),
        (Field("bool"), "false", "must be true or false, not the string 'false'"),
        (Field("bool"), 0, "must be true or false, not 0"),
        (Field("table"), {}, None),
        (Field("table"), "{}", "must be a table, not the string '{}'"),
        (Field("any"), object(), None),
    ],
)
def test_a_field_refuses_what_its_row_does_not_allow(
    field: Field, value: Any, refusal: str | None
) -> None:
    assert field.refusal(value) == refusal


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"rates": {"prefill_s_per_token": "1e-4"}}, "rates.prefill_s_per_token must be a number"),
        ({"rates": {"wake_s": math.nan}}, "rates.wake_s must be a finite number, not nan"),
        ({"rates": {"decode_step_s": 1e308}}, "rates.decode_step_s must be in [0, 60] s"),
        ({"rates": {"kv_wake_s": -1}}, "rates.kv_wake_s must be in [0, 3600] s, not -1"),
        ({"rates": {"warp_s": 1}}, "rates: unknown keys ['warp_s']; it may hold prefill_s"),
        ({"rates": [1e-4]}, "rates must be a table, not list"),
        ({"context_window": "32768"}, "context_window must be an integer, not the string"),
        ({"weight_bytes": math.inf}, "weight_bytes must be a finite number, not inf"),
        ({"weight_bytes": 1e16}, "weight_bytes must be in [0, 1e+15] bytes"),
        ({"device_bytes": 0}, "device_bytes must be in (0, 1e+15] bytes, not 0"),
        ({"timeout_s": True}, "timeout_s must be a number, not true"),
        ({"staging": "yes"}, "staging must be true or false"),
        # a key no row lists is left to its engine, but its numbers must be finite anywhere
        ({"sampling": {"temperature": math.nan}}, "sampling.temperature must be a finite"),
        ({"extra": [1.0, math.inf]}, "extra[1] must be a finite number, not inf"),
    ],
)
def test_an_upstream_entry_is_refused_by_the_field_that_fails(
    options: dict[str, Any], error: str
) -> None:
    with pytest.raises(FieldError) as refused:
        check_fields(UPSTREAM_FIELDS, options)
    assert error in str(refused.value)


def test_good_entries_and_every_default_pass() -> None:
    check_fields(UPSTREAM_FIELDS, {"url": "http://h:1", "rates": {"wake_s": 5}, "timeout_s": 60})
    check_fields(VLLM_FIELDS, {"max_model_len": 2048, "gpu_memory_utilization": 0.45})
    check_fields(VLLM_FIELDS, {"sleep_level": 2})
    with pytest.raises(FieldError, match=r"sleep_level must be in \[1, 2\], not 3"):
        check_fields(VLLM_FIELDS, {"sleep_level": 3})
    check_fields(NODE_FIELDS, {"name": "n", "quantum_s": 30, "time_scale": 500, "gpus": "0-3"})
    for rates in (RateModel(), UPSTREAM_RATES):
        check_fields(RATE_FIELDS, dataclasses.asdict(rates))
    defaults = UpstreamOptions("http://h/v1", "m")
    check_fields(UPSTREAM_FIELDS, {"weight_bytes": defaults.weight_bytes,
                                   "timeout_s": defaults.timeout_s})  # fmt: skip


def test_each_table_declares_the_fields_its_engine_reads() -> None:
    """The tables cover what they stand for: every ``RateModel`` field, every option the
    upstream engine knows, every option a placed model of either engine may set."""
    assert set(RATE_FIELDS) == {f.name for f in dataclasses.fields(RateModel)}
    assert set(UPSTREAM_FIELDS) == set(KNOWN) >= set(UPSTREAM_PLACEABLE)
    assert set(VLLM_FIELDS) == set(VLLM_PLACEABLE)
    assert ENGINES["vllm"].fields is VLLM_FIELDS and ENGINES["openai"].fields is UPSTREAM_FIELDS


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("glm-4.5-fp8", True),
        ("deepseek-v3.1", True),
        ("qwen3-8b-iq4_xs", True),  # a GGUF file's served name
        ("glm-4.5-fp8@short-ctx", True),  # a variant
        ("a" * 128, True),
        ("a" * 129, False),
        ("org/model", False),
        ("../x", False),
        ("-x", False),
        ("Qwen3-8B", False),
        ("a b", False),
        ("a@b@c", False),
        ("a@", False),
        ("", False),
        ("x%2Fy", False),
    ],
)
def test_model_names_follow_the_catalogs_grammar(name: str, ok: bool) -> None:
    assert (model_name_fault(name) is None) == ok


def test_every_shipped_catalog_name_is_in_the_grammar() -> None:
    assert all(model_name_fault(name) is None for name in load_catalog().models)


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("layers", '"92"', "layers must be a number, not '92'"),
        ("weight_bytes", "nan", "weight_bytes must be finite, not nan"),
        ("weight_bytes", "true", "weight_bytes must be a number, not True"),
        ("name", '"Org/Model"', "is not a model name"),
    ],
)
def test_a_catalog_number_is_typed_and_finite(
    tmp_path: Path, field: str, value: str, error: str
) -> None:
    lines = [
        f"{k} = {value}" if k == field else f"{k} = {v!r}".replace("'", '"')
        for k, v in dataclasses.asdict(load_catalog().model("tiny-a")).items()
        if not isinstance(v, bool)
    ]
    (tmp_path / "m.toml").write_text("[model]\n" + "\n".join(lines) + "\n")
    with pytest.raises(CatalogError, match=re.escape(error)):
        load_catalog([tmp_path])


# -- a node TOML at start ----------------------------------------------------------------------

NODE = """
[node]
name = "n0"
quantum_s = {quantum}

[[model]]
name = "glm-4.5-fp8"
engine = "sim"

[[model]]
name = "{name}"
engine = "openai"
url = "http://127.0.0.1:9/v1"
rates = {{ prefill_s_per_token = {rate} }}
"""


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"rate": '"1e-4"'}, "rates.prefill_s_per_token", "must be a number, not the string"),
        ({"rate": "nan"}, "rates.prefill_s_per_token", "must be a finite number, not nan"),
        ({"rate": "inf"}, "rates.prefill_s_per_token", "must be a finite number, not inf"),
        ({"rate": "1e308"}, "rates.prefill_s_per_token", "must be in [0, 1] s per token"),
        ({"rate": "true"}, "rates.prefill_s_per_token", "must be a number, not true"),
        ({"name": "org/up"}, "model name 'org/up'", "is not a model name"),
        ({"quantum": '"30"'}, "[node]: quantum_s", "must be a number, not the string '30'"),
        ({"quantum": "nan"}, "[node]: quantum_s", "must be a finite number"),
        (
            {"quantum": "30\nclass_slowdown = 0.5"},
            "[node]: class_slowdown",
            "must be in [1, 100] × a step, not 0.5",
        ),
        (
            {"quantum": "30\npreempt_limit = 1.5"},
            "[node]: preempt_limit",
            "must be an integer, not 1.5",
        ),
        (
            {"quantum": "30\nstarvation_quanta = 0"},
            "[node]: starvation_quanta",
            "must be in (0, 10000] quanta, not 0",
        ),
    ],
)
def test_a_bad_number_or_name_in_a_node_toml_is_one_line_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict[str, str], field: str,
    reason: str,
) -> None:  # fmt: skip
    started: list[object] = []
    monkeypatch.setattr(serve, "serve_runtime", lambda *args: started.append(args))
    monkeypatch.delenv("TALARIA_RUNTIME_TOKEN", raising=False)
    config = tmp_path / "node.toml"
    config.write_text(NODE.format(**({"quantum": 30, "name": "up", "rate": 2e-5} | change)))
    result = runner.invoke(app, ["runtime", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert started == []
    text = flat(result.output)
    assert str(config) in text and field in text and reason in text, text
    assert "Traceback" not in result.output
    if "rate" in change:  # the model is named
        assert f"{config}: model up: rates.prefill_s_per_token" in text
    with pytest.raises(NodeConfigError):
        load_node_config(config)


def test_the_fair_queues_bounds_come_from_the_node_toml(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    base = NODE.format(quantum=30, name="up", rate=2e-5)
    config.write_text(base)
    defaults = load_node_config(config).scheduler_config()
    assert defaults == SchedulerConfig(quantum_s=30.0)  # nothing set: SchedulerConfig's own
    bounds = "\nclass_slowdown = 1.5\npreempt_limit = 0\nstarvation_quanta = 4.0\n"
    config.write_text(base.replace("quantum_s = 30\n", "quantum_s = 30" + bounds))
    chosen = load_node_config(config).scheduler_config()
    assert (chosen.class_slowdown, chosen.preempt_limit, chosen.starvation_quanta) == (1.5, 0, 4.0)
    assert chosen.quantum_s == 30.0


def test_a_model_listed_twice_in_a_node_toml_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text('[[model]]\nname = "glm-4.5-fp8"\n\n[[model]]\nname = "glm-4.5-fp8"\n')
    with pytest.raises(NodeConfigError, match=re.escape("model glm-4.5-fp8 listed twice")):
        load_node_config(config)
