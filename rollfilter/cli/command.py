"""A command-line run: the library's `Config`, and the inputs, files and display the command line adds."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from rollfilter.config import Config
from rollfilter.defaults import DEFAULT_MAX_LINE_BYTES
from rollfilter.errors import UsageError
from rollfilter.formats.resume import DEFAULT_MAX_ATTEMPTS, held_path

if TYPE_CHECKING:
    from rollfilter.demo import DemoOptions  # the demo agent (trio) is loaded by a run that starts it


@dataclasses.dataclass(frozen=True, slots=True)
class CommandConfig:
    """A command-line run: the library's `Config` (`config`), and the inputs and files around it,
    the demo agent it starts, and what it shows on stderr."""

    config: Config
    inputs: tuple[str, ...] = ("-",)
    ordered: bool = False  # -k: results in input order
    output: str | None = None
    errors_file: str | None = None
    metrics_file: str | None = None
    per_task_file: str | None = None
    aggregate_file: str | None = None  # --aggregate FILE: NeMo Gym's aggregate file
    materialized_file: str | None = None  # --materialized FILE: every /run body as sent
    progress_file: str | None = None  # --progress-file FILE: the number of finished rollouts
    resume: bool = False
    append: bool = False  # -o and --errors may already hold lines of another run
    overwrite: bool = False  # -o, --errors and --dropped are emptied (their lock taken first): a new run
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # failed attempts after which --resume gives a pair up
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    shard_auto: bool = False  # the shard came from --shard auto: a resumed output's own record wins over it
    wait_lock: bool = False  # an output another run holds is waited for, not refused
    dropped_file: str | None = None  # --dropped FILE: the rollouts of groups not written, stamped with why
    prometheus: tuple[str, int] | None = None  # --prometheus HOST:PORT: where to serve /metrics
    prometheus_file: str | None = None  # --prometheus-file FILE: the same text, for node_exporter
    control_socket: str | None = None  # --control SOCKET: where the run listens for commands
    compare_files: tuple[str, ...] = ()  # --summarize --compare BASELINE: the other run's result files
    demo: DemoOptions | None = None  # --demo: the demo agent the run starts and sends every row to
    handle_signals: bool = True  # off for a run inside another program's loop, which handles its own
    quiet: bool = False  # -q: no summary and no progress on stderr
    progress: bool | None = None  # --progress/--no-progress; None: on when stderr is a terminal
    verbose: bool = False  # -v: a line on stderr for each row's events
    dry_run: bool = False  # --dry-run: print what would be sent, send nothing
    argv: tuple[str, ...] = ()  # the words given: an interrupted run says them again, to resume it

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.aggregate_file is not None and not self.config.aggregate:
            raise UsageError("--aggregate FILE is written from the agents' /aggregate_metrics, which it asks for")
        if self.max_attempts < 1:
            raise UsageError("--max-attempts must be at least 1")
        if self.resume and self.output is None:
            raise UsageError("--resume needs -o FILE: it skips the rows already in FILE")
        if self.overwrite and (self.output is None or self.resume or self.append):
            raise UsageError("--overwrite replaces -o FILE with a new run: give -o, and neither --resume nor --append")
        if self.dropped_file is not None and not self.config.groups:
            raise UsageError("--dropped FILE takes the rollouts of dropped groups: give --groups or --drop-uniform")

    @property
    def held_file(self) -> str | None:
        """Where a run of whole groups keeps the finished rollouts of its groups (beside -o): a
        resumed run takes them back. None without --groups, without -o, and with --append (runs
        that share -o keep no groups of their own)."""
        if not self.config.groups or self.output is None or (self.append and not self.resume):
            return None
        return held_path(os.path.realpath(self.output))  # beside a symlink's file, as the run record
