"""Exit statuses, the exception hierarchy, and the kinds of per-row failure.

    RollfilterError          a condition that ends the run before or instead of sending
    ├── UsageError           bad options or unusable files: exit 2, nothing sent
    ├── ServiceError         a service the run depends on (a head server) cannot be used: exit 3
    └── OutputInUse          another run holds an output this run would write: exit 75, nothing sent
    SteeringError            (a ValueError) a change a running run cannot take: nothing changed

Per-row failures are not exceptions: they are records (`outcomes.py`: an `AttemptFailure`, tied to
its row as a `Failure`) that the run writes to the errors record and counts, and the run goes on.

A `ConfigError` (config.py) names the Config field at fault; the command line reports a bad
option value by the option it came from. Failures and events say what happened without naming a
setting, so that they read the same from Python and from the command line.
"""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """Process exit statuses; `man/rollfilter.1` documents each under EXIT STATUS."""

    OK = 0
    ROWS_FAILED = 1  # the run ended, but some rows failed (or --max-failures stopped it)
    USAGE = 2  # bad option, bad -p, unreadable FILE, unwritable -o; nothing was sent
    SERVICE_UNAVAILABLE = 3  # the head server could not be reached or read, or an agent never answered
    OUTPUT_FAILED = 74  # sysexits EX_IOERR: an output file or stream could not be written
    OUTPUT_IN_USE = 75  # sysexits EX_TEMPFAIL: another run holds an output; nothing was sent, try again later
    HUNG_UP = 129  # 128+1 SIGHUP: the terminal closed or the ssh session ended; handled as SIGTERM
    INTERRUPTED = 130  # 128+2 SIGINT
    BROKEN_PIPE = 141  # 128+13 SIGPIPE: the reader of stdout went away
    TERMINATED = 143  # 128+15 SIGTERM


class ErrorKind(enum.StrEnum):
    """Why a row failed; the `kind` of an errors-record line."""

    BAD_INPUT = "bad_input"  # the input line is not a JSON object
    NO_ROUTE = "no_route"  # no -u, -e or head-server entry names an agent for the row
    CONNECT = "connect"  # the agent could not be reached, or dropped the connection
    TIMEOUT = "timeout"  # an attempt took longer than --timeout
    HTTP_STATUS = "http_status"  # the agent answered a status other than 200
    BAD_RESPONSE = "bad_response"  # a reply that is not HTTP, or a 200 whose body is not a JSON object
    AGENT_FAILURE = "agent_failure"  # a 2xx whose body carries the agent's own _ng_failure_class
    NOT_PERSISTED = "not_persisted"  # a 2xx carrying _ng_no_persist: kept nowhere, run again by --resume
    UNHEALTHY = "unhealthy"  # with Config.health's "fail", a 2xx whose result failed a health check
    GROUP_FIELD = "group_field"  # with --drop-uniform, a result without a numeric --group-field
    INTERNAL = "internal"  # an unexpected error while handling this one row (a bug: details under -v)


class RollfilterError(Exception):
    """A condition that stops rollfilter as a whole; its message is one line for the user."""

    exit_status = ExitStatus.USAGE


class UsageError(RollfilterError):
    """The command line or its files cannot be used; nothing has been sent."""

    exit_status = ExitStatus.USAGE


class ServiceError(RollfilterError):
    """A service the run needs before sending (the head server) is unreachable or unusable."""

    exit_status = ExitStatus.SERVICE_UNAVAILABLE


class OutputInUse(RollfilterError):
    """Another run holds the lock on an output this run would write; nothing has been sent.
    `output` names it (`-o out.jsonl`), and `holder` who holds it (`process 4242 (rollfilter)`)."""

    exit_status = ExitStatus.OUTPUT_IN_USE

    def __init__(self, message: str, *, output: str, holder: str) -> None:
        super().__init__(message)
        self.output = output
        self.holder = holder


class SteeringError(ValueError):
    """A change that cannot be made to a run (a version going back, an agent the run does not have)."""
