"""Shared test fixtures: the demo agent as a real server on 127.0.0.1, and the installed command."""

from __future__ import annotations

import compileall
import contextlib
import copy
import functools
import gc
import http.server
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
import yaml

ROOT = Path(__file__).resolve().parent.parent
WEATHER = ROOT / "rollfilter" / "examples" / "weather.jsonl"
SUBPROCESS_TIMEOUT = 60  # seconds: every subprocess wait is bounded


# PYTHONDONTWRITEBYTECODE as the suite was started with it: withheld from the workers while
# they start, given back to them and to the processes the suite starts.
BYTECODE_VARIABLE = "PYTHONDONTWRITEBYTECODE"
WITHHELD = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    """Compile rollfilter's bytecode once, before any worker starts, for the processes the suite
    starts: under PYTHONDONTWRITEBYTECODE (set on the project's machines) an editable install is
    compiled again by every process that imports it, a seventh of a second each, while an
    installed package has its bytecode written by pip.

    And let pytest keep the test modules it rewrites (their asserts made to explain themselves)
    in their __pycache__, as it does unless bytecode writing is off: otherwise each worker of
    each run rewrites every test module again before it runs a test. pytest rewrites its
    plugins' modules too (xdist, hypothesis, pytest-trio), imported before this hook runs: the
    workers start without PYTHONDONTWRITEBYTECODE so that they keep those as well, and every
    later pytest reads them instead of rewriting them. The processes the suite starts keep
    PYTHONDONTWRITEBYTECODE."""
    sys.dont_write_bytecode = False
    if hasattr(config, "workerinput"):
        withheld = config.workerinput.get("withheld_bytecode_variable")
        if withheld is not None:
            os.environ[BYTECODE_VARIABLE] = withheld
        return
    compileall.compile_dir(ROOT / "rollfilter", quiet=1)
    config.stash[WITHHELD] = os.environ.pop(BYTECODE_VARIABLE, None)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's hook, before a worker is set up: what it is to give back."""
    node.workerinput["withheld_bytecode_variable"] = node.config.stash[WITHHELD]


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Any:
    """The workers have started (xdist starts them as the session starts): give the variable back."""
    withheld = session.config.stash.get(WITHHELD, None)
    if withheld is not None:
        os.environ[BYTECODE_VARIABLE] = withheld
    return (yield)


def rollfilter_command() -> list[str]:
    """The installed console script beside this interpreter (what users run)."""
    script = Path(sys.executable).parent / "rollfilter"
    if script.exists():
        return [str(script)]
    found = shutil.which("rollfilter")
    assert found, "the rollfilter command is not installed: pip install -e '.[test]'"
    return [found]


