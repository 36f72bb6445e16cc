"""A run's results as figures: running means of every numeric field (`Means`, kept finite near
the float limits and compensated), their usage, and what each rollout took (`RolloutCosts`).

Memory stays flat with the input: each field is a running sum, and counts go into
`figures.sketches`' bounded sketches.
"""

from __future__ import annotations

import math
from typing import Any

from rollfilter.figures.sketches import CountSketch
from rollfilter.figures.stats import Estimate, estimate_of_moments
from rollfilter.figures.sums import EXACT_FROM, EXACT_FROM_INT, lost_to_rounding, mean_of, scaled, total_of
from rollfilter.rows import MASK_SAMPLE, REWARD_COMPONENTS, component_key

_MOST_COUNTED = 2**53  # a count at or past this is no count of tokens, and would overflow the figures


def _whole(value: Any) -> int | None:
    """A count from an answer: a whole number from 0 to under 2**53 (an integral float too)."""
    kind = type(value)
    if kind is int:
        return value if 0 <= value < _MOST_COUNTED else None
    if kind is float and 0 <= value < _MOST_COUNTED and value.is_integer():
        return int(value)
    return None


class RolloutCosts:
    """What each rollout took, from its `response`: output and input tokens (`usage`), tool calls
    (`output` items of type function_call), and whether it was cut short (status incomplete)."""

    __slots__ = ("incomplete", "input_tokens", "output_tokens", "rollouts", "tool_calls")

    def __init__(self) -> None:
        self.rollouts = 0
        self.incomplete = 0
        self.output_tokens = CountSketch()
        self.input_tokens = CountSketch()
        self.tool_calls = CountSketch()

    def add(self, response: dict[str, Any], usage: Any) -> None:
        """Count one rollout's `response`, whose `usage` the caller has read already."""
        # On the path of every result: plain ints are taken without a call.
        self.rollouts += 1
        if type(usage) is dict:
            tokens = usage.get("output_tokens")
            if (type(tokens) is int and 0 <= tokens < _MOST_COUNTED) or (tokens := _whole(tokens)) is not None:
                self.output_tokens.add(tokens)
            tokens = usage.get("input_tokens")
            if (type(tokens) is int and 0 <= tokens < _MOST_COUNTED) or (tokens := _whole(tokens)) is not None:
                self.input_tokens.add(tokens)
        output = response.get("output")
        if type(output) is list:
            calls = 0
            for item in output:
                if type(item) is dict and item.get("type") == "function_call":
                    calls += 1
            self.tool_calls.add(calls)
        status = response.get("status")
        if (status is not None and status == "incomplete") or response.get("incomplete_details"):
            self.incomplete += 1  # (None is told apart first: comparing it with a string costs more)

    def merge(self, other: RolloutCosts) -> None:
        self.rollouts += other.rollouts
        self.incomplete += other.incomplete
        self.output_tokens.merge(other.output_tokens)
        self.input_tokens.merge(other.input_tokens)
        self.tool_calls.merge(other.tool_calls)

    def figures(self) -> dict[str, Any] | None:
        """The summary's `per_rollout`; None when no result held a response."""
        if not self.rollouts:
            return None
        return {
            "output_tokens": self.output_tokens.figures(),
            "input_tokens": self.input_tokens.figures(),
            "tool_calls": self.tool_calls.figures(),
            "incomplete": self.incomplete / self.rollouts,
        }


def as_float(value: Any) -> float | None:
    """A result field as a number for a mean: bool, int or finite float (booleans count 0/1)."""
    kind = type(value)  # exact types: msgspec gives plain bool, int, float
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int or kind is bool:
        try:
            return float(value)
        except OverflowError:  # an int past float's range: not a usable figure
            return None
    return None


