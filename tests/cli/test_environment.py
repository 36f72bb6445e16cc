"""cli/environment.py: what the command takes from its process, given as a value."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import termios
from collections.abc import Iterator

import pytest

from rollfilter.cli.environment import DEFAULT_COLUMNS, Environment


@pytest.fixture
def terminal() -> Iterator[int]:
    """A pseudo-terminal's own end, 132 columns wide."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 132, 0, 0))
    try:
        yield terminal
    finally:
        os.close(terminal)
        os.close(controller)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    try:
        yield read_end, write_end
    finally:
        os.close(read_end)
        os.close(write_end)


def terminals(environment: Environment) -> tuple[bool, bool, bool]:
    return environment.stdin_is_terminal, environment.stdout_is_terminal, environment.stderr_is_terminal


def test_each_descriptor_is_asked_whether_it_is_a_terminal(terminal: int, pipe: tuple[int, int]):
    read_end, write_end = pipe
    assert terminals(Environment.of_descriptors(terminal, terminal, terminal, variables={})) == (True, True, True)
    assert terminals(Environment.of_descriptors(read_end, write_end, terminal, variables={})) == (False, False, True)
    assert terminals(Environment.of_descriptors(terminal, write_end, write_end, variables={})) == (True, False, False)


def test_a_dumb_terminal_is_not_drawn_on(terminal: int):
    assert Environment.of_descriptors(stderr=terminal, variables={"TERM": "xterm"}).stderr_can_draw
    assert not Environment.of_descriptors(stderr=terminal, variables={"TERM": "dumb"}).stderr_can_draw


def test_the_width_is_columns_else_the_terminals_else_80(terminal: int, pipe: tuple[int, int]):
    _, write_end = pipe
    assert Environment.of_descriptors(stdout=write_end, variables={"COLUMNS": "100"}).columns() == 100
    assert Environment.of_descriptors(stdout=terminal, variables={}).columns() == 132
    assert Environment.of_descriptors(stdout=terminal, variables={"COLUMNS": "nan"}).columns() == 132
    assert Environment.of_descriptors(stdout=write_end, variables={"COLUMNS": "0"}).columns() == DEFAULT_COLUMNS
