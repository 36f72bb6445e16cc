"""What one run is told: `Config`, all the Python API takes, and its parts, frozen values checked
when built: `Repeats`, `Groups`, `Retries`, `Timeouts`, `Tls`, `Wire`, `Routing`, `Rates`, `Cost`,
`FailureLimit`, `Reverify`, `Trackers`.

Each field's type and bounds are its annotation, checked by msgspec in strict mode (True is no
int, "3" no number). A part checks what spans its own fields (a staleness bound's two figures,
a cost limit's prices); `Config` checks what spans parts (groups need repeats). A plain value
stands for the part it sets, as httpx's `Client(timeout=5.0)` does (`Config(retries=5)` is
`Config(retries=Retries(count=5))`, `Config(groups=True)` is `Config(groups=Groups())`). A field
that cannot be used raises `ConfigError` naming its path (`Config.groups.target`,
`Config.headers[0][0]`) in one line. URLs are checked once, here, by the model the run sends with
(`httpx.URL`). Building a Config reads nothing outside its arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, Literal

import httpx
import msgspec

from rollfilter.cost import Price
from rollfilter.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RATIO,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_STATUSES,
)
from rollfilter.errors import UsageError
from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES
from rollfilter.redact import shown

# A percentage limit judged on fewer finished rollouts than this would stop on the first failure.
MIN_ROWS_FOR_FAILURE_RATE = 20
# Numbering counts the rollouts of a task in 4 bytes (plan.TaskNumbering).
MAX_REPEATS = 2**32 - 1

_FINITE = sys.float_info.max  # a bound of `le` refuses inf, and nan fails every bound
Positive = Annotated[float, msgspec.Meta(gt=0, le=_FINITE)]
# A rate limit's least: a request in about 17 hours. A smaller one is no run, and its interval
# is past what a float holds.
MIN_RATE = 0.001
Rate = Annotated[float, msgspec.Meta(ge=MIN_RATE, le=_FINITE)]
NonNegative = Annotated[float, msgspec.Meta(ge=0, le=_FINITE)]
Finite = Annotated[float, msgspec.Meta(ge=-_FINITE, le=_FINITE)]
Count = Annotated[int, msgspec.Meta(ge=0)]
# A policy version is a training step: one past 2**53 is no longer exact where JSON is read as
# doubles (jq, JavaScript), nor in a Prometheus gauge, whose float it may overflow.
MAX_POLICY_VERSION = 2**53
PolicyVersion = Annotated[int, msgspec.Meta(ge=-MAX_POLICY_VERSION, le=MAX_POLICY_VERSION)]
AtLeastOne = Annotated[int, msgspec.Meta(ge=1)]
RepeatCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_REPEATS)]
Status = Annotated[int, msgspec.Meta(ge=100, le=599)]
# A key of responses_create_params, or a dotted path into it ("metadata.x"): no empty part.
ParamKey = Annotated[str, msgspec.Meta(pattern=r"\A[^.]+(\.[^.]+)*\Z")]
Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
ONE_ROLLOUT_GROUPS = "is 1, which makes groups of one: with Config.groups, a row's rollouts are its group"


class ConfigError(UsageError):
    """A Config field that cannot be used; the message opens with its path (`Config.limit`)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"Config.{field}: {problem}")
        self.field = field
        self.problem = problem


@functools.cache
def _annotations(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _checked(instance: object, prefix: str = "") -> None:
    """Convert each field of the dataclass `instance` to its annotation in place (msgspec, strict),
    or raise ConfigError naming the field's path: `prefix` and the field, and where in it."""
    kinds: dict[str, Any] = _annotations(type(instance))  # type: ignore[arg-type]  # classes hash
    for name, kind in kinds.items():
        value = getattr(instance, name)
        try:
            converted = msgspec.convert(_given(value), kind, strict=True)
        except msgspec.ValidationError as exc:
            problem, _, where = str(exc).partition(" - at `$")
            raise ConfigError(prefix + name + where.rstrip("`"), problem[:1].lower() + problem[1:]) from None
        object.__setattr__(instance, name, converted)


def _given(value: Any) -> Any:
    """What was given, as msgspec takes it: an iterator read once into a tuple, a path as its text."""
    if isinstance(value, Iterator):
        return tuple(value)
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)
    if isinstance(value, Mapping) and not isinstance(value, dict):
        return dict(value)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class FailureLimit:
    """Stop once `count` rollouts failed, or once `fraction` of the ended ones did (neither: never).

    It is `Config.max_failures`; a whole number there is taken as `FailureLimit(count=...)`."""

    count: AtLeastOne | None = None
    fraction: Fraction | None = None

    def __post_init__(self) -> None:
        _checked(self, "max_failures.")
        if self.count is not None and self.fraction is not None:
            raise ConfigError("max_failures", "takes a count or a fraction, not both")

    def is_reached(self, failed: int, ended: int) -> bool:
        if self.count is not None:
            return failed >= self.count
        if self.fraction is not None and ended >= MIN_ROWS_FOR_FAILURE_RATE:
            return failed >= self.fraction * ended
        return False

    def describe(self) -> str:
        """The limit as a message quotes it: `10`, or `5%`."""
        if self.count is not None:
            return str(self.count)
        return f"{self.fraction * 100:g}%" if self.fraction is not None else ""


