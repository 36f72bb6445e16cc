"""Re-scoring saved rollouts: NeMo Gym's `gym eval reverify`, as a stream.

Inference is the expensive half of a rollout, and a verifier fix or a judge outage needs only
the other half again. Each rollout line (a result, as rollfilter or NeMo Gym wrote it) is joined
by (task, rollout) with its body in NeMo Gym's materialized inputs file, and
`materialized_input | {"response": rollout["response"]}` is POSTed to the `/verify` of the
resources server its agent names. The answer, stamped as `gym eval reverify` stamps it (the
pair's indices, `agent_ref`, `skills_ref`), is the new result line.

The materialized file is indexed, not loaded: one pass records each pair's byte offset and
length in a `KeyTable` (about 40 bytes a pair), and each body is read back with one `pread` when
its rollout is planned. So memory stays flat however many rollouts there are, and the rollout
lines stream through the same engine as a run's rows: -j, retries, rate limits, resume, the
errors record and the summary all hold.

Before anything is sent each resources server is asked `GET /reverify_mode`: only a server that
answers `stateless` can verify a response without the episode's state, so any other answer, and
a server without the endpoint (HTTP 404: its mode is unknown), refuses the run (`ReverifyRefused`)
unless `Config.reverify.force`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx
import msgspec
import trio

from rollfilter.config import Config, endpoint_beside, verify_url
from rollfilter.engine.plan import Job, LineSource, shard_of
from rollfilter.errors import ErrorKind, ServiceError, UsageError
from rollfilter.figures.passk import TaskStats
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.resume import ResumeState, pair_key
from rollfilter.formats.source import InputLine, next_when_ready
from rollfilter.http import AgentTransport
from rollfilter.outcomes import AttemptFailure
from rollfilter.redact import origin, printable, shown
from rollfilter.rows import AGENT_REF, ROLLOUT_INDEX, TASK_INDEX, agent_name, encode_json, parse_row

JUDGE_FAILED = "judge_failed"  # the failure class --judge-failed-only re-sends
STATELESS = "stateless"  # the one /reverify_mode answer that lets a run go ahead
MODE_UNKNOWN = None  # the mode of a server without /reverify_mode: refused, as "unknown" is, unless forced
RESOURCES_SERVER_TYPE = "resources_servers"
_AGENT_SERVER_TYPE = "responses_api_agents"
SKILLS_REF = "skills_ref"
RESPONSES_CREATE_PARAMS = "responses_create_params"
# The fields a rollout line may carry of the input it ran: when they differ from the materialized
# input's, the line was made from other inputs, and re-scoring it against these would go unseen.
_INPUT_FIELDS = (RESPONSES_CREATE_PARAMS, AGENT_REF)
_INDEX_CHUNK = 1 << 20  # bytes read at a time while indexing
MODE_TIMEOUT = 30.0  # seconds for a resources server's /reverify_mode, connecting included, as for a head server


class _Pair(msgspec.Struct):
    """The two fields the index reads of a materialized line; the rest is skipped unparsed."""

    task: Any = msgspec.field(name=TASK_INDEX, default=None)
    rollout: Any = msgspec.field(name=ROLLOUT_INDEX, default=None)


_decode_pair = msgspec.json.Decoder(_Pair).decode
_decode = msgspec.json.Decoder().decode


class MaterializedIndex:
    """Where each (task, rollout) pair's line is in a materialized inputs file, read back on demand.

    Built by `build` (in a worker thread: it reads the whole file once). Owns the file's
    descriptor: `close` gives it back."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._table = KeyTable(("Q", "I"))  # pair -> offset, length
        self._fd = open_materialized(path)
        self.lines = 0
        self.unusable = 0  # lines without both indices, or not JSON: no rollout can be joined with them

    def build(self) -> None:
        offset = 0
        pending = b""
        while chunk := os.pread(self._fd, _INDEX_CHUNK, offset + len(pending)):
            data = pending + chunk
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                self._add(data[start:end], offset + start)
                start = end + 1
            offset += start
            pending = data[start:]
        if pending:
            self._add(pending, offset)

    def _add(self, line: bytes, offset: int) -> None:
        if not line.strip():
            return
        self.lines += 1
        try:
            pair = _decode_pair(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            self.unusable += 1
            return
        if pair.task is None or pair.rollout is None:
            self.unusable += 1
            return
        handle, _ = self._table.add(pair_key(pair.task, pair.rollout))
        self._table.set_value(handle, offset, 0)
        self._table.set_value(handle, len(line), 1)

    def body(self, task: Any, rollout: Any) -> dict[str, Any] | None:
        """The pair's materialized input (the last line of the pair, as NeMo Gym's dict keeps it),
        or None when the file has none."""
        handle = self._table.find(pair_key(task, rollout))
        if handle < 0:
            return None
        line = os.pread(self._fd, self._table.value(handle, 1), self._table.value(handle, 0))
        row = parse_row(line)
        return row if isinstance(row, dict) else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_materialized(path: str) -> int:
    """The materialized inputs file at `path`, opened to read; UsageError, before anything is sent,
    when it cannot be read or is no regular file: its lines are read back by offset, which a pipe
    or a directory cannot do."""
    where = f"the materialized inputs {printable(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer would block the open
    except OSError as exc:
        raise UsageError(f"cannot read {where}: {exc.strerror}") from None
    kind = _file_kind(os.fstat(fd).st_mode)
    if kind is not None:
        os.close(fd)
        raise UsageError(f"cannot read {where}: it is {kind}; it must be a regular file (its lines are read by offset)")
    os.set_blocking(fd, True)
    return fd


def check_materialized(path: str) -> None:
    """UsageError when the materialized inputs file at `path` could not be indexed (see `open_materialized`)."""
    os.close(open_materialized(path))


def _file_kind(mode: int) -> str | None:
    """What a file that is not regular is, as a message says it; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


class ReverifyPlanner:
    """Turns rollout lines into jobs, one a line: the body to POST to `/verify`, the route by the
    rollout's agent, and `bad_input` for a line that cannot be re-scored (no JSON object, no
    indices, no `response`, no materialized input). With `judge_failed_only`, lines of any other
    kind are passed over. Pairs that resume says are done are skipped, as the planner of a run
    skips them."""

    def __init__(
        self,
        reader: LineSource,
        index: MaterializedIndex,
        config: Config,
        resume: ResumeState | None = None,
        tasks: TaskStats | None = None,
    ) -> None:
        assert config.reverify is not None, "a run that re-scores"
        self._reader = reader
        self._index = index
        self._judge_failed_only = config.reverify.judge_failed_only
        self._resume = resume
        self._tasks = tasks
        self._repeats_for = config.repeats.for_agent  # a task's rollouts are its groups of its agent's -r
        self._limit = config.limit
        self._shard = config.shard  # (I, N): the rollouts of the tasks whose index mod N is I, as a run's shard
        self._pending: collections.deque[Job] = collections.deque()
        self._rows = 0
        self._seq = 0
        self.skipped = 0  # pairs an earlier run re-scored (--resume)
        self.given_up = 0  # pairs not re-scored again: terminal, or out of attempts (--resume)
        self.passed_over: int | None = 0 if self._judge_failed_only else None  # lines judge_failed_only leaves alone
        self.agents_seen: set[str] = set()

    def next_job_nowait(self) -> Job | None:
        """The next job if its line is buffered; None at the end of the input.

        Raises trio.WouldBlock when the source must `fill()` first."""
        while not self._pending:
            if self._limit is not None and self._rows >= self._limit:
                return None
            line = self._reader.next_line_nowait()
            if line is None:
                return None
            if line.data is not None and not line.data.strip():
                continue
            self._plan(line)
        return self._pending.popleft()

    async def fill(self) -> None:
        await self._reader.fill()

    async def next_job(self, filling: trio.Lock | None = None) -> Job | None:
        return await next_when_ready(self.next_job_nowait, self.fill, filling)

    def _plan(self, line: InputLine) -> None:
        rollout: dict[str, Any] | str = line.problem or "unreadable line" if line.data is None else parse_row(line.data)
        if self._judge_failed_only and not (
            isinstance(rollout, dict) and rollout.get("_ng_failure_class") == JUDGE_FAILED
        ):
            self.passed_over = (self.passed_over or 0) + 1
            return
        task = rollout.get(TASK_INDEX) if isinstance(rollout, dict) else None
        index = rollout.get(ROLLOUT_INDEX) if isinstance(rollout, dict) else None
        if self._shard is not None and task is not None and shard_of(task, self._shard[1]) != self._shard[0]:
            return
        self._rows += 1
        attempt = 0
        if self._resume is not None and task is not None and index is not None:
            attempt = self._resume.decide(task, index)
            if attempt == ResumeState.GIVE_UP:
                self.given_up += 1
                return
            if attempt < 0:
                self.skipped += 1
                return
        body, problem = self._body(rollout, task, index)
        name = agent_name(body) if body is not None else agent_name(rollout) if isinstance(rollout, dict) else None
        if name is not None:
            self.agents_seen.add(name)
        if self._tasks is not None and task is not None:
            # A line is one rollout of its task's group of -r K (as --summarize -r K counts it);
            # without -r, a task has as many as its lines.
            size = self._repeats_for(name)
            if size is not None and size > 1:
                self._tasks.reached(task, index, size)
            else:
                self._tasks.planned(task, 1)
        raw = line.data.strip() if line.data is not None else b""
        # What a result is stamped with from its row: gym eval reverify stamps agent_ref and
        # skills_ref (besides the pair), not a rollout id, which /verify's answer does not carry.
        stamped = {key: body[key] for key in (AGENT_REF, SKILLS_REF) if key in body} if body is not None else None
        self._pending.append(
            Job(
                seq=self._seq,
                source=line.source,
                line=line.number,
                task_index=task,
                rollout_index=index if type(index) is int else -1,
                row=stamped,
                body=encode_json(body) if body is not None else raw,
                agent_name=name,
                failure=AttemptFailure(ErrorKind.BAD_INPUT, problem) if problem is not None else None,
            )
        )
        self._seq += 1

    def _body(self, rollout: dict[str, Any] | str, task: Any, index: Any) -> tuple[dict[str, Any] | None, str | None]:
        """The /verify body of a rollout line, or None and why there is none."""
        if isinstance(rollout, str):
            return None, rollout
        if task is None or index is None:
            return None, f"the rollout has no {TASK_INDEX} and {ROLLOUT_INDEX} to find its materialized input by"
        if "response" not in rollout:
            return None, "the rollout has no response to verify"
        body = self._index.body(task, index)
        if body is None:
            return None, f"the materialized inputs have no line for task {task} rollout {index}"
        for field in _INPUT_FIELDS:
            try:
                where = (
                    first_difference(rollout[field], body[field], field) if field in rollout and field in body else None
                )
            except RecursionError:  # nested past what can be compared: no input the materialized file holds
                where = field
            if where is not None:
                return None, (
                    f"the rollout's {where} differs from its materialized input's (task {task} rollout {index}):"
                    " the rollouts were made from other inputs"
                )
        body["response"] = rollout["response"]
        return body, None


def first_difference(given: Any, materialized: Any, path: str) -> str | None:
    """Where a rollout's copy of an input field first differs from the materialized one, as a path
    (`responses_create_params.input[1].content`); None when they agree. Keys only one side has are
    no difference, nor is a null on one side: an agent answers the params normalised (nulls and
    defaults filled in, `type` added to input items), and a line may carry a shorter `agent_ref`.
    Nor are two numbers within a float's single precision (an agent may keep 0.7 as 0.699999988)."""
    if given is None or materialized is None:
        return None
    if isinstance(given, dict) and isinstance(materialized, dict):
        for key, value in materialized.items():
            if value is not None and given.get(key) is not None:
                where = first_difference(given[key], value, f"{path}.{printable(str(key))}")
                if where is not None:
                    return where
        return None
    if isinstance(given, list) and isinstance(materialized, list):
        if len(given) != len(materialized):
            return path
        for position, (item, value) in enumerate(zip(given, materialized, strict=True)):
            where = first_difference(item, value, f"{path}[{position}]")
            if where is not None:
                return where
        return None
    if given == materialized and type(given) is type(materialized):
        return None
    if _number(given) and _number(materialized) and math.isclose(given, materialized, rel_tol=_SINGLE_PRECISION):
        return None
    return path