class Means:
    """Running sums of the numeric top-level fields of results, and of `response.usage`.

    Values past `EXACT_FROM` are summed exactly instead (`exact`, `usage_exact`), so
    that means near the float limits stay finite and right (see `rollfilter.figures.sums`).
    """

    __slots__ = (
        *(
            "component_counts",
            "component_exact",
            "component_squares",
            "component_sums",
            "compensations",
            "costs",
            "counts",
            "exact",
            "failed",
        ),
        *("masked", "outside_unit", "shifts", "squares", "succeeded", "sums"),
        *("unmeasured", "usage_counts", "usage_exact", "usage_sums"),
    )

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.masked = 0  # results with mask_sample: true, in `succeeded` but in no mean
        self.component_sums: dict[str, float] = {}  # reward_components, by name
        self.component_counts: dict[str, int] = {}
        self.component_exact: dict[str, int] = {}  # the entries past EXACT_FROM, summed exactly as the fields'
        # Their squares about 0 (entries are rewards, near 0 and 1): for the error bars, and simply
        # added when two runs' figures are merged.
        self.component_squares: dict[str, float] = {}
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.exact: dict[str, int] = {}
        self.compensations: dict[str, float] = {}  # what each float sum's rounding lost
        self.shifts: dict[str, float] = {}  # each field's first value, and the squares of the values less it,
        self.squares: dict[str, float] = {}  # for its standard error with a rollout a task (no repeats)
        # The fields (and reward_components.NAME) with a value outside [0, 1]: the others' intervals
        # are Wilson's, which stay inside it (stats.within_unit).
        self.outside_unit: set[str] = set()
        # The _ng_ fields met (NeMo Gym's indices, in no mean): a set look-up passes over them
        # on every later result in less time than str.startswith takes.
        self.unmeasured: set[str] = set()
        self.costs = RolloutCosts()
        self.usage_sums: dict[str, float] = {}
        self.usage_counts: dict[str, int] = {}
        self.usage_exact: dict[str, int] = {}

    def add(self, result: dict[str, Any], *, masked: bool = False) -> None:
        """Add a result to the figures: `masked` (or marked `mask_sample: true`), to its usage only."""
        # The per-result hot path: as_float() written out inline. A comparison rules out
        # inf and nan (and the rare huge value, summed apart) faster than math.isfinite().
        self.succeeded += 1
        response = result.get("response")
        if type(response) is dict:  # a masked rollout's tokens were spent all the same
            usage = response.get("usage")
            self.costs.add(response, usage)
            if type(usage) is dict:
                _add_usage(usage, self.usage_sums, self.usage_counts, self.usage_exact)
        if masked or result.get(MASK_SAMPLE) is True:
            self.masked += 1
            return
        sums, counts, compensations = self.sums, self.counts, self.compensations
        shifts, squares, outside, unmeasured = self.shifts, self.squares, self.outside_unit, self.unmeasured
        for key, value in result.items():
            # A value in [0, 1] is told apart first: most are, and then one comparison does.
            kind = type(value)
            if kind is float:
                if 0.0 <= value <= 1.0:
                    within = True
                elif -EXACT_FROM < value < EXACT_FROM:
                    within = False
                else:
                    if value - value == 0.0:  # finite
                        self._add_huge(key, value)
                    continue
            elif kind is int:
                if 0 <= value <= 1:
                    within = True
                elif -EXACT_FROM_INT < value < EXACT_FROM_INT:
                    within = False
                else:
                    if -_FLOAT_RANGE < value < _FLOAT_RANGE:
                        self._add_huge(key, value)
                    continue
            elif kind is not bool or key == MASK_SAMPLE:  # false on every result the means cover
                continue
            else:
                within = True
            if key in unmeasured:
                continue
            try:  # a subscript, not a get(): no call for a field seen before
                total = sums[key]
            except KeyError:
                if key.startswith("_ng_"):
                    unmeasured.add(key)
                else:
                    self._first(key, value)
                    if not within:
                        outside.add(key)
                continue
            if not within:
                outside.add(key)
            # sums.lost_to_rounding, written out: the per-result hot path.
            added = total + value
            if (total if total >= 0.0 else -total) >= (value if value >= 0.0 else -value):
                compensations[key] += (total - added) + value
            else:
                compensations[key] += (value - added) + total
            sums[key] = added
            counts[key] += 1
            deviation = value - shifts[key]
            squares[key] += deviation * deviation
        components = result.get(REWARD_COMPONENTS)
        if type(components) is dict:
            self._add_components(components)

    def _add_components(self, components: dict[str, Any]) -> None:
        sums, counts, squares = self.component_sums, self.component_counts, self.component_squares
        for name, value in components.items():
            number = as_float(value)
            if number is None:
                continue
            counts[name] = counts.get(name, 0) + 1
            if not 0.0 <= number <= 1.0:
                self.outside_unit.add(component_key(name))
            if -EXACT_FROM < number < EXACT_FROM:
                sums[name] = sums.get(name, 0.0) + number
                squares[name] = squares.get(name, 0.0) + number * number
            else:  # a figure all the same: summed exactly, its spread past the float range
                sums.setdefault(name, 0.0)
                squares[name] = math.inf
                self.component_exact[name] = self.component_exact.get(name, 0) + scaled(number)

    def _add_huge(self, key: str, value: float) -> None:
        if key.startswith("_ng_"):
            return
        self.outside_unit.add(key)
        if key not in self.sums:
            self.sums[key], self.counts[key] = 0.0, 0
            self.compensations[key], self.shifts[key], self.squares[key] = 0.0, 0.0, 0.0
        _add_exact(key, value, self.sums, self.counts, self.exact)

    def _first(self, key: str, value: float) -> None:
        self.sums[key] = 0.0 + value
        self.counts[key] = 1
        self.compensations[key] = 0.0
        self.shifts[key] = 0.0 + value
        self.squares[key] = 0.0

    def merge(self, other: Means) -> None:
        self.succeeded += other.succeeded
        self.failed += other.failed
        self.masked += other.masked
        for key, total in other.sums.items():
            if key not in self.sums:
                self.sums[key], self.counts[key] = 0.0, 0
                self.compensations[key], self.shifts[key], self.squares[key] = 0.0, other.shifts[key], 0.0
            shift, count = self.shifts[key], other.counts[key]
            # The other's squares about its own shift, moved to this one's.
            moved = other.shifts[key] - shift
            deviations = total + other.compensations[key] - count * other.shifts[key]
            self.squares[key] += other.squares[key] + 2 * moved * deviations + count * moved * moved
            added = self.sums[key] + total
            self.compensations[key] += other.compensations[key] + lost_to_rounding(self.sums[key], total, added)
            self.sums[key] = added
        for sums, more_sums in (
            (self.usage_sums, other.usage_sums),
            (self.component_sums, other.component_sums),
            (self.component_squares, other.component_squares),
        ):
            for key, value in more_sums.items():
                sums[key] = sums.get(key, 0.0) + value
        for tallies, more in (
            (self.counts, other.counts),
            (self.usage_counts, other.usage_counts),
            (self.exact, other.exact),
            (self.usage_exact, other.usage_exact),
            (self.component_counts, other.component_counts),
            (self.component_exact, other.component_exact),
        ):
            for key, count in more.items():
                tallies[key] = tallies.get(key, 0) + count
        self.outside_unit |= other.outside_unit
        self.costs.merge(other.costs)

    def mean(self, key: str) -> float:
        count = self.counts.get(key)
        if not count:
            return 0.0
        return mean_of(self.sums[key] + self.compensations[key], self.exact.get(key, 0), count)

    def means(self) -> dict[str, Any]:
        """`reward` first (null when no result carried one), then each field's mean in the order first seen."""
        means: dict[str, Any] = {"reward": None}
        for key in self.sums:
            means[key] = self.mean(key)
        return means

    @property
    def measured(self) -> int:
        """The results the means cover: those not masked."""
        return self.succeeded - self.masked

    def components(self) -> dict[str, float]:
        """The mean of each reward_components entry, over the results the means cover."""
        counts, exact = self.component_counts, self.component_exact
        return {name: mean_of(total, exact.get(name, 0), counts[name]) for name, total in self.component_sums.items()}

    def estimates(self) -> dict[str, Estimate]:
        """Each field's mean with its standard error, taking each rollout as a task of its own
        (right for a run without repeats; `passk.TaskStats` clusters by task when it has them).
        Masked results are in none of them."""
        found = {}
        for key, count in self.counts.items():
            mean = self.mean(key)
            if key in self.exact:  # values past the float range's square root: no spread to compute
                found[key] = Estimate(mean, None, None, None, count, count)
            else:
                found[key] = estimate_of_moments(count, mean, self.shifts[key], self.squares[key])
        for name, mean in self.components().items():
            count = self.component_counts[name]
            found[component_key(name)] = estimate_of_moments(count, mean, 0.0, self.component_squares[name])
        return found

    def within_unit(self, key: str) -> bool:
        """Whether every value of the field `key` (or reward_components.NAME) counted lies in [0, 1]."""
        if key in self.outside_unit:
            return False
        component = key.removeprefix(f"{REWARD_COMPONENTS}.")
        return component in self.component_counts if component != key else key in self.counts

    def usage(self) -> dict[str, float]:
        exact, counts = self.usage_exact, self.usage_counts
        return {key: mean_of(total, exact.get(key, 0), counts[key]) for key, total in self.usage_sums.items()}

    def tokens(self) -> float:
        """Tokens used so far: usage's total_tokens, or input plus output tokens; the counts past
        the exact sums' threshold included (inf when their sum is past the float range)."""
        if "total_tokens" in self.usage_sums:
            return self._usage_total("total_tokens")
        return self._usage_total("input_tokens") + self._usage_total("output_tokens")

    def _usage_total(self, key: str) -> float:
        exact = self.usage_exact.get(key, 0)
        total = self.usage_sums.get(key, 0.0)
        return total if not exact else total_of(total, exact)