def require_tool(name: str) -> str:
    """The path of a program the suite needs. A missing one fails the test (never a skip):
    .ci/run installs it, and anywhere else the suite says what to install."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: the test suite needs it (.ci/run installs it with apt-get)")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLFILTER_")}
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(proxy, None)
    env.update(extra)
    return env


# Paths the kernel resolves against the process's own descriptors 0 to 2, and variables read
# from the process's environment by OpenSSL and by tempfile (once, for the whole process): a
# command given one, or one of these variables with another value than this process has, runs
# in a process of its own.
STANDARD_DESCRIPTOR_PATH = re.compile(r"(?:^|=)(?:/dev/(?:stdin|stdout|stderr|fd/[012])|/proc/self/fd/[012])$")
PROCESS_VARIABLES = frozenset({"SSL_CERT_FILE", "SSL_CERT_DIR", "TMPDIR"})


def run(
    args: Sequence[str],
    *,
    input: bytes | str = b"",
    timeout: float = SUBPROCESS_TIMEOUT,
    env: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
    **popen: Any,
) -> subprocess.CompletedProcess[bytes]:
    """rollfilter (or `command`) to its end; stdout and stderr are captured unless `popen` gives them.

    rollfilter itself runs in this process (`invoke`) unless it needs what only a process has:
    a new session, a pass_fds or a preexec (`popen`), a path naming a standard descriptor
    (/dev/stdout), or a variable only a process reads (PROCESS_VARIABLES) set otherwise than in
    this process; `command` always starts one."""
    in_process = command is None and set(popen) <= {"stdin", "stdout", "stderr", "cwd"}
    if in_process and not _needs_a_process(args, clean_env() if env is None else env):
        return invoke(args, input=input, timeout=timeout, env=env, **popen)
    return run_process(args, input=input, timeout=timeout, env=env, command=command, **popen)


def _needs_a_process(args: Sequence[str], env: dict[str, str]) -> bool:
    if any(STANDARD_DESCRIPTOR_PATH.search(arg) for arg in args):
        return True
    return any(env.get(name) != os.environ.get(name) for name in PROCESS_VARIABLES)


def run_process(
    args: Sequence[str],
    *,
    input: bytes | str = b"",
    timeout: float = SUBPROCESS_TIMEOUT,
    env: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
    **popen: Any,
) -> subprocess.CompletedProcess[bytes]:
    """The installed rollfilter (or `command`) in a process of its own, to its end."""
    data: bytes | None = input.encode() if isinstance(input, str) else input
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    program = rollfilter_command() if command is None else list(command)
    if "stdin" in popen:  # the test's own descriptor instead of `input`
        data = None
    return subprocess.run([*program, *args], input=data, timeout=timeout, env=env or clean_env(), **popen)


def invoke(
    args: Sequence[str],
    *,
    input: bytes | str = b"",
    timeout: float = SUBPROCESS_TIMEOUT,
    env: dict[str, str] | None = None,
    stdin: Any = None,
    stdout: Any = subprocess.PIPE,
    stderr: Any = subprocess.PIPE,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """The command run in this process as `rollfilter.cli.main` runs it, given an `Environment`
    of its own: descriptors that are what the test gives (as subprocess.run's arguments: PIPE
    captures, None inherits this process's), and `env` as its variables. The same parsing, run,
    output and exit status, without the second of start-up a process costs, and without touching
    this process's descriptors 0 to 2 or its os.environ. What the run changes in the process
    (signal handlers, the garbage collector's settings, the directory) is put back afterwards."""
    from rollfilter.cli import main as cli
    from rollfilter.cli.environment import Environment

    with contextlib.ExitStack() as stack:
        data = input.encode() if isinstance(input, str) else input
        descriptors: dict[int, int] = {0: 0, 1: 1, 2: 2}  # inherited unless given
        pumps: list[threading.Thread] = []
        outputs: dict[int, bytes] = {}
        for fd, given in ((0, stdin), (1, stdout), (2, stderr)):
            if given is None and fd == 0:  # `input`, through a pipe as subprocess.run gives it
                read_end, write_end = os.pipe()
                descriptors[fd] = read_end
                stack.callback(os.close, read_end)
                pumps.append(threading.Thread(target=_feed, args=(write_end, data), daemon=True))
            elif given is None:
                continue  # inherited: the test's own descriptor
            elif given == subprocess.PIPE:
                read_end, write_end = os.pipe()
                descriptors[fd] = write_end
                stack.callback(os.close, write_end)  # the reader sees its end once the run is over
                pumps.append(threading.Thread(target=_drain, args=(read_end, outputs, fd), daemon=True))
            elif given == subprocess.DEVNULL:
                descriptors[fd] = stack.enter_context(open(os.devnull, "r+b")).fileno()
            else:
                descriptors[fd] = given if isinstance(given, int) else given.fileno()
        environment = Environment.of_descriptors(
            descriptors[0], descriptors[1], descriptors[2], variables=env if env is not None else clean_env()
        )
        saved_cwd = os.getcwd()
        saved_signals = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        saved_threshold = gc.get_threshold()
        for pump in pumps:
            pump.start()
        try:  # a hung run is failed by pytest-timeout, as any test is
            if cwd is not None:
                os.chdir(cwd)
            status = cli.run_command(list(args), environment)
        finally:
            os.chdir(saved_cwd)
            for sig, handler in saved_signals.items():
                signal.signal(sig, handler)
            gc.unfreeze()
            gc.set_threshold(*saved_threshold)
    for pump in pumps:
        pump.join(timeout)
        assert not pump.is_alive(), "a pipe of the command's was still open"
    return subprocess.CompletedProcess(["rollfilter", *args], status, outputs.get(1), outputs.get(2))


def _feed(fd: int, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError), open(fd, "wb") as pipe:
        pipe.write(data)


def _drain(fd: int, outputs: dict[int, bytes], key: int) -> None:
    with open(fd, "rb") as pipe:
        outputs[key] = pipe.read()


_SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGUSR1]


def start(args: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """rollfilter in the background; stdout and stderr are pipes and the environment clean unless given."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("env", clean_env())
    return subprocess.Popen([*rollfilter_command(), *args], **popen)


def lines_of(stream: object) -> queue.Queue[bytes]:
    """The lines of a pipe, read by a thread of their own, as they come."""
    lines: queue.Queue[bytes] = queue.Queue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)
        lines.put(b"")

    threading.Thread(target=read, daemon=True).start()
    return lines


def result_lines(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def summary_of(stderr: bytes) -> dict[str, Any]:
    """The summary: the last stderr line (one JSON object)."""
    last = stderr.strip().splitlines()[-1]
    summary = json.loads(last)
    assert isinstance(summary, dict)
    return summary


# The summary's counts of the pairs read, each pair in one of them (docs/faults.md).
COUNTED_ONCE = ("succeeded", "failed", "not_persisted", "skipped", "not_retried", "cancelled")


def assert_counts_add_up(summary: dict[str, Any]) -> None:
    """The identities docs/faults.md states of a summary, which hold however the run ended: every
    pair read is counted once, rows_read = succeeded + failed + not_persisted + skipped +
    not_retried + cancelled; and where the input's pairs are known, expected = rows_read + not_started."""
    figures = summary["rollfilter"]
    counted = {key: figures[key] for key in COUNTED_ONCE}
    assert all(count >= 0 for count in counted.values()), figures
    assert figures["rows_read"] == sum(counted.values()), figures
    assert figures["failed"] == sum(figures["failed_by_kind"].values()), figures
    if figures.get("expected") is not None:
        assert figures["not_started"] >= 0, figures
        assert figures["expected"] == figures["rows_read"] + figures["not_started"], figures


def expected_reward(row: dict[str, Any]) -> float:
    """The demo agent's documented formula, written out again independently of its code."""
    if isinstance(row.get("demo"), dict) and "reward" in row["demo"]:
        return float(row["demo"]["reward"])
    value = row["responses_create_params"]["input"]
    text = value if isinstance(value, str) else "".join(m["content"] for m in value)
    return 1.0 if len(text) % 2 == 0 else 0.0


def rows_jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def simple_rows(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"id": i, "responses_create_params": {"input": "q" * (i % 5)}, **extra} for i in range(n)]


class _ListeningHTTPServer(http.server.ThreadingHTTPServer):
    # socketserver's listen backlog is small: when a run opens its connections at once, the
    # kernel drops those over it, and each is tried again only after TCP's retransmission timeout.
    request_queue_size = 1024


class ThreadedHTTPServer:
    """A stdlib HTTP server on 127.0.0.1 in a thread, for stand-ins (head server, proxy)."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = _ListeningHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # close() waits for the loop's next look at its stop flag: it looks often.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.005,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def send_json(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class DemoProcess:
    """`python -m rollfilter.demo` in its own process, on a free loopback port: for the tests that
    stop or kill the agent as a process (the rest use `DemoServer`, which starts in milliseconds)."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rollfilter.demo", "--port", "0", *args],
            stderr=subprocess.PIPE,
            env=clean_env(),
        )
        assert self.process.stderr is not None
        line = self.process.stderr.readline().decode()
        assert "listening on" in line, line
        self.base = line.rsplit(" ", 1)[1].strip()
        self.url = self.base + "/run"
        self.port = int(self.base.rsplit(":", 1)[1])

    def stats(self) -> dict[str, Any]:
        return demo_stats(self.base)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=SUBPROCESS_TIMEOUT)
        if self.process.stderr:
            self.process.stderr.close()


