"""--control SOCKET: steer a command-line run from the shell, over a Unix socket.

    echo pause | socat - UNIX-CONNECT:run.sock        (or: nc -U run.sock)

Each line a client sends is one command; each command gets one line back, a JSON object with
`"ok"`: `pause`, `resume`, `drain [SECONDS]`, `concurrency N`, `rpm [AGENT=]N|off`,
`tpm [AGENT=]N|off`, `version V` and `status`. Words are split and quoted as a shell does, so an
agent's name with a space in it is quoted (`rpm "my agent"=600`), and numbers are written in ASCII
digits, as the options take them. A command that cannot be carried out answers
`{"ok": false, "error": ...}` and changes nothing. This is HAProxy's runtime API in small.

The socket is made with mode 0600, so only the run's own user may steer it. A path that exists
is taken over only when it is a socket nobody listens on (what a killed run leaves); anything
else is refused before the run starts. Each client is served by a task of its own, so a client
that says nothing, or a slow drain, holds up no other; lines are bounded (CONTROL_LINE_BYTES),
a client silent for CONTROL_IDLE_SECONDS is let go, and at most CONTROL_CLIENTS are served at
once. The socket is removed when the run ends, however it ends.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import secrets
import socket
import stat
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import trio

from rollfilter.cli.parsers import DECIMAL
from rollfilter.config import is_decimal
from rollfilter.errors import SteeringError, UsageError
from rollfilter.run.run import Run

CONTROL_LINE_BYTES = 4096  # a command is a few words: a longer line is refused, and its client let go
CONTROL_IDLE_SECONDS = 300.0  # a client that sends no line, or takes no answer, for this long is let go
CONTROL_CLIENTS = 16  # served at once; one more is told so and let go
CONTROL_BACKLOG = 16
# Out of file descriptors (or kernel memory), accept() fails until some are closed: the control
# waits a moment and accepts again, as trio.serve_listeners does, rather than end the run.
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
ACCEPT_RETRY_SECONDS = 0.1
ARGUMENT_OF = {"concurrency": "N", "rpm": "[AGENT=]N|off", "tpm": "[AGENT=]N|off", "version": "V"}  # one each
COMMANDS = "pause, resume, drain [SECONDS], concurrency N, rpm [AGENT=]N|off, tpm [AGENT=]N|off, version V, status"
QUOTED_AGENT = '"my agent"=600'  # how an agent's name with a space in it is given

_encode = msgspec.json.Encoder().encode


class ControlSocket:
    """The listening socket at `path`, made with mode 0600 (see the module docstring).

    UsageError when the path exists and is not a stale socket, or cannot be listened on.
    `remove()` unlinks it if it is still this socket (another run may have taken the path over).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        if not path:  # Linux would bind an empty path to an abstract address, which no file names
            raise UsageError("--control needs a path for its socket")
        _clear_stale(path)
        self.socket = sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _listen_at(sock, path)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EEXIST:  # another run took the path between the check and now
                raise UsageError(f"--control {path}: another run is listening on it") from None
            raise UsageError(f"--control {path}: cannot listen there: {exc.strerror or exc}") from None
        self._inode = os.stat(path).st_ino

    def remove(self) -> None:
        """Unlink the path if it is still this socket, and close it (again: a no-op)."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        self.socket.close()


def _listen_at(sock: socket.socket, path: str) -> None:
    """Bind `sock` under a name of its own beside `path`, listen, then link it to `path`: the path
    appears listening. Bound at `path` itself, a client (or another run's check for a stale
    socket) that came between bind() and listen() would be refused, and take a live run's socket
    for a dead one. A link never replaces a file: EEXIST if `path` was taken meanwhile."""
    folder = os.path.dirname(path)
    private = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}")
    umask = os.umask(0o177)  # the socket is made 0600, never readable by others for a moment
    try:
        try:
            sock.bind(private)
        except OSError:  # a path near the length a socket's address may have: bound where it goes
            sock.bind(path)
            sock.listen(CONTROL_BACKLOG)
            return
    finally:
        os.umask(umask)
    try:
        sock.listen(CONTROL_BACKLOG)
        os.link(private, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(private)


def _clear_stale(path: str) -> None:
    """Unlink `path` if it is a socket nobody listens on; UsageError if it is anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"--control {path}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"--control {path} exists and is not a socket: give a new path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:  # left by a run that is gone
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a folder this user may not change, a read-only file system
            raise UsageError(f"--control {path}: cannot take over the stale socket: {exc.strerror}") from None
        return
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return
        raise UsageError(f"--control {path}: {exc.strerror}") from None
    finally:
        probe.close()
    raise UsageError(f"--control {path}: another run is listening on it")


