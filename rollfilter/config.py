"""What a run is told: `Config` (the engine's, all the Python API takes), `CommandConfig` (the command
line's inputs and files around it), and the parsers that turn option text into them.

The command line and the Python API build the same `Config`. Building one only checks what it
is given, and so do the parsers, with two exceptions: `parse_prices` reads its prices file, and
`parse_shard` reads the Slurm variables of `os.environ` for `auto` unless given an environment.
Everything raises `UsageError` (`ConfigError`, naming the field, for a Config) with a one-line
message.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from rollfilter.budget import DEFAULT_RATIO
from rollfilter.cost import Price, PriceError, parse_price, prices_from_mapping
from rollfilter.errors import UsageError
from rollfilter.http import DEFAULT_MAX_REPLY_BYTES
from rollfilter.redact import shown_split
from rollfilter.resume import DEFAULT_MAX_ATTEMPTS

DEFAULT_CONCURRENCY = 32
DEFAULT_RETRIES = 3
DEFAULT_CONNECT_TIMEOUT = 10.0
# The statuses curl's --retry treats as transient.
DEFAULT_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# A percentage limit judged on fewer finished rollouts than this would stop on the first failure.
MIN_ROWS_FOR_FAILURE_RATE = 20
SHARD_AUTO = "auto"  # --shard auto: the shard of this Slurm array task
# Lines longer than this are refused as bad input instead of being held in memory.
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
# Numbering counts the rollouts of a task in 4 bytes (plan.TaskNumbering).
MAX_REPEATS = 2**32 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class FailureLimit:
    """Stop once `count` rollouts failed, or once `fraction` of the ended ones did (neither: never).

    It is `Config.max_failures`; a whole number there is taken as `FailureLimit(count=...)`."""

    count: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if self.count is not None and not (_is_int(self.count) and self.count >= 1):
            raise ConfigError("max_failures.count", "must be a whole number, 1 or more")
        if self.fraction is not None and not (_is_number(self.fraction) and 0 < self.fraction <= 1):
            raise ConfigError("max_failures.fraction", "must be a number above 0 and at most 1")
        if self.count is not None and self.fraction is not None:
            raise ConfigError("max_failures", "takes a count or a fraction, not both")

    def is_reached(self, failed: int, ended: int) -> bool:
        if self.count is not None:
            return failed >= self.count
        if self.fraction is not None and ended >= MIN_ROWS_FOR_FAILURE_RATE:
            return failed >= self.fraction * ended
        return False

    def describe(self) -> str:
        if self.count is not None:
            return f"Config.max_failures {self.count}"
        return f"Config.max_failures {self.fraction * 100:g}%" if self.fraction is not None else ""


class ConfigError(UsageError):
    """A Config field that cannot be used; the message opens with the field (`Config.limit`)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"Config.{field} {problem}")
        self.field = field
        self.problem = problem


@dataclasses.dataclass(frozen=True, slots=True)
class Retries:
    """How a failed row is sent again: at most `count` more times, for a status in `statuses`
    (and for the connection failures worth it), while its agent's `budget` of retries a row
    lasts (see budget.py; None: no budget, every failure gets its retries).

    It is `Config.retries`; a whole number there is taken as `Retries(count=...)`. Errors name
    the part and its field (`Config.retries.budget`).
    """

    count: int = DEFAULT_RETRIES
    budget: float | None = DEFAULT_RATIO
    statuses: frozenset[int] = DEFAULT_RETRY_STATUSES

    def __post_init__(self) -> None:
        if not _is_int(self.count) or self.count < 0:
            raise ConfigError("retries.count", "must be a whole number, 0 or more")
        budget = self.budget
        if budget is not None and not (_is_number(budget) and 0 <= budget < math.inf):
            raise ConfigError("retries.budget", "must be a finite number of retries a row, 0 or more (None: no budget)")
        try:
            statuses = frozenset(self.statuses)
        except TypeError:
            raise ConfigError("retries.statuses", "wants a set of HTTP statuses, like {429, 503}") from None
        for status in statuses:
            if not (_is_int(status) and 100 <= status <= 599):
                raise ConfigError("retries.statuses", f"wants HTTP statuses from 100 to 599, got {status!r}")
        object.__setattr__(self, "statuses", statuses)