UNHEALTHY_MODES = ("keep", "mask", "fail")  # Health.unhealthy's


@dataclasses.dataclass(frozen=True, slots=True)
class RecentLimit:
    """Stop once `count` rollouts were of a kind (unhealthy, masked), or once `fraction` of the
    last 100 ended were (a window: see `rollfilter.figures.health.RecentShare`); neither: never.

    It is checked as `Health` takes it, so that an error names the field it is given as
    (`Config.health.max_unhealthy.fraction`)."""

    count: AtLeastOne | None = None
    fraction: Fraction | None = None

    def checked(self, field: str) -> None:
        """Convert the fields in place, or raise ConfigError naming them under `field`."""
        _checked(self, f"{field}.")
        if self.count is not None and self.fraction is not None:
            raise ConfigError(field, "a limit takes a count or a fraction, not both")

    def describe(self) -> str:
        """The limit as a message quotes it: `10`, or `5%`."""
        if self.count is not None:
            return str(self.count)
        return f"{self.fraction * 100:g}%" if self.fraction is not None else ""


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    """What a run does with unhealthy rollouts (see `rollfilter.figures.health`: a result that looks
    like an outage behind the agent). `unhealthy`: "keep" counts and marks them, in every figure;
    "mask" leaves them out of every figure as `mask_sample` does; "fail" makes each a failed row of
    kind `unhealthy`, sent again as an HTTP 5xx is. `max_unhealthy` and `max_masked` stop the run
    (None: never).

    It is `Config.health`."""

    unhealthy: Literal["keep", "mask", "fail"] = "keep"
    max_unhealthy: RecentLimit | None = None
    max_masked: RecentLimit | None = None

    def __post_init__(self) -> None:
        _checked(self, "health.")
        for name in ("max_unhealthy", "max_masked"):
            limit = getattr(self, name)
            if limit is not None:
                limit.checked(f"health.{name}")

    @property
    def watched(self) -> bool:
        """Whether a limit is set, so that each ended rollout goes into a window."""
        return self.max_unhealthy is not None or self.max_masked is not None


@dataclasses.dataclass(frozen=True, slots=True)
class Retries:
    """How a failed row is sent again: at most `count` more times, for a status in `statuses`
    (and for the connection failures worth it), while its agent's `budget` of retries a row
    lasts (see budget.py; None: no budget, every failure gets its retries).

    It is `Config.retries`; a whole number there is taken as `Retries(count=...)`."""

    count: Count = DEFAULT_RETRIES
    budget: NonNegative | None = DEFAULT_RATIO
    statuses: frozenset[Status] = DEFAULT_RETRY_STATUSES

    def __post_init__(self) -> None:
        _checked(self, "retries.")


