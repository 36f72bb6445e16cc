"""What earlier runs left in a resumed run's outputs, read once, before anything is sent.

A run resumed over its outputs (`--resume`) skips the pairs earlier runs finished and runs again
those they gave up on too few times (`ResumeState`). Its summary and its aggregate cover the whole
output, not only what this run adds: the results earlier runs wrote, and those of the groups they
dropped, are counted again as earlier results (`Earlier.count`); the materialized file's pairs are
not written twice; and the finished rollouts of groups this run leaves open (it stopped before
reading their rows) are cancelled with them (`Earlier.left_open`).

The outputs are read under their locks, after a torn last line (a run killed while writing) has
been cut off each. A dry run reads only what resume skips, and changes no file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from rollfilter.engine.tally import Tally
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.resume import ResumeState, drop_torn_tail, read_pairs, result_records
from rollfilter.rows import ROLLOUT_INDEX, TASK_INDEX, agent_name

_encode = msgspec.json.Encoder().encode


@dataclasses.dataclass(frozen=True, slots=True)
class EarlierFiles:
    """The outputs of a resumed run that earlier runs wrote, by path: the results (-o), and with
    them the errors record, the materialized inputs, the dropped groups' rollouts, the held file."""

    results: str
    errors: str | None = None
    materialized: str | None = None
    dropped: str | None = None
    held: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Earlier:
    """What earlier runs left: `resume`, the pairs a run skips or runs again; `materialized`, the
    pairs whose bodies the materialized file holds; `results` and `held`, the files whose results
    the run's figures cover too (None: none, as for a dry run)."""

    resume: ResumeState
    materialized: KeyTable | None = None
    results: str | None = None
    held: str | None = None

    @classmethod
    def read(cls, files: EarlierFiles, *, max_attempts: int, target_groups: int | None) -> Earlier:
        """What earlier runs left in `files`, each file's torn last line cut off first (reading
        the results may cut off a group left in part too: `ResumeState.cut_bytes`), and the
        dropped file rebuilt from the held one where a kill left it behind. `max_attempts` is how
        many failed attempts give a pair up, and `target_groups` the groups the run keeps."""
        for path in (files.results, files.errors, files.materialized, files.dropped, files.held):
            if path is not None:
                drop_torn_tail(path)
        resume = cls._resume(files, max_attempts=max_attempts, target_groups=target_groups)
        if files.held is not None and files.dropped is not None:
            resume.rebuild_dropped(files.dropped, files.held)
        materialized = read_pairs(files.materialized) if files.materialized is not None else None
        return cls(resume, materialized, files.results, files.held)

    @classmethod
    def skipped(cls, files: EarlierFiles, *, max_attempts: int, target_groups: int | None) -> Earlier:
        """What a dry run needs of `files`: the pairs resume skips or runs again, and nothing else."""
        return cls(cls._resume(files, max_attempts=max_attempts, target_groups=target_groups))

    @staticmethod
    def _resume(files: EarlierFiles, *, max_attempts: int, target_groups: int | None) -> ResumeState:
        return ResumeState.from_files(
            files.results, files.errors, max_attempts, held=files.held, target_groups=target_groups
        )

    def count(self, tally: Tally) -> None:
        """Count into `tally` the results earlier runs wrote, and those of the groups they dropped
        (real samples too), as earlier results. It reads files: call it in a thread."""
        for result in self._results():
            tally.earlier(result)

    def _results(self) -> Iterator[dict[str, Any]]:
        if self.results is not None:
            yield from result_records(self.results)
        if self.held is not None:
            yield from self.resume.dropped_results(self.held)

    def left_open(self, repeats_for: Callable[[str | None], int | None]) -> list[tuple[Any, int, list[dict[str, Any]]]]:
        """The finished rollouts earlier runs left in groups this run did not read (it stopped
        first), each group's together: its task, its first rollout index, its results. A group's
        size is its agent's repeat count (`repeats_for`)."""
        groups: dict[tuple[bytes, int], tuple[Any, int, list[dict[str, Any]]]] = {}
        for result in self.resume.leftover_earlier():
            rollout, size = result.get(ROLLOUT_INDEX), repeats_for(agent_name(result)) or 1
            first = rollout // size * size if type(rollout) is int else 0
            task = result.get(TASK_INDEX)
            groups.setdefault((_encode(task), first), (task, first, []))[2].append(result)
        return list(groups.values())
