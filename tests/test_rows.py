"""rows.py: parsing a row and applying -p overrides."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollfilter.rows import apply_params, field_value, parse_row

PARAMS = st.recursive(
    st.integers() | st.text(max_size=2), lambda inner: st.dictionaries(st.sampled_from("ab"), inner, max_size=2)
)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{", "invalid JSON"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b'{"a": "\xff"}', "invalid UTF-8"),
        (b"[]", "a JSON array"),
        (b"3", "a JSON number"),
        (b"null", "a JSON null"),
        (b'{"a": NaN}', "NaN and Infinity"),
        (b'{"a": 1e400}', "invalid JSON"),
        (b"[" * 50_000, "invalid JSON"),
    ],
)
def test_parse_row_reasons(line: bytes, reason: str):
    parsed = parse_row(line)
    assert isinstance(parsed, str)
    assert reason in parsed


def test_parse_row_keeps_big_integers_and_key_order():
    assert parse_row(b'{"b": 1, "a": 123456789012345678901234567890}') == {
        "b": 1,
        "a": 123456789012345678901234567890,
    }


def test_apply_params_dotted_and_conflicts():
    row: dict[str, Any] = {"responses_create_params": {"input": "x", "reasoning": "flat"}}
    assert apply_params(row, [("temperature", 0.5), ("text.format", "json")]) is None
    assert row["responses_create_params"]["text"] == {"format": "json"}
    assert apply_params(row, [("reasoning.effort", "high")]) is not None


@given(params=PARAMS, key=st.lists(st.sampled_from("ab"), min_size=1, max_size=4).map(".".join))
def test_a_param_that_cannot_be_set_names_the_value_in_its_way(params: Any, key: str):
    row = {"responses_create_params": params}
    reason = apply_params(row, [(key, "set")])
    if reason is None:
        value: Any = row["responses_create_params"]
        for part in key.split("."):
            value = value[part]
        assert value == "set"
        return
    where = reason.removeprefix(f"cannot set the param {key}: ").removesuffix(" is not an object").split(".")
    assert where[0] == "responses_create_params"
    assert key.split(".")[: len(where) - 1] == where[1:]  # a parent on the key's own path...
    value = row
    for part in where:
        assert isinstance(value, dict)
        value = value[part]
    assert not isinstance(value, dict)  # ...which is not an object


def test_a_param_on_a_row_whose_params_are_a_string_names_them():
    row = {"responses_create_params": "hello"}
    assert apply_params(row, [("temperature", 0.5)]) == (
        "cannot set the param temperature: responses_create_params is not an object"
    )


def test_field_value_follows_a_dotted_path_and_a_key_with_dots_comes_first():
    result = {"reward": 1, "reward_components": {"format": 0.5}, "a.b": 2, "a": {"b": 3}, "s": "x"}
    assert field_value(result, "reward") == 1
    assert field_value(result, "reward_components.format") == 0.5
    assert field_value(result, "a.b") == 2
    assert field_value(result, "reward_components.missing") is None
    assert field_value(result, "s.t") is None
    assert field_value(result, "reward.x") is None