@dataclasses.dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a row may take: `attempt` bounds one attempt and the wait before the next (None:
    no bound, an episode can take an hour), `connect` bounds connecting to an agent.

    It is `Config.timeout`; a number of seconds (or None) there is taken as `Timeouts(attempt=...)`."""

    attempt: Positive | None = None
    connect: Positive = DEFAULT_CONNECT_TIMEOUT

    def __post_init__(self) -> None:
        _checked(self, "timeout.")


@dataclasses.dataclass(frozen=True, slots=True)
class Reverify:
    """Re-score saved rollouts instead of running rows: each rollout line's `response`, joined with
    its body in NeMo Gym's materialized inputs file `materialized` by (task, rollout), is POSTed to
    the `/verify` of its agent's resources server. Only the lines whose `_ng_failure_class` is
    `judge_failed` with `judge_failed_only`; with `force`, against resources servers that do not
    say their verification is stateless too (the summary is then marked unsafe).

    It is `Config.reverify`."""

    materialized: Annotated[str, msgspec.Meta(min_length=1)]  # a path (os.PathLike too)
    judge_failed_only: bool = False
    force: bool = False

    def __post_init__(self) -> None:
        _checked(self, "reverify.")


@dataclasses.dataclass(frozen=True, slots=True)
class Tls:
    """How agents' certificates are checked: against the CAs in the PEM file `cacert` instead of
    the system's (as curl's --cacert), or, with `insecure`, not at all.

    It is `Config.tls`. Building it reads no file: a run loads `cacert` once, when it starts, and
    refuses one that cannot serve before any row (a `ConfigError` naming `Config.tls.cacert`).
    """

    cacert: Annotated[str, msgspec.Meta(min_length=1)] | None = None  # a path (os.PathLike too)
    insecure: bool = False

    def __post_init__(self) -> None:
        _checked(self, "tls.")


@dataclasses.dataclass(frozen=True, slots=True)
class Repeats:
    """Rollouts per row: `count` for the rows of agents that `by_agent` does not name (None: 1,
    unless `by_agent` is given; then, as in NeMo Gym, a row of an agent it does not name fails),
    and with `seeds`, each rollout carries "seed": its rollout index, in metadata.extra_body. A
    rollout passes, for pass@k and the pass histogram, when its reward is at least `pass_threshold`.

    It is `Config.repeats`; a whole number (or None) there is taken as `Repeats(count=...)`."""

    count: RepeatCount | None = None
    by_agent: Mapping[str, RepeatCount] = dataclasses.field(default_factory=dict)
    seeds: bool = False
    pass_threshold: Finite = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_agent", _given(self.by_agent))
        _checked(self, "repeats.")

    @property
    def default(self) -> int | None:
        """Rollouts per row for agents that `by_agent` does not name; None: such a row fails."""
        if self.count is not None:
            return self.count
        return None if self.by_agent else 1

    def for_agent(self, agent: str | None) -> int | None:
        """Rollouts per row for rows of agent `agent` (None: a row routed without a name);
        None when neither `by_agent` nor a default covers it."""
        if agent is not None and agent in self.by_agent:
            return self.by_agent[agent]
        return self.default

    @property
    def largest(self) -> int:
        """The most rollouts any row gets."""
        return max([self.default or 1, *self.by_agent.values()])


@dataclasses.dataclass(frozen=True, slots=True)
class Groups:
    """A task's rollouts (a row's repeats) as one group, handed out whole once every one has
    ended. With `keep_incomplete`, a group with a failed rollout hands out its finished ones
    anyway; with `drop_uniform`, a group whose `field` (a numeric field of each result, or a
    dotted path, reward_components.NAME) is the same number in every rollout is dropped; the run
    stops once `target` groups have been handed out.

    Bounded staleness, for a trainer that takes `batch` groups a step: group i, counted in the
    order groups are admitted, is sent once the policy version v satisfies
    i < (v - Config.policy_version + max_staleness + 1) * batch (`max_staleness` and `batch` go
    together; the policy version starts at 0 unless given).

    It is `Config.groups` (None: no groups); True there is taken as `Groups()`, False as None."""

    keep_incomplete: bool = False
    drop_uniform: bool = False
    field: str = "reward"
    target: AtLeastOne | None = None
    max_staleness: Count | None = None
    batch: AtLeastOne | None = None

    def __post_init__(self) -> None:
        _checked(self, "groups.")
        problem = group_field_problem(self.field)
        if problem is not None:
            raise ConfigError("groups.field", problem)
        if (self.max_staleness is None) != (self.batch is None):
            given, other = ("max_staleness", "batch") if self.batch is None else ("batch", "max_staleness")
            problem = f"needs Config.groups.{other} too: a staleness bound is the two together"
            raise ConfigError(f"groups.{given}", problem)


@dataclasses.dataclass(frozen=True, slots=True)
class Wire:
    """How requests go beyond TLS: through `proxy` (an http(s) or socks5 proxy URL, for every
    request to an agent), following 307/308 redirects to another scheme, host or port too with
    `cross_origin_redirects`, and failing a row whose reply body is longer than
    `max_reply_bytes` (as bad_response).

    It is `Config.wire`."""

    proxy: str | None = None
    cross_origin_redirects: bool = False
    max_reply_bytes: AtLeastOne = DEFAULT_MAX_REPLY_BYTES

    def __post_init__(self) -> None:
        _checked(self, "wire.")
        if self.proxy is not None:
            _checked_url("wire.proxy", self.proxy, schemes=("http", "https", "socks5"))


@dataclasses.dataclass(frozen=True, slots=True)
class Routing:
    """Which replica of an agent a rollout goes to: with `policy` "task", every rollout of a task
    to one (its prefix cache), with "least-outstanding" each to the least busy (None: by task
    with repeats over 1, else the least outstanding); `affinity_header`, a header each /run
    carries, of one opaque value a task, for a router that pins sessions.

    It is `Config.routing`."""

    policy: Literal["task", "least-outstanding"] | None = None
    affinity_header: str | None = None

    def __post_init__(self) -> None:
        _checked(self, "routing.")
        problem = affinity_header_problem(self.affinity_header) if self.affinity_header is not None else None
        if problem is not None:
            raise ConfigError("routing.affinity_header", problem)


@dataclasses.dataclass(frozen=True, slots=True)
class Rates:
    """Requests and tokens a minute an agent may get, paced (engine/rate_limits.py): `rpm` and
    `tpm` for every agent that `rpm_by_agent` and `tpm_by_agent` do not name (and for the rows
    of Config.url); None: no limit.

    It is `Config.rates`."""

    rpm: Rate | None = None
    tpm: Rate | None = None
    rpm_by_agent: Mapping[str, Rate] = dataclasses.field(default_factory=dict)
    tpm_by_agent: Mapping[str, Rate] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("rpm_by_agent", "tpm_by_agent"):
            object.__setattr__(self, name, _given(getattr(self, name)))
        _checked(self, "rates.")

    def for_agent(self, agent: str | None) -> tuple[float | None, float | None]:
        """The requests and tokens a minute rows of `agent` may use (None: no limit)."""
        if agent is None:
            return self.rpm, self.tpm
        return self.rpm_by_agent.get(agent, self.rpm), self.tpm_by_agent.get(agent, self.tpm)

    @property
    def limited(self) -> bool:
        """Whether any agent has a request or token limit."""
        return bool(self.rpm or self.tpm or self.rpm_by_agent or self.tpm_by_agent)


@dataclasses.dataclass(frozen=True, slots=True)
class Cost:
    """What a run spends: `prices`, USD per million tokens by agent (None: every agent not named),
    and `max_usd`, the spending at which the run stops (it needs prices: without them nothing is
    spent).

    It is `Config.cost`."""

    prices: tuple[tuple[str | None, Price], ...] = ()
    max_usd: Positive | None = None

    def __post_init__(self) -> None:
        _checked(self, "cost.")
        if self.max_usd is not None and not self.prices:
            raise ConfigError("cost.max_usd", "needs Config.cost.prices: without them nothing is spent")


# A tracker run's sample of result lines, by default: enough to read a few, small beside any upload.
DEFAULT_TRACKED_ROLLOUTS = 100


@dataclasses.dataclass(frozen=True, slots=True)
class Trackers:
    """Where a run logs its figures while it goes and when it ends: `mlflow`, an MLflow tracking
    URI (its run in the experiment named `experiment`), `wandb`, a Weights & Biases project (the
    rest from W&B's own environment: WANDB_MODE, WANDB_API_KEY, WANDB_ENTITY, WANDB_DIR), or both.
    `run_name` names the tracker runs (None: a time). `rollouts` is the most result lines kept, a
    uniform sample, for the tracker runs' rollouts (0: none). `ids_file`, when given, is where the
    tracker runs' ids are kept: a run given a file that holds them continues those tracker runs.

    It is `Config.trackers`. A tracker never costs a result: one that cannot be reached or fails
    is said once, and the run goes on."""

    mlflow: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    experiment: Annotated[str, msgspec.Meta(min_length=1)] = "rollfilter"
    wandb: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    run_name: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    rollouts: Count = DEFAULT_TRACKED_ROLLOUTS
    ids_file: Annotated[str, msgspec.Meta(min_length=1)] | None = None  # a path (os.PathLike too)

    def __post_init__(self) -> None:
        _checked(self, "trackers.")
        if self.mlflow is None and self.wandb is None:
            raise ConfigError("trackers", "names no tracker: give Config.trackers.mlflow or Config.trackers.wandb")


# The parts a plain value stands for, as httpx's `Client(timeout=5.0)`: the field of the part it sets.
_SHORTHANDS: tuple[tuple[str, type, str], ...] = (
    ("repeats", Repeats, "count"),
    ("retries", Retries, "count"),
    ("timeout", Timeouts, "attempt"),
    ("max_failures", FailureLimit, "count"),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """What one run of the engine does: where rows go, how many, how each is sent and retried.

    This is the Python API's whole configuration; the command line builds the same and adds
    its files around it. Settings that belong together are frozen parts, checked when built:
    `repeats` (`Repeats`), `groups` (`Groups`), `retries` (`Retries`), `timeout` (`Timeouts`),
    `tls` (`Tls`), `wire` (`Wire`), `routing` (`Routing`), `rates` (`Rates`), `cost` (`Cost`),
    `max_failures` (`FailureLimit`), `health` (`Health`), `reverify` (`Reverify`), `trackers`
    (`Trackers`). Errors name the fields, as `ConfigError` (`Config.limit`, `Config.retries.budget`).
    """

    url: str | None = None
    # An agent's URL, or its replicas' URLs: {"a": "http://h:1", "b": ["http://h:2", "http://h:3"]}.
    endpoints: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    agent: str | None = None
    concurrency: AtLeastOne = DEFAULT_CONCURRENCY
    adaptive: bool = False  # concurrency is a ceiling: each agent's window finds what it keeps up with
    limit: Count | None = None
    repeats: Repeats = Repeats()  # or a whole number: Repeats(count=...)
    groups: Groups | None = None  # or True: Groups()
    # The policy version the run starts under: every result then carries _rf_policy_version, the
    # version when its /run was sent and when it ended (the run's set_policy_version changes it).
    policy_version: PolicyVersion | None = None
    params: tuple[tuple[ParamKey, Any], ...] = ()
    retries: Retries = Retries()  # or a whole number: Retries(count=...)
    timeout: Timeouts = Timeouts()  # or seconds, None for no bound: Timeouts(attempt=...)
    tls: Tls = Tls()
    wire: Wire = Wire()
    routing: Routing = Routing()
    rates: Rates = Rates()
    cost: Cost = Cost()
    max_failures: FailureLimit = FailureLimit()  # or a whole number: FailureLimit(count=...)
    health: Health = Health()  # what to do with unhealthy rollouts, and when they stop the run
    # Their values are secrets (tokens, keys): kept out of repr, as out of every message.
    headers: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)
    shard: tuple[Count, AtLeastOne] | None = None  # (I, N): keep the tasks whose index mod N is I
    head_server: str | None = None
    aggregate: bool = False  # ask each agent for its /aggregate_metrics when the run ends
    # Re-score saved rollouts at resources servers' /verify instead of running rows at agents' /run:
    # url and endpoints (by the rollouts' agent names) are then resources servers, /verify their default path.
    reverify: Reverify | None = None
    trackers: Trackers | None = None  # MLflow, Weights & Biases: where the run's figures are logged

    def __post_init__(self) -> None:
        for name, part, field in _SHORTHANDS:
            if not isinstance(getattr(self, name), part):
                object.__setattr__(self, name, part(**{field: getattr(self, name)}))
        if isinstance(self.groups, bool):
            object.__setattr__(self, "groups", Groups() if self.groups else None)
        object.__setattr__(self, "endpoints", _replicas(self.endpoints))
        _checked(self)
        # URLs are checked and completed here, so the API and the CLI agree on them.
        complete = verify_url if self.reverify is not None else agent_url
        if self.url is not None:
            object.__setattr__(self, "url", _checked_url("url", self.url, complete=complete))
        object.__setattr__(self, "endpoints", {
            name: tuple(_checked_url(f"endpoints[{name!r}]", url, complete=complete) for url in urls)
            for name, urls in self.endpoints.items()
        })  # fmt: skip
        if self.head_server is not None:
            _checked_url("head_server", self.head_server)
        for number, (name, value) in enumerate(self.headers):
            problem = header_problem(name, value)
            if problem is not None:
                raise ConfigError(f"headers[{number}]", problem)
        if self.shard is not None and not self.shard[0] < self.shard[1]:
            raise ConfigError("shard", "I/N wants 0 <= I < N")
        if self.groups is not None:
            self._check_groups(self.groups)
        if self.routing.affinity_header is not None:
            given = [name for name, _ in self.headers]
            problem = affinity_header_problem(self.routing.affinity_header, given)
            if problem is not None:
                raise ConfigError("routing.affinity_header", problem)

    def _check_groups(self, groups: Groups) -> None:
        if self.repeats.largest < 2:
            raise ConfigError("groups", "needs Config.repeats over 1: a group is a row's repeated rollouts")
        for name, count in self.repeats.by_agent.items():
            if count < 2:
                raise ConfigError(f"repeats.by_agent[{name!r}]", ONE_ROLLOUT_GROUPS)
        if self.repeats.count is not None and self.repeats.count < 2:
            raise ConfigError("repeats.count", ONE_ROLLOUT_GROUPS)
        if self.reverify is not None:
            raise ConfigError("reverify", "re-scores rollouts one by one: not with Config.groups")
        if groups.max_staleness is not None and self.policy_version is None:
            object.__setattr__(self, "policy_version", 0)

    @property
    def route_by_task(self) -> bool:
        """Whether a task's rollouts go to one replica of its agent."""
        policy = self.routing.policy
        return policy == "task" or (policy is None and self.repeats.largest > 1)

    @property
    def names_an_agent(self) -> bool:
        """Whether rows can go anywhere: a url, endpoints, or a head server to ask."""
        return self.url is not None or bool(self.endpoints) or self.head_server is not None


def _replicas(endpoints: Any) -> Any:
    """Each agent's URLs as a tuple: a single URL is taken as one replica, any iterable read once."""
    if not isinstance(endpoints, Mapping):
        return endpoints  # msgspec refuses it, naming the field
    return {name: (urls,) if isinstance(urls, str) else _given(urls) for name, urls in endpoints.items()}


# What curl refuses in a host name (its hostname_check), '%' included: a host is never
# percent-decoded here, so "127.0.0.%31" would be looked up as it stands and fail as a
# connect error, retried, where it is a mistake in the URL. httpx percent-encodes what a
# host cannot hold (a space is "%20"), so those show as '%' too.
_NOT_IN_A_HOST = frozenset(" \r\n\t/:#?!@{}[]\\$'\"^`*<>=;,+&()%")


def _checked_url(
    field: str,
    text: str,
    *,
    complete: Callable[[str], str] | None = None,
    schemes: tuple[str, ...] = ("http", "https"),
) -> str:
    try:
        return complete(text) if complete is not None else str(checked_url(text, schemes))
    except UsageError as exc:
        raise ConfigError(field, str(exc)) from None


def agent_url(text: str) -> str:
    """An agent's URL checked (`checked_url`), with `run` appended when its path is none or ends in
    `/` (a base URL: the server's root, or a prefix it is served under); its query is kept."""
    url = checked_url(text)
    path, query = _path_and_query(url)
    return _with_path(url, path + b"run", query) if path.endswith(b"/") else str(url)


def verify_url(text: str) -> str:
    """A resources server's URL checked (`checked_url`), with `verify` appended when its path is
    none or ends in `/`, as `agent_url` appends `run`. A last segment `run` is an agent's
    default, appended before the URL was known to be a resources server's: it becomes `verify`."""
    url = checked_url(text)
    path, query = _path_and_query(url)
    if path.endswith(b"/run"):
        path = path.removesuffix(b"run")
    return _with_path(url, path + b"verify", query) if path.endswith(b"/") else str(url)


def endpoint_beside(url: str, endpoint: str, *, replacing: tuple[str, ...] = ("/run", "/verify")) -> str:
    """The URL of the same server's `endpoint` (`/aggregate_metrics`, say) beside the one `url`
    names: in place of its last segment if it is one of `replacing`, else under its path. The
    path is the one sent (percent-encoded), and the query is kept, as it is for /run: a token
    there is the server's to ask for every request."""
    parsed = httpx.URL(url)
    path, query = _path_and_query(parsed)
    end = next((end for end in map(str.encode, replacing) if path.endswith(end)), None)
    base = path.removesuffix(end) if end is not None else path.rstrip(b"/")
    return str(parsed.copy_with(raw_path=base + endpoint.encode() + query, fragment=None))


def _path_and_query(url: httpx.URL) -> tuple[bytes, bytes]:
    """`url`'s path as it is sent, percent-encoded (`url.path` decodes it: `%2F` would become a
    `/` and `%3F` a `?`), and its query with its `?` (empty without one)."""
    path, mark, query = url.raw_path.partition(b"?")
    return path, mark + query


def _with_path(url: httpx.URL, path: bytes, query: bytes) -> str:
    return str(url.copy_with(raw_path=path + query))


def checked_url(text: str, schemes: tuple[str, ...] = ("http", "https")) -> httpx.URL:
    """`text` as the URL the run sends to: of one of `schemes`, with a host curl takes and a valid
    port. UsageError otherwise, whose message never shows the URL's credentials or query."""
    kind = "http(s)" if schemes == ("http", "https") else "/".join(schemes)
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise UsageError(f"not an {kind} URL: {shown(text)!r} ({exc})") from None
    if url.scheme not in schemes or not url.host:
        raise UsageError(f"not an {kind} URL: {shown(url)!r}")
    if ":" not in url.host:  # an IPv6 address, which httpx has checked
        bad = next((c for c in url.host if c in _NOT_IN_A_HOST or not c.isprintable()), None)
        if bad is not None:
            raise UsageError(f"not an {kind} URL: {shown(url)!r}, whose host holds {bad!r}")
    if url.port is not None and not 0 < url.port < 65536:
        raise UsageError(f"bad port in URL {shown(url)!r}")
    return url


# RFC 9110's token, what a field name is made of: a name outside it is refused by servers and
# by httpx (the --proxy path), which encodes names as ASCII.
_TOKEN = re.compile(r"\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


def header_problem(name: str, value: str) -> str | None:
    """Why a header cannot go on the wire, naming it, never its value (a secret); None if it can."""
    if not _TOKEN.match(name):
        return "holds a name that is empty or not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)"
    # CR and LF would end the header on the wire and start another (header injection); NUL
    # ends it for many servers.
    if any(c in "\r\n\0" for c in value):
        return f"{name}: the value holds CR, LF or NUL (the value is not shown)"
    return None


# Fields of a result that are never a reward to tell a group by: NeMo Gym's objects and indices.
NOT_GROUP_FIELDS = frozenset(
    {"response", "responses_create_params", "agent_ref", "skills_ref", "_ng_task_index", "_ng_rollout_index"}
)


ROUTE_BY_TASK = "task"
ROUTE_LEAST_OUTSTANDING = "least-outstanding"
ROUTES = (ROUTE_BY_TASK, ROUTE_LEAST_OUTSTANDING)  # Routing.policy's
# Headers every request carries already (rollfilter's own, or the transport's framing).
SENT_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "content-type", "accept", "accept-encoding"}
    | {"user-agent", "authorization", "te", "upgrade", "expect", "keep-alive", "proxy-authorization"}
)


