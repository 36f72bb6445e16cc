"""The open-file limit, for the command: raised as far as it goes, and -j fitted under it."""

from __future__ import annotations

import dataclasses

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.messages import say
from rollfilter.run.run import fit_to_open_files


def files_per_connection(command: CommandConfig) -> int:
    """The open files a request at once takes: two with --demo, whose agent serves the other end
    of each connection from this process."""
    return 2 if command.demo is not None else 1


def fitted_concurrency(wanted: int, *, files_per_connection: int) -> int:
    """How many of `wanted` requests at once fit under the open-file limit (raised as far as it goes)."""
    return fit_to_open_files(wanted, files_per_connection=files_per_connection)[0]


def fit_open_files(command: CommandConfig, *, stderr: int) -> CommandConfig:
    """Raise the open-file limit as far as it goes; if -j still does not fit under it, say so
    once, before anything is sent, and run fewer rows at a time (the run fits it no further)."""
    fitted, problem = fit_to_open_files(
        command.config.concurrency, files_per_connection=files_per_connection(command), limit_name="ulimit -n"
    )
    if problem is None:
        return command
    say(f"-j {problem}", stderr)
    return dataclasses.replace(command, config=dataclasses.replace(command.config, concurrency=fitted))