_SINGLE_PRECISION = 1e-6  # a float32 holds about 7 significant digits: numbers closer than this are one number


def _number(value: Any) -> bool:
    return type(value) is int or type(value) is float  # not bool: true is no 1 here


def verifiers_from_config(config: Any, where: str = "the head server") -> tuple[dict[str, str], str | None]:
    """The resources server each agent verifies with, from a NeMo Gym config: agent name ->
    its `/verify` URL (by the agent's `resources_server.name`), and the URL of the one resources
    server when the config has no agent blocks (the rollouts' agents were never started), as
    NeMo Gym's reverify routes them. ServiceError when neither can be made."""
    from rollfilter.formats.headserver import server_urls

    if not isinstance(config, dict):
        raise ServiceError(f"{where} answered a config that is not a mapping")
    resources = server_urls(config, RESOURCES_SERVER_TYPE, where, path="/verify")
    verifiers: dict[str, str] = {}
    for name, entry in config.items():
        servers = entry.get(_AGENT_SERVER_TYPE) if isinstance(entry, dict) else None
        if not isinstance(servers, dict) or not servers:
            continue
        server = next(iter(servers.values()))
        named = server.get("resources_server") if isinstance(server, dict) else None
        resources_name = named.get("name") if isinstance(named, dict) else None
        if not resources_name:
            continue
        url = resources.get(str(resources_name))
        if url is None:
            raise ServiceError(
                f"{where}: agent {printable(str(name))!r} verifies with resources server"
                f" {printable(str(resources_name))!r}, which has no host and port there"
            )
        verifiers[str(name)] = url
    if verifiers:
        return verifiers, None
    if len(resources) == 1:
        return {}, next(iter(resources.values()))
    if not resources:
        raise ServiceError(f"{where} names no resources server to verify with")
    raise ServiceError(
        f"{where} names several resources servers ({', '.join(sorted(resources))}) and no agent to route by"
    )