@contextlib.contextmanager
def control_socket(path: str | None) -> Iterator[ControlSocket | None]:
    """The control socket at `path` (None: none) while the block runs; removed after it."""
    if path is None:
        yield None
        return
    control = ControlSocket(path)
    try:
        yield control
    finally:
        control.remove()


class ControlServer:
    """Serves the clients of a run's control socket until cancelled; `on_command(line)` hears of
    each command that changed the run (for -v), and `fit(n)` says how many of `n` requests at once
    this process can hold (its open files), as the run's own -j was fitted."""

    def __init__(
        self,
        control: ControlSocket,
        run: Run,
        on_command: Callable[[str], None] | None = None,
        fit: Callable[[int], int] = lambda wanted: wanted,
    ) -> None:
        self._listener = trio.SocketListener(trio.socket.from_stdlib_socket(control.socket))
        self._run = run
        self._on_command = on_command
        self._fit = fit
        self.clients = 0

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    stream = await self._listener.accept()
                except OSError as exc:
                    if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                        raise
                    await trio.sleep(ACCEPT_RETRY_SECONDS)
                    continue
                if self.clients >= CONTROL_CLIENTS:
                    nursery.start_soon(self._refuse, stream)
                else:
                    self.clients += 1
                    nursery.start_soon(self._serve_client, stream)

    async def _refuse(self, stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError), trio.move_on_after(1):
            await stream.send_all(_answer_line(error=f"busy: {CONTROL_CLIENTS} clients are connected already"))
        await trio.aclose_forcefully(stream)

    async def _serve_client(self, stream: trio.SocketStream) -> None:
        try:
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                buffer = bytearray()
                while True:
                    line = await _next_line(stream, buffer)
                    if line is None:
                        return
                    if isinstance(line, bytes):
                        if not await _answered(stream, await self.command(line)):
                            return
                        continue
                    await _answered(stream, _answer_line(error=line))
                    return  # a line too long: what follows it is no command
        finally:
            self.clients -= 1
            await trio.aclose_forcefully(stream)

    async def command(self, line: bytes) -> bytes:
        """The answer line to one command line."""
        try:
            text = line.decode().strip()
        except UnicodeDecodeError:
            return _answer_line(error="a command is UTF-8 text")
        try:
            words = _words(text)
            if not words:
                return _answer_line(error=f"no command: give one of {COMMANDS}")
            answer = await self._carry_out(*words)
        except SteeringError as exc:
            return _answer_line(error=str(exc))
        if self._on_command is not None and words[0] != "status":
            self._on_command(f"--control: {text}")
        return _answer_line(**answer)

    async def _carry_out(self, name: str, *arguments: str) -> dict[str, Any]:
        run = self._run
        if name in ("pause", "resume", "status", "drain"):
            if len(arguments) > (1 if name == "drain" else 0):
                raise SteeringError(f"{name} takes {'at most one argument' if name == 'drain' else 'no argument'}")
            if name == "pause":
                run.steering.pause()
            elif name == "resume":
                run.steering.resume()
            elif name == "drain":
                drained = await run.steering.drain(_seconds(arguments[0]) if arguments else None)
                return {"drained": drained, **self._status()}
            return self._status()
        if name not in ARGUMENT_OF:
            raise SteeringError(f"{name!r} is no command: give one of {COMMANDS}")
        if len(arguments) != 1:
            quoting = f" (quote an agent's name with a space: {name} {QUOTED_AGENT})" if name in ("rpm", "tpm") else ""
            raise SteeringError(f"{name} takes one argument: {name} {ARGUMENT_OF[name]}{quoting}")
        (argument,) = arguments
        if name == "concurrency":
            wanted = _whole_number(argument, "concurrency", least=1)
            fitted = self._fit(wanted)
            run.set_concurrency(fitted)
            if fitted < wanted:
                note = f"{wanted} at once needs more open files than this process may have: {fitted} at once"
                return {**self._status(), "note": note}
        elif name == "version":
            run.set_policy_version(_whole_number(argument, "version", signed=True))
        elif name in ("rpm", "tpm"):
            agent, equals, rate = argument.rpartition("=")
            if equals and not agent:  # not every agent, as a bare N is: a name left out
                raise SteeringError(f"{name} takes [AGENT=]N or [AGENT=]off: no agent before '=' in {argument!r}")
            new_rate = None if rate == "off" else _rate(rate, name)
            run.set_rate(agent or None, **{name: new_rate})
        return self._status()

    def _status(self) -> dict[str, Any]:
        statistics = self._run.statistics()
        figures = statistics.steering.as_dict()
        if statistics.connected:
            figures.update(
                ended=statistics.ended,
                failed=statistics.failed,
                in_flight=statistics.in_flight,  # sent: those taken and not sent are counted by what they wait on
                waiting_on_pause=statistics.waiting_on_pause,
                waiting_on_rate_limits=statistics.waiting_on_rate_limits,
                waiting_on_window=statistics.waiting_on_window,
                in_open_groups=statistics.in_open_groups,  # back, counted ended once their group closes
            )
        figures["control_clients"] = self.clients  # the one asking included
        return figures


