"""The command line's lines on stderr, made and written in one place.

Every line the command writes to stderr is made by `message_line`: one prefix, and the text with
control characters and undecodable bytes escaped by `redact.printable`, so that neither a
server's text nor a file's name can drive the terminal (escaping undecodable bytes alone,
as `errors="backslashreplace"` does, lets an ESC or a CR through). `say` writes such a line
at once; during a run, the lines go through the run's batched writer instead (or above the
progress display, which draws itself through rich), made by the same `message_line`; `write_stderr`
writes what is already whole lines, the summary.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from rollfilter.errors import ErrorKind
from rollfilter.formats.writers import OutputClosed, OutputFailed, write_all
from rollfilter.redact import printable

if TYPE_CHECKING:
    from rollfilter.outcomes import Failure
    from rollfilter.run.statistics import RunStatus

PREFIX = "rollfilter: "

# Each Config field (a part's as `retries.budget`) by the option that sets it: a ConfigError is
# said by its option, as every other refusal of the command line is. `{key}` is a mapping's key.
# A part is here by itself where a Config's own check names it: `groups`, `repeats`, `reverify`.
OPTION_OF_FIELD = {
    "url": "-u/--url",
    "endpoints": "-e/--endpoint",
    "agent": "-a/--agent",
    "concurrency": "-j/--concurrency",
    "adaptive": "--adaptive",
    "limit": "-n/--limit",
    "repeats": "-r",
    "repeats.count": "-r",
    "repeats.by_agent": "-r {key}=K",
    "repeats.seeds": "--repeat-seeds",
    "groups": "--groups",
    "groups.keep_incomplete": "--keep-incomplete",
    "groups.drop_uniform": "--drop-uniform",
    "groups.field": "--group-field",
    "groups.target": "--target-groups",
    "groups.max_staleness": "--max-staleness",
    "groups.batch": "--batch-groups",
    "policy_version": "--policy-version",
    "params": "-p/--param",
    "retries.count": "--retries",
    "retries.budget": "--retry-budget",
    "retries.statuses": "--retry-on",
    "timeout.attempt": "--timeout",
    "timeout.connect": "--connect-timeout",
    "tls.cacert": "--cacert",
    "tls.insecure": "--insecure",
    "wire.proxy": "--proxy",
    "wire.cross_origin_redirects": "--cross-origin-redirects",
    "wire.max_reply_bytes": "--max-reply-bytes",
    "routing.policy": "--route",
    "routing.affinity_header": "--affinity-header",
    "rates.rpm": "--rpm",
    "rates.tpm": "--tpm",
    "rates.rpm_by_agent": "--rpm NAME=N",
    "rates.tpm_by_agent": "--tpm NAME=N",
    "cost.prices": "--prices",
    "cost.max_usd": "--max-cost",
    "max_failures.count": "--max-failures",
    "max_failures.fraction": "--max-failures",
    "health.unhealthy": "--unhealthy",
    "health.max_unhealthy": "--max-unhealthy",
    "health.max_masked": "--max-masked",
    "headers": "-H/--header",
    "shard": "--shard",
    "repeats.pass_threshold": "--pass-threshold",
    "head_server": "--head-server",
    "aggregate": "--aggregate",
    "reverify": "--reverify",
    "reverify.materialized": "--reverify",
    "reverify.judge_failed_only": "--judge-failed-only",
    "reverify.force": "--force",
    "trackers.mlflow": "--mlflow",
    "trackers.experiment": "--experiment",
    "trackers.wandb": "--wandb",
    "trackers.run_name": "--run-name",
    "trackers.rollouts": "--track-rollouts",
    "trackers.ids_file": "-o/--output",
}
# A field's path as a ConfigError gives it: the field, then where in it (`headers[0][0]`, `repeats_by_agent['a']`).
_FIELD_PATH = re.compile(r"(?P<field>[a-z_]+(?:\.[a-z_]+)?)(?:\[(?P<key>'[^']*'|[0-9]+)\])?")
_FIELD_NAMED = re.compile(r"\bConfig\.(?P<field>[a-z_]+(?:\.[a-z_]+)?)")


def option_message(field: str, problem: str) -> str | None:
    """A ConfigError's message (its `field` and `problem`) as the command line says it, by the
    options that set the fields it names; None when a field it names has no option."""
    path = _FIELD_PATH.match(field)
    if path is None or path["field"] not in OPTION_OF_FIELD:
        return None
    key = (path["key"] or "").strip("'")
    option = option_of(path["field"], key)
    named = [match["field"] for match in _FIELD_NAMED.finditer(problem)]
    if any(name not in OPTION_OF_FIELD for name in named):
        return None
    said = _FIELD_NAMED.sub(lambda match: OPTION_OF_FIELD[match["field"]].format(key="NAME"), problem)
    return f"{option} {said}"


def option_of(field: str, key: str = "NAME") -> str:
    """The option that sets Config's `field` (`repeats_by_agent`, key `a`: `-r a=K`)."""
    return OPTION_OF_FIELD[field].format(key=key)