@dataclasses.dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a row may take: `attempt` bounds one attempt and the wait before the next (None:
    no bound, an episode can take an hour), `connect` bounds connecting to an agent.

    It is `Config.timeout`; a number of seconds (or None) there is taken as
    `Timeouts(attempt=...)`. Errors name the part and its field (`Config.timeout.connect`).
    """

    attempt: float | None = None
    connect: float = DEFAULT_CONNECT_TIMEOUT

    def __post_init__(self) -> None:
        if self.attempt is not None and not (_is_number(self.attempt) and self.attempt > 0):
            raise ConfigError("timeout.attempt", "must be a positive number of seconds")
        if not (_is_number(self.connect) and self.connect > 0):
            raise ConfigError("timeout.connect", "must be a positive number of seconds")


@dataclasses.dataclass(frozen=True, slots=True)
class Tls:
    """How agents' certificates are checked: against the CAs in the PEM file `cacert` instead of
    the system's (as curl's --cacert), or, with `insecure`, not at all.

    It is `Config.tls`. Building it reads no file: a run loads `cacert` once, when it starts, and
    refuses one that cannot serve before any row (a `ConfigError` naming `Config.tls.cacert`).
    """

    cacert: str | None = None
    insecure: bool = False

    def __post_init__(self) -> None:
        if self.cacert is not None:
            if not isinstance(self.cacert, (str, os.PathLike)) or not os.fspath(self.cacert):
                raise ConfigError("tls.cacert", "wants the path of a PEM file of CA certificates")
            object.__setattr__(self, "cacert", os.fsdecode(self.cacert))
        if not isinstance(self.insecure, bool):
            raise ConfigError("tls.insecure", "must be True or False")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """What one run of the engine does: where rows go, how many, how each is sent and retried.

    This is the Python API's whole configuration; the command line builds the same and adds
    its files around it (`CommandConfig`). Settings that belong together are frozen parts,
    checked when built: `retries` (`Retries`), `timeout` (`Timeouts`), `tls` (`Tls`),
    `max_failures` (`FailureLimit`). Errors name the fields, as `ConfigError`
    (`Config.limit`, `Config.retries.budget`).
    """

    url: str | None = None
    endpoints: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    agent: str | None = None
    concurrency: int = DEFAULT_CONCURRENCY
    limit: int | None = None
    # Rollouts per row, for agents that repeats_by_agent does not name. None: 1, unless
    # repeats_by_agent is given; then, as in NeMo Gym, a row of an agent it does not name fails.
    repeats: int | None = None
    repeats_by_agent: Mapping[str, int] = dataclasses.field(default_factory=dict)
    repeat_seeds: bool = False  # each rollout carries "seed": its rollout index, in metadata.extra_body
    params: tuple[tuple[str, Any], ...] = ()
    retries: Retries = Retries()  # or a whole number: Retries(count=...)
    timeout: Timeouts = Timeouts()  # or seconds, None for no bound: Timeouts(attempt=...)
    tls: Tls = Tls()
    max_failures: FailureLimit = FailureLimit()  # or a whole number: FailureLimit(count=...)
    prices: tuple[tuple[str | None, Price], ...] = ()  # USD per million tokens, by agent (None: the rest)
    max_cost: float | None = None  # stop the run once it has spent this many USD
    # Their values are secrets (tokens, keys): kept out of repr, as out of every message.
    headers: tuple[tuple[str, str], ...] = dataclasses.field(default=(), repr=False)
    shard: tuple[int, int] | None = None  # (I, N): keep the tasks whose index mod N is I
    pass_threshold: float = 1.0
    head_server: str | None = None
    proxy: str | None = None  # an http(s) proxy URL for every request to an agent
    adaptive: bool = False  # concurrency is a ceiling: each agent's window finds what it keeps up with
    aggregate: bool = False  # ask each agent for its /aggregate_metrics when the run ends
    cross_origin_redirects: bool = False  # follow 307/308 to another scheme, host or port too
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES  # a longer reply body fails its row as bad_response

    def __post_init__(self) -> None:
        self._check_types()
        # URLs are checked and completed here, so the API and the CLI agree on them.
        if self.url is not None:
            object.__setattr__(self, "url", agent_url(self.url))
        object.__setattr__(self, "endpoints", _checked_endpoints(self.endpoints))
        for field, value, schemes in (
            ("proxy", self.proxy, ("http", "https", "socks5")),
            ("head_server", self.head_server, ("http", "https")),
        ):
            try:
                if value is not None:
                    checked_url(value, schemes)
            except UsageError as exc:
                raise ConfigError(field, f"is not usable: {exc}") from None
        object.__setattr__(self, "headers", checked_headers(self.headers))
        object.__setattr__(self, "params", _checked_params(self.params))
        object.__setattr__(self, "prices", _checked_prices(self.prices))
        # As httpx's Client(timeout=5.0): the plain value stands for the part it sets.
        if not isinstance(self.retries, Retries):
            object.__setattr__(self, "retries", Retries(count=self.retries))
        if not isinstance(self.timeout, Timeouts):
            object.__setattr__(self, "timeout", Timeouts(attempt=self.timeout))
        if not isinstance(self.max_failures, FailureLimit):
            object.__setattr__(self, "max_failures", FailureLimit(count=self.max_failures))
        if not isinstance(self.tls, Tls):
            raise ConfigError("tls", "wants a Tls, like Tls(cacert='ca.pem')")
        if self.concurrency < 1:
            raise ConfigError("concurrency", "must be at least 1")
        object.__setattr__(self, "repeats_by_agent", dict(self.repeats_by_agent))
        if self.repeats is not None and self.repeats < 1:
            raise ConfigError("repeats", "must be at least 1")
        if any(k < 1 for k in self.repeats_by_agent.values()):
            raise ConfigError("repeats_by_agent", "must be at least 1 for each agent")
        if self.max_repeats > MAX_REPEATS:
            raise ConfigError("repeats", f"must be at most {MAX_REPEATS}")
        if self.limit is not None and self.limit < 0:
            raise ConfigError("limit", "must not be negative")
        if self.max_cost is not None and not 0 < self.max_cost < math.inf:
            raise ConfigError("max_cost", "must be a positive, finite number of USD")
        if self.max_cost is not None and not self.prices:
            raise ConfigError("max_cost", "needs Config.prices: without them nothing is spent")
        if self.max_reply_bytes < 1:
            raise ConfigError("max_reply_bytes", "must be at least 1")
        if self.shard is not None:
            object.__setattr__(self, "shard", tuple(self.shard))
            if not 0 <= self.shard[0] < self.shard[1]:
                raise ConfigError("shard", "I/N wants 0 <= I < N")
        if not math.isfinite(self.pass_threshold):
            raise ConfigError("pass_threshold", "must be a finite number")

    def _check_types(self) -> None:
        """Refuse a field of the wrong type before any check of its value could fail on it
        (`"3" < 1` is a TypeError naming no field) or let it through (True is an int)."""
        for field in ("url", "agent", "head_server", "proxy"):
            if not isinstance(getattr(self, field), str | None):
                raise ConfigError(field, "must be a string or None")
        for field in ("repeat_seeds", "adaptive", "aggregate", "cross_origin_redirects"):
            if not isinstance(getattr(self, field), bool):
                raise ConfigError(field, "must be True or False")
        for field, value in (("concurrency", self.concurrency), ("max_reply_bytes", self.max_reply_bytes)):
            if not _is_int(value):
                raise ConfigError(field, "must be a whole number")
        for field, optional in (("limit", self.limit), ("repeats", self.repeats)):
            if optional is not None and not _is_int(optional):
                raise ConfigError(field, "must be a whole number or None")
        if self.max_cost is not None and not _is_number(self.max_cost):
            raise ConfigError("max_cost", "must be a number of USD or None")
        if not _is_number(self.pass_threshold):
            raise ConfigError("pass_threshold", "must be a number")
        if not (
            isinstance(self.repeats_by_agent, Mapping)
            and all(isinstance(name, str) and _is_int(k) for name, k in self.repeats_by_agent.items())
        ):
            raise ConfigError("repeats_by_agent", "wants a mapping of agent names to whole numbers, like {'a': 4}")
        shard = self.shard
        if shard is not None and not (
            isinstance(shard, tuple | list) and len(shard) == 2 and all(_is_int(part) for part in shard)
        ):
            raise ConfigError("shard", "wants (I, N), two whole numbers, or None")

    @property
    def names_an_agent(self) -> bool:
        """Whether rows can go anywhere: a url, endpoints, or a head server to ask."""
        return self.url is not None or bool(self.endpoints) or self.head_server is not None

    @property
    def default_repeats(self) -> int | None:
        """Rollouts per row for agents that repeats_by_agent does not name; None: such a row fails."""
        if self.repeats is not None:
            return self.repeats
        return None if self.repeats_by_agent else 1

    def repeats_for(self, agent: str | None) -> int | None:
        """Rollouts per row for rows of agent `agent` (None: a row routed without a name);
        None when neither repeats_by_agent nor a default covers it."""
        if agent is not None and agent in self.repeats_by_agent:
            return self.repeats_by_agent[agent]
        return self.default_repeats

    @property
    def max_repeats(self) -> int:
        return max([self.default_repeats or 1, *self.repeats_by_agent.values()])


@dataclasses.dataclass(frozen=True, slots=True)
class CommandConfig:
    """A command-line run: the engine's `Config`, and the inputs and files around it."""

    engine: Config
    inputs: tuple[str, ...] = ("-",)
    ordered: bool = False  # -k: results in input order
    output: str | None = None
    errors_file: str | None = None
    metrics_file: str | None = None
    per_task_file: str | None = None
    aggregate_file: str | None = None  # --aggregate FILE: NeMo Gym's aggregate file
    materialized_file: str | None = None  # --materialized FILE: every /run body as sent
    progress_file: str | None = None  # --progress-file FILE: the number of finished rollouts
    resume: bool = False
    append: bool = False  # -o and --errors may already hold lines of another run
    max_attempts: int = DEFAULT_MAX_ATTEMPTS  # failed attempts after which --resume gives a pair up
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    shard_auto: bool = False  # the shard came from --shard auto: a resumed output's own record wins over it
    wait_lock: bool = False  # an output another run holds is waited for, not refused

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.aggregate_file is not None and not self.engine.aggregate:
            # Named by one field only: the command line shows both as the one option that sets them.
            raise UsageError(
                "CommandConfig.aggregate_file is written from the agents' /aggregate_metrics,"
                " which only an engine Config with aggregate=True asks for"
            )
        if self.max_attempts < 1:
            raise UsageError("CommandConfig.max_attempts must be at least 1")
        if self.resume and self.output is None:
            raise UsageError("CommandConfig.resume needs CommandConfig.output FILE: it skips the rows already in FILE")


