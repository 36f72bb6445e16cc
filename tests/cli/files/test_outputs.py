"""cli/files/outputs.py: the table of a run's outputs drives their checks, opening, locking and
naming, and the opened files come back by name."""

from __future__ import annotations

import dataclasses
import os
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.environment import Environment
from rollfilter.cli.files import identity
from rollfilter.cli.files.outputs import (
    OUTPUTS,
    NamedOutputs,
    OpenedOutputs,
    Output,
    OutputFiles,
    OutputKey,
    open_appended,
    run_files,
)
from rollfilter.config import Config, Reverify
from rollfilter.errors import OutputInUse, UsageError

# A run of groups that asks for the aggregate: every output can be named beside it.
CONFIG = Config(url="http://127.0.0.1:1/run", repeats=2, groups=True, aggregate=True)
STREAMS = Environment.of_descriptors(0, 1, 2, variables={})


def every_output(tmp_path: Path, **given: Any) -> CommandConfig:
    """A command naming every output in `tmp_path`, the held file beside -o."""
    paths = {output.key: str(tmp_path / output.key) for output in OUTPUTS if not output.beside_output}
    return CommandConfig(CONFIG, **{**paths, **given})


def path_of(command: CommandConfig, output: Output) -> Path:
    path = command.held_file if output.beside_output else getattr(command, output.key)
    assert path is not None
    return Path(path)


def hold_lines(command: CommandConfig, outputs: Iterable[Output]) -> None:
    """Leave a line of another run in each of `outputs`."""
    for output in outputs:
        path_of(command, output).write_text("{}\n")


def make_empty(command: CommandConfig, outputs: Iterable[Output]) -> None:
    for output in outputs:
        path_of(command, output).touch()


async def opened(command: CommandConfig, files: OutputFiles) -> OpenedOutputs:
    said: list[str] = []
    beside = identity.beside(command)
    appended, beside = await open_appended(command, beside, files, STREAMS.stderr, lambda text, fd: said.append(text))
    return run_files(command, beside, files, STREAMS, appended, None)


def test_every_file_a_command_config_names_is_in_the_table():
    file_fields = {f.name for f in dataclasses.fields(CommandConfig) if f.name.endswith("_file") or f.name == "output"}
    assert file_fields == {output.key for output in OUTPUTS if not output.beside_output}
    assert set(typing.get_args(OutputKey)) == {output.key for output in OUTPUTS}  # each key once
    assert len(OUTPUTS) == len(typing.get_args(OutputKey))


async def test_the_opened_files_come_back_by_name(tmp_path: Path):
    command = every_output(tmp_path)
    with OutputFiles() as files:
        run = await opened(command, files)
        appended = {output.key for output in OUTPUTS if output.appended}
        assert set(run.appended) == appended
        for key, fd in run.appended.items():  # each descriptor is its own file's
            assert os.path.samestat(
                os.fstat(fd), os.stat(command.held_file if key == "held_file" else str(tmp_path / key))
            )
        assert set(run.whole) == {"metrics_file", "aggregate_file", "progress_file", "prometheus_file"}
        assert run.materialized == str(tmp_path / "materialized_file")  # written by its path, by the first pass
        assert run.results == run.appended["output"]
        assert run.results_name == f"-o {tmp_path / 'output'}"
        assert run.names["errors_file"] == f"--errors {tmp_path / 'errors_file'}"
        assert run.names["held_file"] == f"the held file {command.held_file}"


async def test_what_is_kept_beside_o_takes_the_mode_o_has_once_locked(tmp_path: Path):
    """-o read before the outputs open may change before it is locked (made narrower while
    --wait-lock waits for another output): the held file and the record are made as -o is then."""
    command = every_output(tmp_path)
    output = command.output or ""
    make_empty(command, OUTPUTS[:1])
    os.chmod(output, 0o644)
    beside = identity.beside(command)
    os.chmod(output, 0o600)
    umask = os.umask(0o022)
    try:
        with OutputFiles() as files:
            appended, beside = await open_appended(command, beside, files, STREAMS.stderr, lambda text, fd: None)
            run = run_files(command, beside, files, STREAMS, appended, None)
            identity.keep(identity.RunRecord(inputs=()), run.beside)
    finally:
        os.umask(umask)
    assert oct(os.stat(command.held_file or "").st_mode & 0o777) == oct(0o600)
    assert oct(os.stat(identity.record_path(output)).st_mode & 0o777) == oct(0o600)


def test_a_dry_run_has_standard_output_and_nothing_else():
    run = OpenedOutputs.standard_streams(Environment.of_descriptors(5, 6, 7, variables={}))
    assert (run.results, run.results_name) == (6, "standard output")
    assert (run.appended, run.whole, run.listening, run.materialized, run.record) == ({}, {}, [], None, None)


NAMED = [output for output in OUTPUTS if not output.beside_output]  # those an option names