def _add_usage(
    usage: dict[str, Any], sums: dict[str, float], counts: dict[str, int], exact: dict[str, int], prefix: str = ""
) -> None:
    """Numeric fields of response.usage, and of its objects one level down (input_tokens_details...)."""
    for key, value in usage.items():
        kind = type(value)
        if kind is int and -EXACT_FROM_INT < value < EXACT_FROM_INT:  # the common case, first
            number: float = value
        elif kind is dict:
            if not prefix:
                _add_usage(value, sums, counts, exact, f"{key}.")
            continue
        elif kind is int:
            if -_FLOAT_RANGE < value < _FLOAT_RANGE:
                _add_exact(prefix + key, value, sums, counts, exact)
            continue
        else:
            converted = as_float(value)
            if converted is None:
                continue
            number = converted
            if not -EXACT_FROM < number < EXACT_FROM:
                _add_exact(prefix + key, number, sums, counts, exact)
                continue
        name = prefix + key if prefix else key
        try:  # a subscript, not a get(): no call for a key seen before
            sums[name] += number
        except KeyError:
            sums[name] = 0.0 + number
            counts[name] = 1
        else:
            counts[name] += 1


def _add_exact(key: str, value: float, sums: dict[str, float], counts: dict[str, int], exact: dict[str, int]) -> None:
    """Count a finite value too large for the float sum in the exact one."""
    if key.startswith("_ng_"):
        return
    sums.setdefault(key, 0.0)  # the key keeps its place among the means
    counts[key] = counts.get(key, 0) + 1
    exact[key] = exact.get(key, 0) + scaled(value)