# What curl refuses in a host name (its hostname_check), '%' included: a host is never
# percent-decoded here, so "127.0.0.%31" would be looked up as it stands and fail as a
# connect error, retried, where it is a mistake in the URL.
_NOT_IN_A_HOST = frozenset(" \r\n\t/:#?!@{}[]\\$'\"^`*<>=;,+&()%")


def agent_url(text: str) -> str:
    """Validate an agent URL and append `/run` when it has no path."""
    parts = checked_url(text)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/run")
    return urllib.parse.urlunsplit(parts)


def checked_url(text: str, schemes: tuple[str, ...] = ("http", "https")) -> urllib.parse.SplitResult:
    """The parts of an http(s) URL with a host and a valid port; UsageError (which never shows
    the URL's credentials or query) otherwise."""
    kind = "http(s)" if schemes == ("http", "https") else "/".join(schemes)
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as exc:  # a bracketed host that is no IPv6 address; the text names the host at most
        raise UsageError(f"not an {kind} URL: {exc}") from None
    if parts.scheme not in schemes or not parts.hostname:
        raise UsageError(f"not an {kind} URL: {shown_split(parts)!r}")
    if ":" not in parts.hostname:  # an IPv6 address, which urlsplit has checked
        bad = next((c for c in parts.hostname if c in _NOT_IN_A_HOST or not c.isprintable()), None)
        if bad is not None:
            raise UsageError(f"not an {kind} URL: {shown_split(parts)!r}, whose host holds {bad!r}")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"bad port in URL {shown_split(parts)!r}")
    return parts