class ReverifyRefused(UsageError):
    """A resources server does not say its verification is stateless: re-scoring there may give
    rewards the episodes never had."""


def reverify_mode_url(verify: str) -> str:
    """A resources server's `/reverify_mode` beside its `/verify` URL (see `endpoint_beside`)."""
    return endpoint_beside(verify, "/reverify_mode")


async def reverify_modes(verify_urls: Iterable[str], transport: AgentTransport) -> dict[str, str | None]:
    """Each resources server's answer to `GET /reverify_mode`, by its /verify URL (asked once each):
    its mode, or `MODE_UNKNOWN` when it has no such endpoint (HTTP 404: a server older than it).
    ServiceError, naming the URL asked with its path, when one cannot be asked or answers anything else."""
    modes: dict[str, str | None] = {}
    for verify in sorted(set(verify_urls)):
        url = reverify_mode_url(verify)
        where = f"resources server {shown(url)}"
        try:
            with trio.move_on_after(MODE_TIMEOUT) as scope:
                reply = await transport.request(b"GET", httpx.URL(url))
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise ServiceError(f"cannot reach {where}: {printable(str(exc))}") from None
        if scope.cancelled_caught:
            raise ServiceError(f"{where} did not answer in {MODE_TIMEOUT:g} s")
        if reply.status == 404:
            modes[verify] = MODE_UNKNOWN
            continue
        if reply.status != 200:
            raise ServiceError(f"{where} answered HTTP {reply.status}")
        try:
            mode = _decode(reply.body)
        except (msgspec.DecodeError, RecursionError):
            mode = None
        if not isinstance(mode, str):
            raise ServiceError(f"{where} answered no mode (a JSON string)")
        modes[verify] = mode
    return modes


