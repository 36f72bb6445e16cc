"""Result files for the viewer's tests: rollouts of a few tasks, one with a tool call, one whose
model output holds markup, a failed attempt, an unhealthy result."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollfilter.config import Config, Repeats
from rollfilter.viewer.catalog import Catalog
from rollfilter.viewer.server import Viewer, listening

MARKUP = '<script>document.title="pwned"</script><img src=x onerror="document.title=\'pwned\'">'


def result(task: int, rollout: int, reward: float, text: str = "an answer", **extra: Any) -> dict[str, Any]:
    output: list[dict[str, Any]] = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    ]
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"question {task}"}]},
        "response": {"output": output, "usage": {"input_tokens": 10, "output_tokens": 5 + rollout}},
        "reward": reward,
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        **extra,
    }


def with_tool_call(record: dict[str, Any]) -> dict[str, Any]:
    record["response"]["output"][:0] = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I should look it up"}]},
        {"type": "function_call", "name": "get_weather", "arguments": '{"city": "Paris"}', "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny, 21 degrees"},
    ]
    return record


def results() -> list[dict[str, Any]]:
    return [
        with_tool_call(result(0, 0, 1.0)),
        result(0, 1, 0.0, MARKUP),
        result(1, 0, 1.0, _rf_health=["empty_output"]),
        result(1, 1, 1.0),
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "error": {"kind": "http_status", "status": 500}},
        result(2, 1, 0.5),
    ]


def write_lines(path: Path, records: list[dict[str, Any]], mode: str = "w") -> None:
    with path.open(mode, encoding="utf-8") as file:
        file.writelines(json.dumps(record) + "\n" for record in records)


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    path = tmp_path / "out.jsonl"
    write_lines(path, results())
    return path


def catalog_of(*paths: Path, baseline: Catalog | None = None) -> Catalog:
    config = Config(repeats=Repeats(count=2))
    catalog = Catalog(tuple(map(str, paths)), config, max_line_bytes=1 << 20, baseline=baseline)
    catalog.refresh()
    return catalog


@pytest.fixture
def viewer(results_file: Path) -> Iterator[Viewer]:
    """A viewer of results_file, served on 127.0.0.1 at a free port for the test."""
    yield from serving(catalog_of(results_file))


def serving(catalog: Catalog, host: str = "127.0.0.1") -> Iterator[Viewer]:
    server, viewer = listening(catalog, host, 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield viewer
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