_FLOAT_RANGE = 2**1024 - 2**970  # an int at or past this rounds to an infinite float


def reward_of(result: dict[str, Any]) -> float:
    """A result's reward for pass@k; a result without a finite numeric one counts as 0."""
    reward = result.get("reward")
    if type(reward) is float:  # the common case, without a call
        return reward if math.isfinite(reward) else 0.0
    number = as_float(reward)
    return 0.0 if number is None else number


class RewardByVersion:
    """The reward mean of the results of each policy version: the version stamped under `key`
    (`{"sent": V, "ended": W}`) when their /run was sent, the curve a trainer's dashboard reads.
    Results without a stamp, and masked ones, are left out."""

    __slots__ = ("counts", "key", "sums")

    def __init__(self, key: str) -> None:
        self.key = key
        self.sums: dict[int, float] = {}
        self.counts: dict[int, int] = {}

    def add(self, result: dict[str, Any]) -> None:
        stamp = result.get(self.key)
        version = stamp.get("sent") if type(stamp) is dict else None
        if type(version) is not int or result.get("mask_sample") is True:
            return
        self.sums[version] = self.sums.get(version, 0.0) + reward_of(result)
        self.counts[version] = self.counts.get(version, 0) + 1

    def means(self) -> dict[int, float]:
        return {version: self.sums[version] / count for version, count in self.counts.items()}
