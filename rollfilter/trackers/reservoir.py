"""A uniform sample of at most N of a run's results, however many there are (reservoir sampling)."""

from __future__ import annotations

import random
from typing import Any


class Reservoir:
    """Keeps each of the results `add`ed so far with the same chance, at most `size` of them: the
    memory stays that of `size` results (Vitter's algorithm R). `seed` makes the choice repeatable."""

    __slots__ = ("_random", "kept", "seen", "size")

    def __init__(self, size: int, *, seed: int | None = None) -> None:
        self.size = size
        self.seen = 0
        self.kept: list[dict[str, Any]] = []
        self._random = random.Random(seed)

    def add(self, result: dict[str, Any]) -> None:
        self.seen += 1
        if len(self.kept) < self.size:
            self.kept.append(result)
            return
        place = self._random.randrange(self.seen)
        if place < self.size:
            self.kept[place] = result
