"""cli/folding.py: a run of the same failure folded into counts on stderr."""

from __future__ import annotations

from rollfilter.cli.folding import FOLD_EVERY_S, REMEMBERED, SHOWN_IN_FULL, FailureFolder
from rollfilter.errors import ErrorKind
from rollfilter.outcomes import Failure


def failure(number: int, message: str = "cannot connect", agent: str | None = "a") -> Failure:
    row = {"agent_ref": {"name": agent}} if agent is not None else {}
    return Failure(row, number, 0, ErrorKind.CONNECT, message, None, 1, number)


def test_the_first_few_are_said_in_full_then_a_count_at_most_once_a_second():
    now = [0.0]
    folder = FailureFolder(lambda: now[0], lambda text: text.encode() + b"\n")
    said = [folder.admit(failure(n), b"line %d\n" % n) for n in range(1, 11)]
    assert said[:SHOWN_IN_FULL] == [b"line 1\n", b"line 2\n", b"line 3\n"]
    assert said[SHOWN_IN_FULL:] == [b""] * 7  # all within the same second
    now[0] += FOLD_EVERY_S
    assert folder.admit(failure(11), b"line 11\n") == b"8 more rows of agent a failed so: connect: cannot connect\n"
    assert folder.admit(failure(12), b"line 12\n") == b""
    assert folder.unsaid() == b"1 more row of agent a failed so: connect: cannot connect\n"
    assert folder.unsaid() == b""


def test_another_message_or_agent_is_another_run_of_lines():
    folder = FailureFolder(lambda: 0.0, lambda text: text.encode() + b"\n")
    for n in range(SHOWN_IN_FULL):
        assert folder.admit(failure(n), b"a\n") == b"a\n"
    assert folder.admit(failure(9, agent="b"), b"b\n") == b"b\n"
    assert folder.admit(failure(9, message="HTTP 500"), b"c\n") == b"c\n"
    assert folder.admit(failure(9, agent=None), b"d\n") == b"d\n"


def test_distinct_messages_are_remembered_up_to_a_bound_and_a_forgotten_count_is_told():
    folder = FailureFolder(lambda: 0.0, lambda text: text.encode() + b"\n")
    for n in range(SHOWN_IN_FULL + 2):
        folder.admit(failure(n), b"a\n")
    said = [folder.admit(failure(n, message=f"HTTP 500 request {n}"), b"x\n") for n in range(3 * REMEMBERED)]
    assert said[REMEMBERED - 2] == b"x\n"  # with the first message, REMEMBERED in all
    assert said[REMEMBERED - 1] == b"2 more rows of agent a failed so: connect: cannot connect\nx\n"  # forgotten
    assert said.count(b"x\n") == len(said) - 1  # each distinct message in full, and nothing else
    assert len(folder.unsaid()) == 0
    assert folder.admit(failure(9), b"a\n") == b"a\n"  # forgotten: in full again
    assert len(folder._folded) <= REMEMBERED  # memory does not grow with the rows