def refusal(modes: Mapping[str, str | None]) -> str | None:
    """Why the run must not re-score at these servers (those whose mode is not stateless, or
    unknown), naming each by the /reverify_mode URL asked; None when every one is stateless."""
    unsafe = [
        f"{shown(reverify_mode_url(url))} ({_mode_said(mode)})" for url, mode in modes.items() if mode != STATELESS
    ]
    if not unsafe:
        return None
    return (
        f"resources server {', '.join(unsafe)} does not say its /reverify_mode is {STATELESS}: its rewards"
        " may not be those of the episodes"
    )


def _mode_said(mode: str | None) -> str:
    return "HTTP 404: mode unknown" if mode is None else printable(mode)


def verify_urls(config: Config, endpoints: Mapping[str, tuple[str, ...]], default: str | None) -> list[str]:
    """Every resources server URL the run may send to."""
    urls = [url for replicas in endpoints.values() for url in replicas]
    urls += [url for url in (config.url, default) if url is not None]
    return urls


async def verifier_routes(
    config: Config,
    transport: AgentTransport,
    *,
    send: bool,
    ask_modes: bool = True,
    on_warning: Callable[[str], None] | None = None,
) -> tuple[dict[str, tuple[str, ...]], Config, MaterializedIndex | None, bool]:
    """Re-scoring's routes: each agent's resources server (from the head server's config, under
    Config.endpoints), and the config whose url is the one for every rollout (Config.url, or a
    config's one resources server). Then, with `send`, each server's /reverify_mode asked (with
    `ask_modes`: a dry run, which sends nothing, asks nothing), and the materialized inputs
    indexed (the index is the caller's to close); and whether re-scoring is unsafe.
    ReverifyRefused when a server is not stateless (unless Config.reverify.force: then
    `on_warning` says so once, and the run is unsafe)."""
    from rollfilter.run.headserver import HEAD_SERVER_TIMEOUT, fetch_config

    settings = config.reverify
    assert settings is not None
    endpoints, default = dict(config.endpoints), config.url
    if config.head_server is not None:
        where = f"the head server at {origin(config.head_server)}"
        with trio.move_on_after(HEAD_SERVER_TIMEOUT) as scope:
            head_config = await fetch_config(config.head_server, transport)
        if scope.cancelled_caught:
            raise ServiceError(f"{where} did not answer in time")
        verifiers, only = verifiers_from_config(head_config, where)
        endpoints = {name: (url,) for name, url in verifiers.items()} | endpoints
        default = default or only
    if not send:
        return endpoints, config, None, False
    index = MaterializedIndex(settings.materialized)  # a file that cannot be indexed is refused first
    try:
        why = refusal(await reverify_modes(verify_urls(config, endpoints, default), transport)) if ask_modes else None
        if why is not None and not settings.force:
            raise ReverifyRefused(why)
        if why is not None and on_warning is not None:
            on_warning(f"{why}; re-scored there anyway (forced): the summary says unsafe")
        try:
            await trio.to_thread.run_sync(index.build)  # one pass over a file: not abandoned with its descriptor
        except OSError as exc:
            problem = f"cannot read the materialized inputs {printable(settings.materialized)}: {exc.strerror}"
            raise UsageError(problem) from None
    except BaseException:
        index.close()
        raise
    config = dataclasses.replace(config, url=default) if default != config.url else config
    return endpoints, config, index, why is not None


__all__ = [
    "JUDGE_FAILED",
    "MaterializedIndex",
    "ReverifyPlanner",
    "ReverifyRefused",
    "check_materialized",
    "refusal",
    "reverify_modes",
    "verifier_routes",
    "verifiers_from_config",
    "verify_url",
]
