"""reverify.py: the materialized index, the resources servers a config names, /reverify_mode."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from rollfilter.errors import ServiceError, UsageError
from rollfilter.http.testing import ScriptedRequest, ScriptedTransport, scripted_reply
from rollfilter.run.reverify import (
    MODE_TIMEOUT,
    MODE_UNKNOWN,
    MaterializedIndex,
    first_difference,
    refusal,
    reverify_mode_url,
    reverify_modes,
    verifiers_from_config,
)


def test_the_index_finds_each_pairs_line_across_chunks_and_skips_what_it_cannot_join(tmp_path: Path):
    path = tmp_path / "m.jsonl"
    filler = "x" * 700_000  # lines that straddle the reads of a megabyte
    rows = [{"_ng_task_index": t, "_ng_rollout_index": r, "pad": filler[: (t * 7 + r) % 5 * 150_000]}
            for t in range(4) for r in range(2)]  # fmt: skip
    text = "".join(json.dumps(row) + "\n" for row in rows) + "not json\n\n" + '{"no": "indices"}\n'
    path.write_text(text + json.dumps({"_ng_task_index": "t", "_ng_rollout_index": 0}))  # no newline at the end
    index = MaterializedIndex(str(path))
    try:
        index.build()
        assert (index.lines, index.unusable) == (11, 2)
        for row in rows:
            assert index.body(row["_ng_task_index"], row["_ng_rollout_index"]) == row
        assert index.body("t", 0) == {"_ng_task_index": "t", "_ng_rollout_index": 0}
        assert index.body(9, 0) is None
    finally:
        index.close()


def resources(name: str, port: int) -> dict[str, Any]:
    return {name: {"resources_servers": {name: {"host": "127.0.0.1", "port": port}}}}


def agent(name: str, resources_name: str) -> dict[str, Any]:
    block = {"host": "127.0.0.1", "port": 9, "resources_server": {"type": "resources_servers", "name": resources_name}}
    return {name: {"responses_api_agents": {"simple_agent": block}}}


def test_each_agent_verifies_at_the_resources_server_it_names():
    config = resources("math", 1001) | resources("code", 1002) | agent("a", "math") | agent("b", "code")
    assert verifiers_from_config(config) == (
        {"a": "http://127.0.0.1:1001/verify", "b": "http://127.0.0.1:1002/verify"},
        None,
    )
    # No agent blocks: NeMo Gym sends every rollout to the one resources server.
    assert verifiers_from_config(resources("math", 1001)) == ({}, "http://127.0.0.1:1001/verify")
    with pytest.raises(ServiceError, match="several resources servers"):
        verifiers_from_config(resources("math", 1001) | resources("code", 1002))
    with pytest.raises(ServiceError, match="no resources server"):
        verifiers_from_config({})
    with pytest.raises(ServiceError, match="'missing', which has no host and port"):
        verifiers_from_config(resources("math", 1001) | agent("a", "missing"))


async def test_reverify_modes_asks_each_server_once_and_bounds_the_wait(autojump_clock: trio.testing.MockClock):
    async def answer(request: ScriptedRequest) -> Any:
        if request.url.port == 3:
            await trio.sleep(MODE_TIMEOUT + 1)
        if request.url.port == 4:
            raise httpx.ConnectError("connection refused")
        if request.url.port == 5:
            return scripted_reply(500, {"detail": "down"})
        return scripted_reply(200, "stateless" if request.url.port == 1 else "unsupported")

    transport = ScriptedTransport(answer)
    urls = ["http://127.0.0.1:1/verify", "http://127.0.0.1:2/verify", "http://127.0.0.1:1/verify"]
    modes = await reverify_modes(urls, transport)
    assert modes == {"http://127.0.0.1:1/verify": "stateless", "http://127.0.0.1:2/verify": "unsupported"}
    assert [str(request.url) for request in transport.requests] == [
        "http://127.0.0.1:1/reverify_mode",
        "http://127.0.0.1:2/reverify_mode",
    ]
    why = refusal(modes)
    assert why is not None
    assert "http://127.0.0.1:2/reverify_mode (unsupported)" in why
    assert "127.0.0.1:1/" not in why
    assert refusal({"u": "stateless"}) is None
    with pytest.raises(
        ServiceError,
        match=rf"^resources server http://127\.0\.0\.1:3/reverify_mode did not answer in {MODE_TIMEOUT:g} s$",
    ):
        await reverify_modes(["http://127.0.0.1:3/verify"], transport)
    with pytest.raises(ServiceError, match=r"^cannot reach resources server http://127\.0\.0\.1:4/reverify_mode: "):
        await reverify_modes(["http://127.0.0.1:4/verify"], transport)
    with pytest.raises(ServiceError, match=r"^resources server http://127\.0\.0\.1:5/reverify_mode answered HTTP 500$"):
        await reverify_modes(["http://127.0.0.1:5/verify"], transport)


async def test_a_server_without_reverify_mode_is_of_unknown_mode_named_by_the_url_asked():
    """An older resources server answers 404: its mode is unknown, which refuses the run unless
    forced, as "unknown" does; the URL asked is named with its path."""
    transport = ScriptedTransport(lambda request: scripted_reply(404, {"detail": "Not Found"}))
    verify = "http://user:secret@127.0.0.1:1/prefix/verify?key=k"
    modes = await reverify_modes([verify], transport)
    assert [str(request.url) for request in transport.requests] == [
        "http://user:secret@127.0.0.1:1/prefix/reverify_mode?key=k"
    ]
    assert modes == {verify: MODE_UNKNOWN}
    why = refusal(modes)
    assert why is not None
    assert why.startswith("resources server http://127.0.0.1:1/prefix/reverify_mode (HTTP 404: mode unknown) ")
    assert "secret" not in why
    assert "key=k" not in why


@pytest.mark.parametrize("kind", ["directory", "pipe", "missing"])
def test_a_materialized_file_that_is_not_a_regular_file_is_a_usage_error(tmp_path: Path, kind: str):
    """It is indexed by offset: a pipe or a directory is refused with one line, as a missing file is."""
    path = tmp_path / "m.jsonl"
    if kind == "directory":
        path.mkdir()
    elif kind == "pipe":
        os.mkfifo(path)  # with no writer: opening it must not wait for one
    with pytest.raises(UsageError, match=f"^cannot read the materialized inputs {path}: ") as refused:
        MaterializedIndex(str(path))
    said = {"directory": "it is a directory", "pipe": "it is a pipe", "missing": "No such file or directory"}[kind]
    assert said in str(refused.value)
    if kind != "missing":
        assert "must be a regular file" in str(refused.value)


def test_an_input_normalised_by_the_agent_is_the_same_input():
    materialized = {"input": "q", "temperature": 0.7, "top_p": 1, "metadata": {"k": "v"}}
    echoed = {"input": "q", "temperature": 0.699999988079071, "top_p": 1.0, "metadata": None, "tools": []}
    assert first_difference(echoed, materialized, "responses_create_params") is None
    assert first_difference(None, materialized, "responses_create_params") is None  # a null: not carried
    other = {"input": "q", "temperature": 0.75}
    assert first_difference(other, materialized, "responses_create_params") == "responses_create_params.temperature"
    assert first_difference({"n": True}, {"n": 1}, "p") == "p.n"  # true is no 1 here


@pytest.mark.parametrize(("verify", "mode"), [
    ("http://h/verify", "http://h/reverify_mode"),
    ("http://h/p/verify?key=v", "http://h/p/reverify_mode?key=v"),
    ("http://h/a%2Fb/verify", "http://h/a%2Fb/reverify_mode"),
    ("http://h/a%3Fb/verify#part", "http://h/a%3Fb/reverify_mode"),
])  # fmt: skip
def test_reverify_mode_is_asked_beside_verify_with_its_query(verify: str, mode: str):
    """The same server as /verify, under the same path as it is sent (percent-encoded), with its
    query: a token there lets the server answer /verify and /reverify_mode alike."""
    assert reverify_mode_url(verify) == mode
