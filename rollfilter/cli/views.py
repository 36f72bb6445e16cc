"""What shows a command-line run's figures while it goes, each a rendering of the run's snapshot
(`Run.statistics()`): the live display at a terminal (`cli/progress.py`) or plain progress lines
where stderr is none (`cli/progress_lines.py`), the progress file (`cli/files/progress_file.py`),
and the Prometheus endpoint and file (`cli/exporter.py`). `RunViews` picks those the command asks
for, and starts and ends them with the run; each loads its own modules (rich, prometheus_client)
only for a run that shows it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.environment import Environment
from rollfilter.cli.files.outputs import OpenedOutputs
from rollfilter.cli.files.progress_file import known_total, publish_progress
from rollfilter.formats.writers import LineWriter, OutputClosed, OutputFailed
from rollfilter.run.run import Run
from rollfilter.run.statistics import RunStatistics

if TYPE_CHECKING:
    from rollfilter.cli.exporter import Exporter
    from rollfilter.cli.progress import ProgressDisplay
    from rollfilter.cli.progress_lines import ProgressLines


class RunViews:
    """The views of one command-line run (see the module docstring): `display` when stderr is a
    terminal that draws, and lines above it go through it (`fallback`: stderr's writer, when it
    cannot draw); `lines` for --progress where stderr is no terminal; and over the run, once made
    (`serve`), the progress file and the Prometheus endpoint and file."""

    def __init__(
        self, command: CommandConfig, environment: Environment, files: OpenedOutputs, fallback: LineWriter
    ) -> None:
        self.command, self.files = command, files
        self.display = _display(command, environment, fallback)
        self.lines = _progress_lines(command, environment)
        self.exporter: Exporter | None = None

    def serve(self, services: trio.Nursery, run: Run, say: Callable[[str], None]) -> None:
        """Serve the Prometheus endpoint and file over `run`'s figures from now on (before the run
        sends, as --control's socket is)."""
        prometheus_file = self.files.whole.get("prometheus_file")
        if not self.files.listening and prometheus_file is None:
            return
        from rollfilter.cli.exporter import Exporter  # and prometheus_client: only for a run that exports

        self.exporter = Exporter(run, self.files.listening, prometheus_file)
        self.exporter.start(services, say)

    def show(
        self,
        services: trio.Nursery,
        statistics: Callable[[], RunStatistics],
        planned: int | None,
        say: Callable[[str], None],
    ) -> None:
        """Show the run's figures from now on (it is connected, and has planned its materialized
        file's rollouts when it has one: the `planned` total)."""
        total = self._total(planned)
        for view in (self.display, self.lines):
            if view is not None:
                services.start_soon(view.serve, statistics, total)
        progress_file = self.files.whole.get("progress_file")
        if progress_file is not None:
            services.start_soon(publish_progress, progress_file, statistics, say)

    def finish(self, statistics: RunStatistics) -> None:
        """The files' last content: the figures as the run ended (best effort, as while running)."""
        progress_file = self.files.whole.get("progress_file")
        if progress_file is not None:
            with contextlib.suppress(OutputClosed, OutputFailed):
                progress_file.replace(b"%d\n" % statistics.finished)
        if self.exporter is not None:
            self.exporter.finish()

    def _total(self, planned: int | None) -> Callable[[], int | None]:
        """How the display finds the run's total, for its ETA."""
        if planned is not None:
            return lambda: planned
        config = self.command.config
        repeats = None if config.repeats.by_agent else config.repeats.largest
        if config.reverify is not None:
            repeats = None if config.reverify.judge_failed_only else 1  # a line a rollout (of those re-scored)
        return known_total(self.command.inputs, limit=config.limit, shard=config.shard, repeats=repeats)


def progress_wanted(forced: bool | None, *, quiet: bool, can_draw: bool) -> bool:
    """Shown when stderr is a terminal that can draw (not TERM=dumb) unless -q;
    --progress/--no-progress decide."""
    if forced is not None:
        return forced
    return not quiet and can_draw


def _display(command: CommandConfig, environment: Environment, fallback: LineWriter) -> ProgressDisplay | None:
    config = command.config
    wanted = progress_wanted(command.progress, quiet=command.quiet, can_draw=environment.stderr_can_draw)
    if command.dry_run or not wanted or not environment.stderr_is_terminal:
        return None
    from rollfilter.cli.progress import ProgressDisplay

    return ProgressDisplay(
        fd=environment.stderr,
        variables=environment.variables,
        force_terminal=bool(command.progress),
        adaptive=config.adaptive,
        priced=bool(config.cost.prices),
        limited=config.rates.limited,
        steered=command.control_socket is not None,
        grouped=config.groups is not None,
        fallback=fallback,
    )


def _progress_lines(command: CommandConfig, environment: Environment) -> ProgressLines | None:
    """--progress where stderr is no terminal (a batch job's log): plain lines, not the display."""
    if command.dry_run or not command.progress or environment.stderr_is_terminal:
        return None
    from rollfilter.cli.progress_lines import ProgressLines

    return ProgressLines(fd=environment.stderr)