@pytest.mark.parametrize("output", NAMED, ids=lambda o: o.option)
async def test_only_an_output_that_must_be_empty_is_refused_holding_another_runs_lines(tmp_path: Path, output: Any):
    command = every_output(tmp_path)
    hold_lines(command, [output])
    if output.must_be_empty:
        refusal = f"^{output.option} .* already holds lines of another run"
        with pytest.raises(UsageError, match=refusal), OutputFiles() as files:
            await opened(command, files)
        command = dataclasses.replace(command, append=True)  # --append adds to it
    with OutputFiles() as files:
        await opened(command, files)


@pytest.mark.parametrize("output", NAMED, ids=lambda o: o.option)
async def test_only_an_output_replaced_by_a_rename_must_be_a_regular_file(tmp_path: Path, output: Any):
    command = every_output(tmp_path)
    path_of(command, output).symlink_to(os.devnull)
    if output.may_be_pipe:
        with OutputFiles() as files:
            await opened(command, files)
    else:
        with pytest.raises(UsageError, match=f"^{output.option} .*must be a regular file"), OutputFiles() as files:
            await opened(command, files)


async def test_overwrite_empties_the_outputs_that_must_be_empty_and_the_held_file_and_no_other(tmp_path: Path):
    command = every_output(tmp_path, overwrite=True)
    hold_lines(command, [output for output in OUTPUTS if output.appended])
    with OutputFiles() as files:
        run = await opened(command, files)
        sizes = {key: os.fstat(fd).st_size for key, fd in run.appended.items()}
    assert sizes == {"output": 0, "errors_file": 0, "dropped_file": 0, "held_file": 0, "per_task_file": 3}


async def test_the_locked_outputs_and_no_other_are_locked_while_the_run_goes(tmp_path: Path):
    command = every_output(tmp_path)
    make_empty(command, OUTPUTS)  # --materialized's file, replaced whole, is locked when it is there
    in_use = []
    with OutputFiles() as files:
        await opened(command, files)
        for output in NAMED:
            another = CommandConfig(CONFIG, **{output.key: str(tmp_path / output.key)}, append=True)
            try:
                with OutputFiles() as others:
                    await opened(another, others)
            except OutputInUse as refused:
                in_use.append(str(refused).partition(" is in use by ")[0])
    assert in_use == [f"{output.option} {tmp_path / output.key}" for output in NAMED if output.locked]


def test_two_outputs_that_are_one_file_are_named_by_their_options(tmp_path: Path):
    command = CommandConfig(CONFIG, metrics_file=str(tmp_path / "m"), dropped_file=str(tmp_path / "m"))
    with pytest.raises(UsageError) as refused:
        NamedOutputs(command, STREAMS).check()
    assert (
        str(refused.value)
        == f"--dropped {tmp_path / 'm'} is also --metrics {tmp_path / 'm'}: two outputs cannot be one file"
    )


def test_a_run_that_writes_no_file_checks_its_standard_streams_only(tmp_path: Path):
    """--dry-run's outputs: what the options name is not written, so not refused; standard output
    carries its bodies, -o or not, and may not be an input."""
    record_named = CommandConfig(CONFIG, output=str(tmp_path / "out.run.json"))
    with pytest.raises(UsageError, match=r"is a run record's"):
        NamedOutputs(record_named, STREAMS).check()
    NamedOutputs.standard_streams(record_named, STREAMS).check()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    with open(rows, "ab") as stdout:
        streams = Environment.of_descriptors(0, stdout.fileno(), 2, variables={})
        reading_stdout = CommandConfig(CONFIG, inputs=(str(rows),), output=str(tmp_path / "out.jsonl"))
        NamedOutputs(reading_stdout, streams).check()  # the results go to -o
        with pytest.raises(UsageError, match=r"^standard output is also the input"):
            NamedOutputs.standard_streams(reading_stdout, streams).check()


# Re-scoring reads its materialized file as an input: it runs one rollout at a time (no groups,
# so no --dropped and no held file) and never writes --materialized.
RESCORED_OUTPUTS = [output for output in NAMED if output.key not in ("dropped_file", "materialized_file")]


@pytest.mark.parametrize("link", ["same path", "symlink", "hard link"])
@pytest.mark.parametrize("output", RESCORED_OUTPUTS, ids=lambda o: o.option)
def test_an_output_that_is_the_materialized_file_re_scoring_reads_is_refused(tmp_path: Path, output: Any, link: str):
    materialized = tmp_path / "materialized.jsonl"
    materialized.write_text("{}\n")
    path = materialized if link == "same path" else tmp_path / "output"
    if link == "symlink":
        path.symlink_to(materialized)
    elif link == "hard link":
        path.hardlink_to(materialized)
    config = Config(url="http://127.0.0.1:1/verify", repeats=2, aggregate=True, reverify=Reverify(str(materialized)))
    command = CommandConfig(config, inputs=(str(tmp_path / "rollouts.jsonl"),), **{output.key: str(path)})
    with pytest.raises(UsageError) as refused:
        NamedOutputs(command, STREAMS).check()
    said = f"{output.option} {path} is also the input --reverify {materialized}: input file is output file"
    assert str(refused.value) == said