async def _answered(stream: trio.SocketStream, answer: bytes) -> bool:
    """Send `answer`; False when the client took none of it for CONTROL_IDLE_SECONDS (it sends
    commands and reads no answer: its buffers are full), so that it is let go."""
    with trio.move_on_after(CONTROL_IDLE_SECONDS):
        await stream.send_all(answer)
        return True
    return False


def _answer_line(*, error: str | None = None, **figures: Any) -> bytes:
    answer = {"ok": False, "error": error} if error is not None else {"ok": True, **figures}
    return _encode(answer) + b"\n"


async def _next_line(stream: trio.SocketStream, buffer: bytearray) -> bytes | str | None:
    """The next line from `stream` (without its newline); None at its end or after
    CONTROL_IDLE_SECONDS of silence; the problem, as text, for a line over CONTROL_LINE_BYTES."""
    while (end := buffer.find(b"\n")) < 0:
        if len(buffer) > CONTROL_LINE_BYTES:
            return f"a command line is at most {CONTROL_LINE_BYTES} bytes"
        with trio.move_on_after(CONTROL_IDLE_SECONDS):
            data = await stream.receive_some(CONTROL_LINE_BYTES + 1)
            if not data:
                return bytes(buffer) if buffer else None  # a last command without its newline
            buffer += data
            continue
        return None
    line = bytes(buffer[:end])
    del buffer[: end + 1]
    if len(line) > CONTROL_LINE_BYTES:
        return f"a command line is at most {CONTROL_LINE_BYTES} bytes"
    return line


def _words(text: str) -> list[str]:
    """A command line's words, split and quoted as a shell does (an agent's name may hold a space)."""
    import shlex  # only once a client sends a command: a run without --control never needs it

    try:
        return shlex.split(text)
    except ValueError:  # a quote not closed, a backslash at the end
        raise SteeringError(f"a quote is not closed in {text!r}: quote as a shell does, rpm {QUOTED_AGENT}") from None


# Numbers are written in ASCII digits, as the options take them: int() and float() would take
# "1_0" and other scripts' digits too.
def _whole_number(text: str, what: str, *, least: int | None = None, signed: bool = False) -> int:
    if not is_decimal(text.removeprefix("-") if signed else text):
        raise SteeringError(f"{what} takes a whole number in the digits 0-9, not {text!r}")
    number = int(text)
    if least is not None and number < least:
        raise SteeringError(f"{what} takes a whole number of at least {least}, not {number}")
    return number


def _rate(text: str, name: str) -> float:
    if not DECIMAL.fullmatch(text):
        raise SteeringError(f"{name} takes [AGENT=]N or [AGENT=]off, N a number in the digits 0-9, not {text!r}")
    return float(text)


def _seconds(text: str) -> float:
    seconds = float(text) if DECIMAL.fullmatch(text) else math.inf
    if not seconds < math.inf:
        raise SteeringError(f"drain takes a number of seconds in the digits 0-9, not {text!r}")
    return seconds