def message_line(text: str, prefix: str = PREFIX) -> bytes:
    """`text` as one line of the command's on stderr: the prefix, the text escaped, a newline.
    A line that is not the command's own (a SystemExit's message) has no prefix."""
    return f"{prefix}{printable(text)}\n".encode(errors="backslashreplace")


def say(text: str, fd: int) -> None:
    """One line on stderr (`fd`) at once. stderr may be closed or full: then the line is lost,
    and the exit status tells."""
    write_stderr(fd, message_line(text))


def write_stderr(fd: int, data: bytes) -> None:
    """Whole lines on stderr (`fd`), at once and best effort, as `say` writes them."""
    with contextlib.suppress(OutputClosed, OutputFailed):
        write_all(fd, data, "standard error")


def write_summary(fd: int, data: bytes) -> bool:
    """The summary (and its chart) on stderr (`fd`): True once written. The summary is an output
    of the run, as its results are: where it cannot be written, the exit status says so."""
    try:
        write_all(fd, data, "standard error")
    except (OutputClosed, OutputFailed):
        return False
    return True


def failure_message(failure: Failure, *, details_hint: bool) -> str:
    """A failure's message as the command says it: the settings it names as their options, and
    for an internal error, with `details_hint`, where its details are (the library has no -v)."""
    message = failure.message
    if details_hint and failure.kind is ErrorKind.INTERNAL:
        message += " (-v shows it)"
    return message


def waiting_words(status: RunStatus, *, paused: bool = False) -> list[str]:
    """The rollouts taken and not sent, in words, by what they wait on (what none waits on left
    out), as every view of a run's status says them, apart from those in flight; with `paused`,
    first "paused" while the run is."""
    counts = (
        (status.waiting_on_pause, "waiting on the pause"),
        (status.waiting_on_rate_limits, "waiting on rate limits"),
        (status.waiting_on_window, "waiting on the adaptive window"),
        (status.waiting_on_policy_version, "waiting for the policy version"),
    )
    words = ["paused"] if paused and status.paused else []
    return words + [f"{count:,} {why}" for count, why in counts if count]


def back_in_open_groups(status: RunStatus) -> list[str]:
    """With groups, the rollouts that have ended and wait for their group to close (counted ended
    then), in words, as every view of a run's status says them; none when there are none."""
    return [f"{status.in_open_groups:,} back in open groups"] if status.in_open_groups else []


def repeats_missing(agents: Iterable[str | None], given: Mapping[str, int]) -> str:
    """Why a materialized file's first pass stopped: rows of `agents` have no repeat count, in
    what -r gives (`given`, by agent)."""
    shown = ", ".join("rows naming no agent" if name is None else repr(name) for name in agents)
    counts = ", ".join(f"{name}={count}" for name, count in sorted(given.items()))
    return (
        f"-r {counts} gives no repeat count for {shown}, and no default -r K: give -r K for"
        " the agents it does not name, or -r NAME=K for each; nothing was sent"
    )
