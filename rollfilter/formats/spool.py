"""Successful results spooled on disk for NeMo Gym's `/aggregate_metrics`, with memory kept flat.

Each result is stripped as NeMo Gym strips it (the heavy fields removed, `response.usage` kept)
and spooled to a temporary file of its agent, to be streamed as the body of that agent's
`/aggregate_metrics` call (aggregate.py) when the run ends, sorted by (task, rollout).
"""

from __future__ import annotations

import heapq
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

import msgspec

from rollfilter.rows import ROLLOUT_INDEX, TASK_INDEX
from rollfilter.rows import encode_json as _encode

# What NeMo Gym's collector leaves out of each verify response (response.usage is put back).
HEAVY_FIELDS = frozenset(
    {"response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture", "ng_trajectory"}
)
SPOOL_BUFFER_BYTES = 256 * 1024
RUN_BYTES = 4 * 1024 * 1024  # the memory of results gathered, per agent, before a sorted run is written out
# What a gathered result holds besides its line (sys.getsizeof, CPython 3.11): the (key, line)
# tuple, the key's tuple of four, the bytes header and the list slot. Counted, a run takes
# RUN_BYTES; uncounted, demo-sized results (140 bytes) made a run of 4 MB take 16.
ENTRY_OVERHEAD_BYTES = 56 + 72 + 33 + 8
MERGE_BYTES = 2 * 1024 * 1024  # the read buffers of all of an agent's runs together, while they are merged
MIN_CHUNK_BYTES = 4096  # a run's read buffer is never smaller
_PREFIX = b'{"verify_responses":[\n'
_SUFFIX = b"\n]}"
_SEPARATOR = b",\n"
_decode = msgspec.json.Decoder().decode


def stripped(result: dict[str, Any]) -> dict[str, Any]:
    """A result as NeMo Gym sends it to /aggregate_metrics."""
    entry = {key: value for key, value in result.items() if key not in HEAVY_FIELDS}
    response = result.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    if usage:
        entry["response"] = {"usage": usage}
    return entry


class _AgentSpool:
    """One agent's stripped results: sorted runs in a temporary file, and the run being gathered."""

    __slots__ = ("count", "entry_bytes", "file", "gathered", "gathered_bytes", "runs")

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.count = 0
        self.entry_bytes = 0
        self.gathered: list[tuple[tuple[Any, ...], bytes]] = []  # (sort key, "[task,rollout]\tentry\n")
        self.gathered_bytes = 0
        self.runs: list[tuple[int, int]] = []  # (start, end) of each sorted run in `file`

    def write_run(self) -> None:
        if not self.gathered:
            return
        self.gathered.sort(key=lambda item: item[0])
        start = self.file.tell()
        self.file.write(b"".join(line for _, line in self.gathered))
        self.runs.append((start, self.file.tell()))
        self.gathered, self.gathered_bytes = [], 0


class ResultSpool:
    """Stripped successful results, by agent name, in temporary files (unlinked at once),
    handed out sorted by (task, rollout) as NeMo Gym sends them.

    The sort is done on disk: results gather in memory up to RUN_BYTES an agent, are sorted and
    written out as a run, and the runs are merged as the body streams, so memory stays flat
    however many results there are. A result without an agent name (a row routed by -u alone)
    is only counted. A spool that cannot be written (a full temporary folder) stops spooling
    and says why in `error`.
    """

    def __init__(self, directory: str | None = None, *, run_bytes: int = RUN_BYTES) -> None:
        self._directory = directory
        self._run_bytes = run_bytes
        self._agents: dict[str, _AgentSpool] = {}
        self.unnamed = 0
        self.error: str | None = None

    def add(self, agent: str | None, result: dict[str, Any]) -> None:
        if agent is None:
            self.unnamed += 1
            return
        if self.error is not None:
            return
        spool = self._agents.get(agent)
        try:
            if spool is None:
                file = tempfile.TemporaryFile(dir=self._directory, buffering=SPOOL_BUFFER_BYTES)  # noqa: SIM115 - closed by close()
                spool = self._agents[agent] = _AgentSpool(file)
            entry = _encode(stripped(result))
            pair = (result.get(TASK_INDEX), result.get(ROLLOUT_INDEX))
            line = b"%s\t%s\n" % (_encode(pair), entry)
            spool.gathered.append((_sort_key(pair), line))
            spool.gathered_bytes += len(line) + ENTRY_OVERHEAD_BYTES
            spool.count += 1
            spool.entry_bytes += len(entry)
            if spool.gathered_bytes >= self._run_bytes:
                spool.write_run()
        except OSError as exc:
            self.error = f"cannot spool results for /aggregate_metrics: {exc.strerror or exc}"

    @property
    def agents(self) -> list[str]:
        return list(self._agents)

    def count(self, agent: str) -> int:
        return self._agents[agent].count

    def body_size(self, agent: str) -> int:
        spool = self._agents[agent]
        return len(_PREFIX) + spool.entry_bytes + len(_SEPARATOR) * max(spool.count - 1, 0) + len(_SUFFIX)

    async def body(self, agent: str) -> AsyncIterator[bytes]:
        """The request body for `agent`, its results merged in (task, rollout) order from its runs."""
        spool = self._agents[agent]
        spool.write_run()
        spool.file.flush()
        fd = spool.file.fileno()
        # The runs' read buffers share MERGE_BYTES, so the merge's memory does not grow with the runs.
        chunk_bytes = max(MIN_CHUNK_BYTES, MERGE_BYTES // max(len(spool.runs), 1))
        runs = (_run_entries(fd, start, end, chunk_bytes) for start, end in spool.runs)
        merged = heapq.merge(*runs, key=lambda item: item[0])
        yield _PREFIX
        chunk: list[bytes] = []
        size = 0
        for number, (_, entry) in enumerate(merged):
            if number:
                chunk.append(_SEPARATOR)
            chunk.append(entry)
            size += len(entry)
            if size >= SPOOL_BUFFER_BYTES:
                yield b"".join(chunk)
                chunk, size = [], 0
        chunk.append(_SUFFIX)
        yield b"".join(chunk)

    def close(self) -> None:
        for spool in self._agents.values():
            spool.file.close()
        self._agents.clear()


def _sort_key(pair: tuple[Any, Any]) -> tuple[Any, ...]:
    """(task, rollout) in NeMo Gym's order: numbers by value, then strings, then anything else by its JSON."""
    key: list[Any] = []
    for value in pair:
        if type(value) in (int, float):
            key += (0, value)
        elif type(value) is str:
            key += (1, value)
        else:
            key += (2, _encode(value))
    return tuple(key)


def _run_entries(fd: int, start: int, end: int, chunk_bytes: int) -> Iterator[tuple[tuple[Any, ...], bytes]]:
    """The (sort key, entry) of each line of one sorted run, read in chunks."""
    offset, tail = start, b""
    while offset < end:
        data = tail + os.pread(fd, min(chunk_bytes, end - offset), offset)
        offset += len(data) - len(tail)
        *lines, tail = data.split(b"\n")
        for line in lines:
            pair, _, entry = line.partition(b"\t")
            task, rollout = _decode(pair)
            yield _sort_key((task, rollout)), entry
