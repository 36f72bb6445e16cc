"""The filters and order of the rollouts' list, read from a URL's query so that a view can be
shared and reloaded: q (text the line holds), task, min_reward, max_reward, agent, failed=1,
unhealthy=1, sort (reward, -reward, tokens, -tokens, task) and page."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from urllib.parse import urlencode

from rollfilter.viewer.catalog import FAILED, UNHEALTHY, Catalog

PAGE_SIZE = 50
ESCAPED = frozenset('"\\/\b\f\n\r\t')  # what JSON writes with a backslash, besides \\u escapes
SORTS = {"reward": "reward", "-reward": "reward", "tokens": "tokens", "-tokens": "tokens", "task": "task"}


class QueryError(ValueError):
    """A filter whose value cannot be read: the message names it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Query:
    q: str = ""
    task: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    agent: str = ""
    failed: bool = False
    unhealthy: bool = False
    sort: str = ""
    page: int = 0

    @classmethod
    def of(cls, params: Mapping[str, Sequence[str]]) -> Query:
        """The query of a URL's parameters (`urllib.parse.parse_qs`); QueryError for a value that is
        not of its kind. Empty values are filters not given."""
        given = {name: values[-1].strip() for name, values in params.items() if values and values[-1].strip()}
        sort = given.get("sort", "")
        if sort and sort not in SORTS:
            raise QueryError(f"sort is one of {', '.join(SORTS)}, not {sort!r}")
        return cls(
            q=given.get("q", ""),
            task=_whole(given, "task"),
            min_reward=_real(given, "min_reward"),
            max_reward=_real(given, "max_reward"),
            agent=given.get("agent", ""),
            failed=given.get("failed") == "1",
            unhealthy=given.get("unhealthy") == "1",
            sort=sort,
            page=max(_whole(given, "page") or 0, 0),
        )

    def url(self, **changes: object) -> str:
        """The URL of this view with `changes` made (page back to the first unless given)."""
        changed = dataclasses.replace(self, **({"page": 0} | changes))  # type: ignore[arg-type]
        pairs = [
            (field.name, _shown(getattr(changed, field.name)))
            for field in dataclasses.fields(changed)
            if getattr(changed, field.name) != field.default  # task=0 and max_reward=0 are filters too
        ]
        return "/?" + urlencode(pairs) if pairs else "/"

    def positions(self, catalog: Catalog) -> list[int]:
        """The positions of the lines this query keeps, in its order."""
        kept = list(self._kept(catalog))
        if self.q:
            kept = [position for position, line in catalog.lines(kept) if _holds(line, self.q)]
        if self.sort:
            column = catalog.column(SORTS[self.sort])
            sign = -1 if self.sort.startswith("-") else 1
            # NaN (no reward) last either way; equal values stay in file order (a stable sort, not reversed)
            kept.sort(key=lambda p: (math.isnan(column[p]), sign * column[p]))
        return kept

    def _kept(self, catalog: Catalog) -> Iterator[int]:
        count = len(catalog)
        filters = (self.task, self.min_reward, self.max_reward)
        if filters == (None, None, None) and not (self.agent or self.failed or self.unhealthy):
            yield from range(count)
            return
        tasks, rewards, flags = catalog.column("task"), catalog.column("reward"), catalog.column("flags")
        agents = catalog.column("agent")
        agent = catalog.agent_number(self.agent) if self.agent else None
        if self.agent and agent is None:
            return
        low = -math.inf if self.min_reward is None else self.min_reward
        high = math.inf if self.max_reward is None else self.max_reward
        rewarded = self.min_reward is not None or self.max_reward is not None
        wanted = (FAILED if self.failed else 0) | (UNHEALTHY if self.unhealthy else 0)
        for position in range(count):
            if self.task is not None and tasks[position] != self.task:
                continue
            if rewarded and not low <= rewards[position] <= high:
                continue
            if agent is not None and agents[position] != agent:
                continue
            if flags[position] & wanted != wanted:
                continue
            yield position


def _holds(line: bytes, q: str) -> bool:
    """Whether `line` holds `q` (case aside), as written or once its JSON escapes are read. Only
    \\u escapes hide letters; the others stand for characters in ESCAPED, so the line is decoded
    only when it has \\u escapes, or `q` holds one of those or a letter past ASCII (whose case
    bytes cannot fold)."""
    needle = q.casefold()
    if needle.encode() in line.lower():
        return True
    # q's own letters, not their folds: "ß" folds to "ss", which the bytes of "ß" do not hold.
    if b"\\u" not in line and q.isascii() and not any(character in ESCAPED for character in needle):
        return False
    try:
        return any(needle in text.casefold() for text in _texts(json.loads(line)))
    except ValueError:
        return False


def _texts(value: object) -> Iterator[str]:
    """The strings of a JSON value, keys too, and its numbers as written."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    else:
        yield value if isinstance(value, str) else json.dumps(value)


def _whole(given: Mapping[str, str], name: str) -> int | None:
    if name not in given:
        return None
    try:
        return int(given[name])
    except ValueError:
        raise QueryError(f"{name} is a whole number, not {given[name]!r}") from None


def _real(given: Mapping[str, str], name: str) -> float | None:
    if name not in given:
        return None
    try:
        value = float(given[name])
    except ValueError:
        raise QueryError(f"{name} is a number, not {given[name]!r}") from None
    if not math.isfinite(value):
        raise QueryError(f"{name} is a finite number, not {given[name]!r}")
    return value


def _shown(value: object) -> str:
    if value is True:
        return "1"
    return repr(value) if isinstance(value, float) else str(value)  # repr: the float given, whole
