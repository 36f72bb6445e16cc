"""Failure lines on stderr, with a run of the same failure folded.

An agent that is down fails every row the same way, and a line per row buries everything else
on the terminal (and in a log) under thousands of copies of one message. The errors record keeps
every row; stderr shows the first few failures of each kind, message and agent, then one line at
most every `FOLD_EVERY_S` seconds saying how many more there were, and at the end of the run how
many were left unsaid.
"""

from __future__ import annotations

from collections.abc import Callable

from rollfilter.outcomes import Failure
from rollfilter.rows import agent_name

SHOWN_IN_FULL = 3  # failures of one kind, message and agent printed as they are before folding
FOLD_EVERY_S = 1.0  # the least time between two count lines of one kind of failure
# Failures of distinct messages remembered at once: an agent whose error bodies differ row by row
# (a request id in each) would otherwise cost a remembered message a row for the whole run. Past
# it, the one seen longest ago is forgotten, its count told first.
REMEMBERED = 1024

_Key = tuple[str, str | None, str]  # kind, agent, message


class _Folded:
    __slots__ = ("last_told", "seen", "unsaid")

    def __init__(self) -> None:
        self.seen = 0
        self.unsaid = 0
        self.last_told = -float("inf")


class FailureFolder:
    """Decides which failure lines reach stderr. `clock` is the run's (trio's, in a run); `line_of`
    makes a message into a stderr line, the command's prefix and escaping included."""

    def __init__(self, clock: Callable[[], float], line_of: Callable[[str], bytes]) -> None:
        self._clock = clock
        self._line_of = line_of
        self._folded: dict[_Key, _Folded] = {}

    def admit(self, failure: Failure, line: bytes) -> bytes:
        """What to write for `failure`, whose own line is `line`: that line, a count of the ones
        folded since the last count, or nothing."""
        agent = agent_name(failure.row) if failure.row is not None else None
        key = (failure.kind.value, agent, failure.message)
        folded = self._folded.pop(key, None)
        forgotten = b""
        if folded is None:
            folded = _Folded()
            if len(self._folded) >= REMEMBERED:
                forgotten = self._forget_oldest()
        self._folded[key] = folded  # the one seen most recently last: the first is forgotten first
        return forgotten + self._said(key, folded, line)

    def _forget_oldest(self) -> bytes:
        key = next(iter(self._folded))
        folded = self._folded.pop(key)
        return self._told(key, folded) if folded.unsaid else b""

    def _said(self, key: _Key, folded: _Folded, line: bytes) -> bytes:
        folded.seen += 1
        now = self._clock()
        if folded.seen <= SHOWN_IN_FULL:
            folded.last_told = now  # the first count comes a while after the last line in full
            return line
        folded.unsaid += 1
        if now - folded.last_told < FOLD_EVERY_S:
            return b""
        folded.last_told = now
        return self._told(key, folded)

    def unsaid(self) -> bytes:
        """The counts not yet told, one line each (at the end of the run)."""
        return b"".join(self._told(key, folded) for key, folded in self._folded.items() if folded.unsaid)

    def _told(self, key: _Key, folded: _Folded) -> bytes:
        kind, agent, message = key
        count, folded.unsaid = folded.unsaid, 0
        rows = "1 more row" if count == 1 else f"{count} more rows"
        of_agent = f" of agent {agent}" if agent is not None else ""
        return self._line_of(f"{rows}{of_agent} failed so: {kind}: {message}")
