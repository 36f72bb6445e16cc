"""What a run spends: the tokens of each answer's `response.usage`, priced per agent.

A price is USD per million tokens: input, output, and cached input (which OpenAI's usage counts
within `input_tokens`, as `input_tokens_details.cached_tokens`; priced as input when no cached
price is given). Every answer an agent gave counts, failed rollouts' answers too: their tokens
were spent. An answer without usage costs nothing, and is counted as such; so is one whose token
counts a cost cannot hold (an integer past the float range, or a cost that would overflow the
total): an agent's number is never allowed to fail the row it came with.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

PER_TOKENS = 1_000_000  # prices are per million tokens


class PriceError(ValueError):
    """A price that is not usable; the message says which and why."""


@dataclasses.dataclass(frozen=True, slots=True)
class Price:
    """USD per million input, output and cached-input tokens (cached None: as input)."""

    input: float
    output: float
    cached: float | None = None

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached"):
            value = getattr(self, name)
            if value is None and name == "cached":
                continue
            number = _finite(value)
            if number is None or number < 0:
                raise PriceError(f"the {name} price must be a finite number of USD, 0 or more, got {_shown(value)}")
            object.__setattr__(self, name, number)

    def of(self, usage: Mapping[str, Any]) -> float | None:
        """The cost of one answer's usage, or None when it reports no tokens, or a count that is
        none (a string, a negative, a number kept whole past the float range) or that no float
        cost can hold: a usage half understood is not priced at half."""
        details = usage.get("input_tokens_details")
        given = [usage.get("input_tokens"), usage.get("output_tokens")]
        given.append(details.get("cached_tokens") if isinstance(details, dict) else None)
        if any(value is not None and _count(value) is None for value in given):
            return None
        tokens_in, tokens_out, cached = (_count(value) for value in given)
        if tokens_in is None and tokens_out is None:
            return None
        cached = min(cached or 0, tokens_in or 0)
        cached_price = self.input if self.cached is None else self.cached
        try:  # a price per token first: the product of a count and a price per million may overflow
            spent = (
                float((tokens_in or 0) - cached) * (self.input / PER_TOKENS)
                + float(cached) * (cached_price / PER_TOKENS)
                + float(tokens_out or 0) * (self.output / PER_TOKENS)
            )
        except OverflowError:  # a count past the float range
            return None
        return spent if math.isfinite(spent) else None


def _finite(value: Any) -> float | None:
    """A number of a price as a float, or None when it is none, or past the float range."""
    if type(value) not in (int, float):  # not bool, not a string
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(value: Any) -> str:
    """A value as a message quotes it: a number of hundreds of digits by its size alone."""
    text = repr(value)
    return text if len(text) <= 40 else f"a number of {len(text)} digits"


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


class Spending:
    """What a run has spent, in total and by agent name; which answers reported no usage."""

    def __init__(self, prices: Iterable[tuple[str | None, Price]]) -> None:
        self._prices = dict(prices)
        self._default = self._prices.get(None)
        self.total = 0.0
        self.by_agent: dict[str, float] = {}
        self.without_usage = 0

    def add(self, agent: str | None, answer: Mapping[str, Any]) -> None:
        """Count one answer of `agent` (None: a row that names no agent)."""
        response = answer.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            self.without_usage += 1
            return
        price = self._prices.get(agent, self._default) if agent is not None else self._default
        if price is None:  # an agent no price names costs nothing
            return
        cost = price.of(usage)
        if cost is None or not math.isfinite(self.total + cost):
            self.without_usage += 1
            return
        self.total += cost
        label = agent if agent is not None else "(no name)"
        self.by_agent[label] = self.by_agent.get(label, 0.0) + cost

    def figures(self) -> dict[str, Any]:
        return {
            "cost_usd": round(self.total, 6),
            "cost_usd_by_agent": {name: round(cost, 6) for name, cost in sorted(self.by_agent.items())},
            "rollouts_without_usage": self.without_usage,
        }
