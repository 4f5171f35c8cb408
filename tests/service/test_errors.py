"""The 422 error item: field, bad value (shortened, JSON-safe), message and what is allowed."""

from __future__ import annotations

import json

from ficco.service.errors import MAX_INPUT_CHARS, field_error, scenario_error, short_input
from ficco.service.schemas import ALLOWED


def test_allowed_describes_every_request_field():
    assert ALLOWED["op"] == "one of ['ag_gemm', 'gemm_rs', 'a2a_gemm', 'gemm_a2a']"
    assert ALLOWED["world_size"] == "an int in [2, 8] or null"
    assert ALLOWED["imbalance"] == "a number in [1, 8]"
    assert ALLOWED["name"] == "a string of 1 to 200 characters or null"


def test_short_input_is_json_safe_and_short():
    assert short_input(float("inf")) == "inf"
    assert short_input(3) == 3 and short_input(None) is None
    long = short_input({"a": "x" * 1000})
    assert len(long) == MAX_INPUT_CHARS + 3 and long.endswith("...")
    json.dumps(short_input([float("nan")]))


def test_field_error_locates_list_items_by_their_list():
    error = field_error(["body", "tokens", 2], 7, "Value error, tokens must be ...")
    assert (error["field"], error["msg"], error["allowed"]) == (
        "tokens.2",
        "tokens must be ...",
        ALLOWED["tokens"],
    )
    assert field_error(["body"], {}, "bad")["field"] == "body"


def test_scenario_error_uses_the_field_the_message_names():
    values = {"m": 7, "world_size": 2}
    error = scenario_error(
        ValueError("Scenario.m must be divisible by world_size=2; got 7"), ["body"], values
    )
    assert (error["loc"], error["input"]) == (["body", "m"], 7)
    other = scenario_error(ValueError("something else"), ["body", "scenarios", 1], values)
    assert other["loc"] == ["body", "scenarios", 1]
