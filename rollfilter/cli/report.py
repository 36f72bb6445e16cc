"""What the command reports when a run has ended: the files written whole at the end (--metrics,
--aggregate), why it stopped, what could not be written, the run's warnings, and its summary,
last, as the one JSON line (indented for a person at a terminal, under its chart); then how the
run ended (`RunEnd`), which `cli/statuses.py` maps to an exit status. A run stopped or refused
before it sent anything reports the summary of a run that sent nothing, as every run's is a `Run`'s.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from rollfilter.cli.chart import chart_lines
from rollfilter.cli.compact import compact_summary
from rollfilter.cli.environment import Environment
from rollfilter.cli.files.outputs import OpenedOutputs, replace_content
from rollfilter.cli.messages import option_of, say, write_summary
from rollfilter.cli.statuses import RunEnd, tracker_status
from rollfilter.config import Config
from rollfilter.errors import ServiceError
from rollfilter.formats.writers import OutputFailed
from rollfilter.run.run import ConfigWarning, Run
from rollfilter.stops import StopCause, StopControl

if TYPE_CHECKING:
    from rollfilter.run.aggregate import AggregateReport

_encode = msgspec.json.Encoder().encode
# The stops whose reason is a fault, said on stderr wherever it goes; other reasons are notices.
FAULT_STOPS = frozenset({StopCause.OUTPUT_FAILED, StopCause.AGENT_UNREACHABLE, StopCause.UNHEALTHY})


async def report_end(
    run: Run,
    environment: Environment,
    files: OpenedOutputs,
    *,
    failures: list[OutputFailed],
    inputs_lost: bool,
    quiet: bool,
    resumed_by: str | None = None,
) -> RunEnd:
    """Report the ended `run` (see the module docstring), whose outputs `files` are, on the
    standard error of `environment`: `failures` are the outputs that could not be written (those
    written here are added), and `inputs_lost` whether an input could not be read whole. A run
    interrupted at a terminal, whose -o keeps a run record, ends with `resumed_by`: the line that
    resumes it."""
    summary_object, statistics, report = run.summary(), run.statistics(), run.report
    summary = _encode(summary_object) + b"\n"
    try:
        replace_content(files.whole.get("metrics_file"), summary)
        if report is not None:
            replace_content(files.whole.get("aggregate_file"), report.file_bytes())
    except OutputFailed as failure:
        failures.append(failure)
    # Why the run stopped is in the summary (`stopped`); a line of its own would come between a
    # pipe or a file and the one JSON line it is there to read, so it is said at a terminal only.
    # A fault (an output, an agent) is said wherever stderr goes.
    control, stderr = run.control, environment.stderr
    notice = control.reason if control.cause in FAULT_STOPS or environment.stderr_is_terminal else None
    for message in filter(None, dict.fromkeys([notice, *map(str, failures)])):
        say(message, stderr)
    for warning in run.warnings():
        say(warning_message(warning), stderr)
    # The trackers' warnings come before the summary, which is stderr's last line. A signal
    # during their wait stops no row (the summary, made before it, says none): --resume has
    # nothing to go on with then.
    stopped = control.cause
    await run.end_tracking(
        tracker_status(control.cause, failed=bool(failures)), on_warning=lambda text: say(text, stderr)
    )
    summary_lost = False
    if not quiet:
        metrics = files.whole.get("metrics_file")
        shown = _shown_summary(summary_object, summary, environment, whole_at=metrics.path if metrics else None)
        summary_lost = not write_summary(stderr, shown)
    interrupted = stopped is StopCause.INTERRUPTED and environment.stderr_is_terminal
    if interrupted and files.record is not None and resumed_by is not None:
        say(resumed_by, stderr)
    # Rows lost, or an input, as cat says; an aggregate without some agent's answer or some results.
    lost = statistics.failed or statistics.not_persisted or inputs_lost or (report is not None and not report.whole)
    return RunEnd(control.cause, bool(lost), output_failed=bool(failures), summary_lost=summary_lost)


async def report_unsent(
    config: Config, control: StopControl, tls: ssl.SSLContext | None, environment: Environment, *, quiet: bool
) -> RunEnd:
    """A run of `config` stopped before it was made (`control` says why): the summary of a run
    that sent nothing."""
    unsent = Run(config, control=control, tls=tls)
    try:
        _summary_of_nothing_sent(unsent, environment, quiet=quiet)
    finally:
        with trio.CancelScope(shield=True):
            await unsent.aclose()
    return RunEnd(control.cause)


async def report_refused(
    refusals: BaseExceptionGroup[ServiceError], run: Run, environment: Environment, *, quiet: bool
) -> RunEnd:
    """A run that a service it needs before sending refused: the line of the first refusal (of
    `refusals`, however deep it is nested), then the summary, of nothing sent."""
    refused: BaseException = refusals
    while isinstance(refused, BaseExceptionGroup):
        refused = refused.exceptions[0]
    assert isinstance(refused, ServiceError)
    say(str(refused), environment.stderr)
    await run.end_tracking(tracker_status(None, failed=True), on_warning=lambda text: say(text, environment.stderr))
    _summary_of_nothing_sent(run, environment, quiet=quiet)
    return RunEnd(refused=refused)


def aggregate_lines(report: AggregateReport | None) -> list[str]:
    """What --aggregate could not do (`report`: None when the run stopped before it), to say
    before the summary."""
    if report is None:
        return []
    lines = [f"--aggregate: {problem}" for problem in report.problems]
    if report.unnamed:
        lines.append("--aggregate: to name the rows' agent, give -a NAME beside -u (or -e NAME=URL -a NAME)")
    return lines


def _summary_of_nothing_sent(run: Run, environment: Environment, *, quiet: bool) -> None:
    if not quiet:
        summary = run.summary()
        write_summary(environment.stderr, _shown_summary(summary, _encode(summary) + b"\n", environment, whole_at=None))


def _shown_summary(summary: dict[str, Any], line: bytes, environment: Environment, *, whole_at: str | None) -> bytes:
    """The summary as standard error shows it: for a person at a terminal, the pass histogram's
    chart and the compact summary (`whole_at`: the file with the whole one); elsewhere (a pipe, a
    file) the one JSON `line`, for jq and `tail -n 1`."""
    if not environment.stderr_is_terminal:
        return line
    drawn = [*chart_lines(summary, can_draw=environment.stderr_can_draw), *compact_summary(summary, whole_at=whole_at)]
    return b"".join(text.encode() + b"\n" for text in drawn)


def warning_message(warning: ConfigWarning) -> str:
    """A run's warning as the command says it: naming the option the user gave."""
    option = option_of(warning.field) if warning.key is None else option_of(warning.field, warning.key)
    return f"{option}: {warning.problem}"


def summary_for(summary: bytes, at_terminal: bool) -> bytes:
    """The summary line as it is shown: indented for a person at a terminal; elsewhere (a pipe, a
    file) the one JSON line as it is, for jq and `tail -n 1`."""
    if not at_terminal:
        return summary
    return msgspec.json.format(summary, indent=2) + b"\n"