class DemoServer:
    """The demo agent, given `python -m rollfilter.demo`'s options, serving on a free loopback port
    from a trio run in a thread of this process; `kill()` closes the listener and every connection."""

    def __init__(self, *args: str) -> None:
        from rollfilter.demo import DemoAgent, parse_args, serve

        options, host, _ = parse_args(list(args))
        started: queue.Queue[int | BaseException] = queue.Queue()
        self._scope = trio.CancelScope()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with self._scope:
                async with trio.open_nursery() as nursery:
                    started.put(await nursery.start(functools.partial(serve, DemoAgent(options), host=host)))

        def thread() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # the test's thread raises it
                started.put(exc)

        self._thread = threading.Thread(target=thread, name="demo agent", daemon=True)
        self._thread.start()
        port = started.get(timeout=SUBPROCESS_TIMEOUT)
        if isinstance(port, BaseException):
            raise port
        self.port = port
        self.base = f"http://{host}:{port}"
        self.url = self.base + "/run"

    def stats(self) -> dict[str, Any]:
        return demo_stats(self.base)

    def kill(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(timeout=SUBPROCESS_TIMEOUT)
        assert not self._thread.is_alive(), "the demo agent did not stop"


def demo_stats(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/stats", timeout=10) as response:
        data = json.load(response)
    assert isinstance(data, dict)
    return data


@pytest.fixture
def demo_process() -> Iterator[DemoProcess]:
    """The demo agent in a process of its own: for tests that count this process's descriptors."""
    server = DemoProcess()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def demo_server() -> Iterator[DemoServer]:
    server = DemoServer()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def start_demo() -> Iterator[Any]:
    """Start demo servers with options; all are killed at the end of the test."""
    servers: list[DemoServer] = []

    def start(*args: str) -> DemoServer:
        server = DemoServer(*args)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.kill()


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries after a hundredth of the backoff, in this process: for tests whose subject is
    which attempts are made and counted, not when (tests/engine/test_client.py tests the backoff)."""
    from rollfilter.engine import client

    monkeypatch.setattr(client, "BACKOFF_BASE", client.BACKOFF_BASE / 100)


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def agent() -> Iterator[Any]:
    """A RecordingAgent named "agent" on 127.0.0.1 (tests/servers/recording_agent.py), closed after the test."""
    from tests.servers.recording_agent import RecordingAgent  # it imports this module

    server = RecordingAgent(name="agent")
    try:
        yield server
    finally:
        server.close()


# Helpers of more than one test module.


def demo_row_body(latency: float | None) -> bytes:
    """A row's body for the demo agent, with its own episode length (None: the agent's --latency)."""
    row: dict[str, object] = {"responses_create_params": {"input": "hi"}}
    if latency is not None:
        row["demo"] = {"latency": latency}  # this row's own episode length
    return msgspec.json.encode(row)


class Holdings:
    """What this process holds: its threads, and its open descriptors each by number and what it
    is (a number an earlier test's thread freed and a leak took would otherwise look the same).
    `left_behind()` is what was taken since, not given back; what earlier tests' threads give
    back meanwhile (a server thread ending, trio's idle worker threads) is no concern of it."""

    def __init__(self) -> None:
        self.threads, self.descriptors = self._now()

    @staticmethod
    def _now() -> tuple[set[threading.Thread], set[tuple[str, str]]]:
        descriptors = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed by now
                descriptors.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        return set(threading.enumerate()), descriptors

    def left_behind(self) -> tuple[set[threading.Thread], set[tuple[str, str]]]:
        threads, descriptors = self._now()
        return threads - self.threads, descriptors - self.descriptors


def read_jsonl(path: Path) -> list[dict]:
    """The JSON lines of `path`, which must exist: a file that was never written is no empty one."""
    return [json.loads(line) for line in path.read_text().splitlines()]


_HELD_PORTS: list[socket.socket] = []  # the ports of closed_port_urls, held until the test ends


@pytest.fixture(autouse=True)
def _release_held_ports() -> Iterator[None]:
    yield
    while _HELD_PORTS:
        _HELD_PORTS.pop().close()


def closed_port_urls(count: int) -> list[str]:
    """`count` different URLs, http://127.0.0.1:PORT, where nothing listens for the whole test:
    each port is bound here (to port 0, so the kernel chose a free one) and held, not listening,
    until the test ends. A connection to it is refused, and no server of another test (the suite
    runs on four workers) can take the port meanwhile. Call it in the test, not at collection."""
    urls = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        _HELD_PORTS.append(sock)
        urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
    return urls


def closed_port_url() -> str:
    """One URL of `closed_port_urls`."""
    return closed_port_urls(1)[0]


# For parametrized arguments, which are made long before the test runs: with_closed_port
# gives them a port just closed.
CLOSED_PORT = "CLOSED_PORT"
CLOSED_PORT_URL = f"http://127.0.0.1:{CLOSED_PORT}"


def with_closed_port(args: Sequence[str]) -> list[str]:
    """`args` with each CLOSED_PORT replaced by the port of one `closed_port_url()`."""
    port = closed_port_url().rsplit(":", 1)[1]
    return [arg.replace(CLOSED_PORT, port) for arg in args]


URL = "http://127.0.0.1:8000/run"


def array_task(task: int, first: int, count: int) -> dict[str, str]:
    """The variables Slurm sets in one task of a job array (`sbatch --array=FIRST-...`)."""
    return {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": str(first), "SLURM_ARRAY_TASK_COUNT": str(count)}


def documented_shard(task_index: Any, shards: int) -> int:
    """The man page's rule, restated: an integer index mod N; any other index by the CRC-32
    of its compact JSON, which is the same in every process and on every machine."""
    if isinstance(task_index, int):
        return task_index % shards
    return zlib.crc32(json.dumps(task_index, separators=(",", ":")).encode()) % shards


class HeadServer(ThreadedHTTPServer):
    """A stand-in NeMo Gym head server: GET /global_config_dict_yaml answers a JSON string of YAML
    (`config`, or one agent, `simple_agent`, on 127.0.0.1 at `port`); it keeps each request's headers."""

    def __init__(self, config: dict[str, Any] | None = None, *, port: int = 0) -> None:
        if config is None:
            config = {"simple_agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": port}}}}
        body = json.dumps(yaml.safe_dump(config)).encode()
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                server.headers.append(dict(self.headers))
                if self.path != "/global_config_dict_yaml":
                    self.send_error(404)
                    return
                self.send_json(200, body)

        super().__init__(Handler)


@contextlib.contextmanager
def serving(server: ThreadedHTTPServer) -> Iterator[Any]:
    try:
        yield server
    finally:
        server.close()


def task_indices(stdout: bytes) -> list[Any]:
    return [r["_ng_task_index"] for r in result_lines(stdout)]


Handler = Callable[[trio.SocketStream], Awaitable[None]]


TOO_LARGE = "File too large"  # strerror(EFBIG)


async def serve_raw(nursery: trio.Nursery, handler: Handler) -> httpx.URL:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return httpx.URL(f"http://127.0.0.1:{port}/run")


READABLE_WITHIN = 10.0  # seconds: the longest wait for bytes to reach a socket on loopback


async def wait_idle_connections_readable(transport: Any) -> None:
    """Until each idle connection in `transport`'s pool has something to read: bytes, or the
    server's close. Bytes that came over TLS in the last reply's read are off the socket already,
    in trio's SSLStream, where the socket does not show them: they count too."""
    from rollfilter.http.connection import tls_holds_bytes

    for conn in [conn for stack in transport._idle.values() for conn in stack]:
        stream = conn.stream
        if tls_holds_bytes(stream):
            continue
        with trio.fail_after(READABLE_WITHIN):
            await trio.lowlevel.wait_readable(conn.socket)


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head


@pytest.fixture(scope="session")  # an RSA key takes a while to make: one for every test that reads it
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    assert openssl, "openssl is needed to make a test certificate"
    path = tmp_path_factory.mktemp("wire-tls")
    cert, key = path / "cert.pem", path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


class Uvicorn:
    """uvicorn serving tests/servers/wire_server.py's asgi_app on a free loopback port, in its own process."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tests.servers.wire_server:asgi_app", "--host", "127.0.0.1",
             "--port", "0", "--no-access-log", *args],
            cwd=ROOT, stderr=subprocess.PIPE, env=clean_env(),
        )  # fmt: skip
        assert self.process.stderr is not None
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        for line in self.process.stderr:
            found = re.search(rb"running on (http://127\.0\.0\.1:\d+)", line)
            if found:
                self.base = found.group(1).decode()
                break
            assert time.monotonic() < deadline, "uvicorn did not start"
        else:
            pytest.fail("uvicorn exited before it listened")
        self.url = self.base + "/run"
        # Its log goes on; keep the pipe drained.
        self._drain = threading.Thread(target=self.process.stderr.read, daemon=True)
        self._drain.start()

    def requests(self) -> int:
        count = httpx.get(self.base + "/stats", timeout=10).json()["requests"]
        assert isinstance(count, int)
        return count

    def close(self) -> None:
        self.process.kill()
        self.process.wait(SUBPROCESS_TIMEOUT)
        self._drain.join(SUBPROCESS_TIMEOUT)
        assert self.process.stderr is not None
        self.process.stderr.close()


@pytest.fixture
def uvicorn_server() -> Iterator[Any]:
    servers: list[Uvicorn] = []

    def start_uvicorn(*args: str) -> Uvicorn:
        servers.append(Uvicorn(*args))
        return servers[-1]

    try:
        yield start_uvicorn
    finally:
        for server in servers:
            server.close()


# The command, sent signal argv[2] (a name) as module argv[1] starts to be imported; its arguments follow.
SIGNALLED_AT_IMPORT = """
import importlib.abc, os, signal, sys

MODULE, SIGNAL = sys.argv[1], getattr(signal, sys.argv[2])

class Signal(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == MODULE:
            os.kill(os.getpid(), SIGNAL)
        return None

sys.meta_path.insert(0, Signal())
sys.argv[:3] = ["rollfilter"]
from rollfilter.cli.startup import main
main()
"""


def nemo_gym_bodies(
    lines: list[str],
    *,
    agent_name: str | None = None,
    num_repeats: int | dict[str, int] = 1,
    overrides: dict[str, Any] | None = None,
    add_seed: bool = False,
) -> list[dict[str, Any]]:
    """What NeMo Gym's collector POSTs for these input lines (each ending in a newline)."""
    row_to_task_idx: dict[str, int] = {}
    task_idx_to_rollout_idx: Counter[Any] = Counter()
    rows = []
    for row_str in lines:
        row = json.loads(row_str)
        if agent_name:
            row.setdefault("agent_ref", {"name": agent_name})
        name = (row.get("agent_ref") or {}).get("name")
        row["responses_create_params"] = row["responses_create_params"] | (overrides or {})
        if "_ng_task_index" not in row:
            row["_ng_task_index"] = row_to_task_idx.setdefault(row_str, len(row_to_task_idx))
        repeats = num_repeats if isinstance(num_repeats, int) else num_repeats.get(name, num_repeats["_default"])
        for _ in range(repeats):
            row = copy.deepcopy(row)
            row["_ng_rollout_index"] = task_idx_to_rollout_idx[row["_ng_task_index"]]
            task_idx_to_rollout_idx[row["_ng_task_index"]] += 1
            if add_seed:
                metadata = row["responses_create_params"].setdefault("metadata", {})
                extra_body = json.loads(metadata.get("extra_body", "{}"))
                extra_body["seed"] = row["_ng_rollout_index"]
                metadata["extra_body"] = json.dumps(extra_body)
            rows.append(row)
    return rows


def stderr_at_a_terminal(args: Sequence[str], *, input: bytes | str = b"") -> tuple[int, str]:
    """The command in a process whose stderr is a terminal (a pty), stdout a pipe: its exit
    status and what the terminal showed (CRLF made LF)."""
    import pty

    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen(
            [*rollfilter_command(), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=terminal,
            env=clean_env(TERM="xterm", COLUMNS="120"),
        )
        os.close(terminal)
        terminal = -1
        assert proc.stdin is not None
        proc.stdin.write(input.encode() if isinstance(input, str) else input)
        proc.stdin.close()
        shown = read_terminal(controller)
        code = proc.wait(timeout=SUBPROCESS_TIMEOUT)
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    return code, shown


def read_terminal(fd: int) -> str:
    """What the terminal of controller `fd` shows until its other end closes (CRLF made LF)."""
    shown = b""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal's other end closed: the process is gone
            break
        if not chunk:
            break
        shown += chunk
    return shown.decode(errors="replace").replace("\r\n", "\n")


@pytest.fixture
def tracker_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's and W&B's clients, as if installed (the default suite runs without the extras):
    for tests that stand in for the clients themselves."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec",
        lambda name, *args: object() if name in ("mlflow", "wandb") else real(name, *args),
    )