def parse_endpoints(specs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """`NAME=URL[,URL...]`, repeatable; several URLs for one NAME are its replicas."""
    endpoints: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        name, sep, urls = spec.partition("=")
        if not sep or not name or not urls:
            raise UsageError(f"Config.endpoints wants NAME=URL, got {spec!r}")
        replicas = tuple(agent_url(url.strip()) for url in urls.split(",") if url.strip())
        endpoints[name] = endpoints.get(name, ()) + replicas
    return endpoints


def gym_layout(output: str | None) -> tuple[str, str, str, str]:
    """The files ng_collect_rollouts writes beside OUT.jsonl: its materialized inputs, failures
    sidecar, aggregate metrics and progress counter, named as NeMo Gym names them."""
    if output is None:
        raise UsageError("the NeMo Gym layout needs CommandConfig.output OUT.jsonl: the other files are named after it")
    path = pathlib.Path(output)
    return (
        str(path.with_stem(path.stem + "_materialized_inputs").with_suffix(".jsonl")),
        str(path.with_name(path.stem + "_failures.jsonl")),
        str(path.with_stem(path.stem + "_aggregate_metrics").with_suffix(".json")),
        str(path.with_name(path.stem + "_progress")),
    )


def parse_prices(specs: Iterable[str], path: str | None) -> tuple[tuple[str | None, Price], ...]:
    """`--prices FILE` (YAML or JSON), then each `--price [AGENT=]IN,OUT[,CACHED]`; the last for an agent wins."""
    prices: dict[str | None, Price] = {}
    if path is not None:
        import yaml  # only a run given a prices file pays for importing it

        try:
            with open(path, encoding="utf-8") as file:
                data = yaml.safe_load(file)
        except OSError as exc:
            raise UsageError(f"cannot read Config.prices {path}: {exc.strerror}") from None
        except (yaml.YAMLError, UnicodeDecodeError):
            raise UsageError(f"Config.prices {path} is not YAML or JSON") from None
        try:
            prices.update(prices_from_mapping(data))
        except PriceError as exc:
            raise UsageError(f"Config.prices {path}: {exc}") from None
    try:
        for spec in specs:
            agent, price = parse_price(spec)
            prices[agent] = price
    except PriceError as exc:
        raise UsageError(str(exc)) from None
    return tuple(prices.items())


def parse_retry_budget(spec: str) -> float | None:
    """`--retry-budget R`: a number of retries a row, 0 or more; `off` for no budget."""
    if spec.strip().lower() == "off":
        return None
    try:
        ratio = float(spec)
    except ValueError:
        ratio = math.nan
    if not 0 <= ratio < math.inf:
        raise UsageError(f"Config.retries.budget wants R (retries a row, 0 or more) or off, got {spec!r}")
    return ratio


def parse_repeats(specs: Iterable[str]) -> tuple[int | None, dict[str, int]]:
    """`K` (the default for every agent) and `NAME=K` (for agent NAME), each repeatable; the last
    wins. The default is None when no `K` is given."""
    default = None
    by_agent: dict[str, int] = {}
    for spec in specs:
        name, sep, count = spec.rpartition("=")
        if not _is_decimal(count) or (sep and not name) or int(count) < 1:
            raise UsageError(f"Config.repeats wants K or NAME=K with K >= 1, got {spec!r}")
        if sep:
            by_agent[name] = int(count)
        else:
            default = int(count)
    return default, by_agent


def parse_param(spec: str) -> tuple[str, Any]:
    """`KEY=VALUE`: VALUE as JSON when it parses as JSON, else as a string."""
    key, sep, text = spec.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise UsageError(f"Config.params wants KEY=VALUE, got {spec!r}")
    try:
        value: Any = msgspec.json.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        value = text
    return key, value


def parse_header(spec: str) -> tuple[str, str]:
    """`Name: value`, as curl's -H, checked as `Config.headers` checks it. The value is a
    secret: it never appears in a message."""
    name, sep, value = spec.partition(":")
    if not sep:
        raise ConfigError("headers", "wants 'Name: value' (the value is not shown)")
    return _checked_header(name.strip(), value.strip())


def checked_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """`headers` as (name, value) pairs of strings that can go on the wire; ConfigError naming
    Config.headers (and the name, never the value) otherwise."""
    try:
        # A string is left whole: as a tuple, "ab" would be the header a: b.
        pairs = tuple(header if isinstance(header, str) else tuple(header) for header in headers)
    except TypeError:  # not iterable, or holding something that is not a pair
        raise ConfigError("headers", "wants (name, value) pairs of strings") from None
    for pair in pairs:
        if isinstance(pair, str) or len(pair) != 2 or not all(isinstance(part, str) for part in pair):
            raise ConfigError("headers", "wants (name, value) pairs of strings")
        _checked_header(*pair)
    return pairs  # type: ignore[return-value]  # each checked to be a pair of strings


def _checked_endpoints(endpoints: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Each agent's URLs, checked and completed (`agent_url`); a single URL is taken as one replica."""
    wanted = "wants a mapping of agent names to a URL or URLs, like {'a': ('http://h:1',)}"
    if not isinstance(endpoints, Mapping):
        raise ConfigError("endpoints", wanted)
    checked = {}
    for name, urls in endpoints.items():
        replicas = (urls,) if isinstance(urls, str) else tuple(urls) if isinstance(urls, Iterable) else None
        if not isinstance(name, str) or replicas is None or not all(isinstance(url, str) for url in replicas):
            raise ConfigError("endpoints", wanted)
        checked[name] = tuple(agent_url(url) for url in replicas)
    return checked


def _checked_params(params: Iterable[tuple[str, Any]]) -> tuple[tuple[str, Any], ...]:
    wanted = "wants (KEY, value) pairs, KEY a name or dotted path like 'temperature' or 'metadata.x'"
    try:
        pairs = tuple(param if isinstance(param, str) else tuple(param) for param in params)
    except TypeError:  # not iterable, or holding something that is not a pair
        raise ConfigError("params", wanted) from None
    for pair in pairs:
        if isinstance(pair, str) or len(pair) != 2 or not isinstance(pair[0], str) or not all(pair[0].split(".")):
            raise ConfigError("params", wanted)
    return pairs


def _checked_prices(prices: Iterable[tuple[str | None, Price]]) -> tuple[tuple[str | None, Price], ...]:
    wanted = "wants (agent, Price) pairs, agent None for the rest, like ((None, Price(0.5, 1.5)),)"
    try:
        pairs = tuple(tuple(price) for price in prices)
    except TypeError:  # not iterable, or holding something that is not a pair
        raise ConfigError("prices", wanted) from None
    for pair in pairs:
        if len(pair) != 2 or not isinstance(pair[0], str | None) or not isinstance(pair[1], Price):
            raise ConfigError("prices", wanted)
    return pairs  # type: ignore[return-value]  # each checked to be an (agent, Price) pair


def _checked_header(name: str, value: str) -> tuple[str, str]:
    if not name or not set(name) <= _TOKEN_CHARACTERS:
        raise ConfigError(
            "headers", "holds a name that is empty or not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)"
        )
    # CR and LF would end the header on the wire and start another (header injection); NUL
    # ends it for many servers.
    if any(c in "\r\n\0" for c in value):
        raise ConfigError("headers", f"{name}: the value holds CR, LF or NUL (the value is not shown)")
    return name, value


# RFC 9110's token, what a field name is made of: a name outside it is refused by servers and
# by httpx (the --proxy path), which encodes names as ASCII.
_TOKEN_CHARACTERS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def parse_statuses(spec: str) -> frozenset[int]:
    """A comma list of HTTP statuses, as `--retry-on 429,503`; empty retries no status."""
    statuses: set[int] = set()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if not _is_decimal(item) or not 100 <= int(item) <= 599:
            raise UsageError(f"Config.retries.statuses wants HTTP statuses like 429,503, got {item!r}")
        statuses.add(int(item))
    return frozenset(statuses)


def parse_shard(spec: str | None, environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """`I/N`: this process's share of the tasks, 0 <= I < N; `auto`: this Slurm array task's (see `slurm_shard`)."""
    if spec is None:
        return None
    if spec == SHARD_AUTO:
        return slurm_shard(os.environ if environ is None else environ)
    index, sep, count = spec.partition("/")
    if not sep or not _is_decimal(index) or not _is_decimal(count):
        raise UsageError(f"Config.shard wants I/N, like 0/4, got {spec!r}")
    return int(index), int(count)  # Config checks the range


def slurm_shard(environ: Mapping[str, str]) -> tuple[int, int]:
    """The shard of a Slurm job array's task: I = (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / step,
    N = SLURM_ARRAY_TASK_COUNT, so `--array=0-3` and `--array=1-4` both run shards 0..3 of 4.

    UsageError outside a job array, or in one whose task IDs are not an evenly stepped range."""
    names = ("ID", "MIN", "COUNT")
    if any(f"SLURM_ARRAY_TASK_{name}" not in environ for name in names):
        raise UsageError("Config.shard auto works inside a Slurm job array (sbatch --array): give Config.shard I/N")
    try:
        task, first, count = (int(environ[f"SLURM_ARRAY_TASK_{name}"]) for name in names)
        step = int(environ.get("SLURM_ARRAY_TASK_STEP") or 1)
    except ValueError:
        raise UsageError("Config.shard auto: the SLURM_ARRAY_TASK_* variables do not hold numbers") from None
    offset = task - first
    if step < 1 or offset % step or not 0 <= offset // step < count:
        raise UsageError(
            f"Config.shard auto: array task {task} is not in an evenly stepped range of {count} tasks from {first}"
            " (sbatch --array=A-B[:S]): give Config.shard I/N"
        )
    return offset // step, count


def parse_failure_limit(spec: str | None) -> FailureLimit:
    """`N` rollouts, or `P%` of the rollouts ended so far."""
    if spec is None:
        return FailureLimit()
    text = spec.strip()
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not (math.isfinite(percent) and 0 < percent <= 100):
                raise ValueError
            return FailureLimit(fraction=percent / 100)
        count = int(text)
        if count < 1:
            raise ValueError
        return FailureLimit(count=count)
    except ValueError:
        raise UsageError(f"Config.max_failures wants a count like 10 or a rate like 5%, got {spec!r}") from None


def _is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() accepts "²", which int() refuses."""
    text = text.strip()
    return text.isascii() and text.isdigit()
