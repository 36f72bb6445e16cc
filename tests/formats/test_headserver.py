"""headserver.py: reading agent names from any answer a head server gives."""

from __future__ import annotations

import json

import httpx
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

HEAD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["127.0.0.1", "::1", "agent.example", "8000", "\u00b2", "99999", "a b", "x/y", "u@h", "${port}"]),
    st.lists(st.integers(), max_size=2),
)


HEAD_CONFIGS = st.dictionaries(
    st.one_of(st.text(max_size=8), st.integers()),
    st.one_of(
        HEAD_VALUES,
        st.fixed_dictionaries(
            {"responses_api_agents": st.dictionaries(st.text(max_size=8), st.dictionaries(
                st.sampled_from(["host", "port", "entrypoint"]), HEAD_VALUES, max_size=3), max_size=2)}
        ),
    ),
    max_size=4,
)  # fmt: skip


WHERE = "the head server at http://127.0.0.1:11000"


def head_answer_outcome(body: bytes) -> dict[str, str] | str:
    """What rollfilter makes of a head server's answer: agent URLs, or the ServiceError's text."""
    from rollfilter.errors import ServiceError
    from rollfilter.formats.headserver import agents_from_answer

    try:
        return agents_from_answer(body, WHERE).urls
    except ServiceError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(HEAD_CONFIGS)
def test_any_config_a_head_server_answers_gives_usable_urls_or_one_line_naming_the_server(config: dict):
    from rollfilter.config import agent_url

    outcome = head_answer_outcome(json.dumps(yaml.safe_dump(config)).encode())
    if isinstance(outcome, str):
        assert outcome.startswith(WHERE)
        assert "\n" not in outcome
        return
    for url in outcome.values():
        assert agent_url(url) == url  # what -u would take
        assert 0 < (httpx.URL(url).port or 0) < 65536


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=64), st.text(max_size=64).map(lambda text: json.dumps(text).encode())))
def test_any_answer_a_head_server_gives_is_its_agents_or_one_line_naming_the_server(body: bytes):
    outcome = head_answer_outcome(body)
    assert isinstance(outcome, dict) or (outcome.startswith(WHERE) and "\n" not in outcome)


def test_a_host_in_capitals_gives_the_url_minus_would_take():
    from rollfilter.config import agent_url
    from rollfilter.formats.headserver import agents_from_config

    urls = agents_from_config({"": {"responses_api_agents": {"": {"port": 1, "host": "A"}}}}).urls
    assert urls == {"": "http://a:1/run"}
    assert agent_url(urls[""]) == urls[""]