def affinity_header_problem(name: str, given: Iterable[str] = ()) -> str | None:
    """Why `name` cannot be the affinity header (not a token, or one a request carries already,
    rollfilter's own or one of `given`); None if it can."""
    if not _TOKEN.match(name):
        return f"{name!r} is not an HTTP header name (letters, digits, !#$%&'*+-.^_`|~)"
    if name.lower() in SENT_HEADERS:
        return f"every request carries {name} already: name another header, such as X-Session-ID"
    if name.lower() in {other.lower() for other in given}:
        return (
            f"the headers given set {name} already, one value for every request: leave it out of"
            " them (the affinity header carries one value a task), or name another header"
        )
    return None


def group_field_problem(name: str) -> str | None:
    """Why `name` cannot be the numeric result field that tells a uniform group; None if it can."""
    if not name.strip():
        return "wants the name of a numeric top-level field of the results, such as reward"
    if name in NOT_GROUP_FIELDS:
        return f"{name!r} is not a numeric field of a result: name one such as reward or accuracy"
    if "." in name and not all(part.strip() for part in name.split(".")):
        return f"{name!r} has an empty step: a dotted path names an object's field, such as reward_components.accuracy"
    return None


def is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() takes "²", which int() refuses, and so must every parser
    of a number that comes from outside (an option, a server's header, a config file)."""
    return text.isascii() and text.isdigit()
