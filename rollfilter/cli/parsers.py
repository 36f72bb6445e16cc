"""The command line's option texts, parsed into what `Config` and `CommandConfig` take.

Each parser belongs to one option (typer's `parser=`, or the command's own assembly of several)
and says what is wrong with its text by that option's name, in one line, as `UsageError`. What
`Config` checks (a shard's I < N, groups of more than one rollout, --max-cost's prices) is left to
it: its `ConfigError` names a field, and `cli/main.py` says it by the option that sets that field
(`messages.OPTION_OF_FIELD`). Two read
outside their argument: `prices` reads its file, and `shard` the Slurm variables of the
environment for `auto`.
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from rollfilter.config import (
    DEFAULT_TRACKED_ROLLOUTS,
    MAX_POLICY_VERSION,
    MAX_REPEATS,
    MIN_RATE,
    ROUTE_BY_TASK,
    ROUTE_LEAST_OUTSTANDING,
    ROUTES,
    UNHEALTHY_MODES,
    FailureLimit,
    Groups,
    RecentLimit,
    Reverify,
    Trackers,
    agent_url,
    checked_url,
    is_decimal,
    verify_url,
)
from rollfilter.cost import Price, PriceError
from rollfilter.errors import UsageError
from rollfilter.formats.resume import max_attempts_from_environment
from rollfilter.redact import shown, shown_as_typed

SHARD_AUTO = "auto"  # --shard auto: the shard of this Slurm array task
DEFAULT_AGENT = "_default"  # in a prices file: the price of agents it does not name
# A number as the options take it (--price, --rpm, --tpm, and the control's): float() would take
# "1_000" and full-width digits too.
DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def url(text: str) -> str:
    """-u: an agent URL, with /run appended when its path is empty or ends in / (see `agent_url`)."""
    return as_typed(agent_url, text)


def as_typed(parse: Callable[[str], str], text: str) -> str:
    """`parse` of `text` read as curl reads it (`with_scheme`); a refusal of a URL that was given
    without a scheme quotes what was typed too (its secrets cut, as `shown` cuts them)."""
    read = with_scheme(text)
    try:
        return parse(read)
    except UsageError as exc:
        if read == text:
            raise
        raise UsageError(f"{exc}, read from {shown_as_typed(text)!r} as curl reads it") from None


def with_scheme(text: str) -> str:
    """A URL as curl reads what it is given: `HOST:PORT` (or a bare host) means http://, and
    `:PORT` this machine's (127.0.0.1, so that no name lookup picks another address family)."""
    if "://" in text:
        return text
    return f"http://127.0.0.1{text}" if text.startswith(":") else f"http://{text}"


def service_url(option: str, schemes: tuple[str, ...] = ("http", "https")) -> Any:
    """--head-server, --proxy: a URL of `schemes` (see `with_scheme` for a URL without one)."""

    def parse(text: str) -> str:
        try:
            return as_typed(lambda read: str(checked_url(read, schemes)), text)
        except UsageError as exc:
            raise UsageError(f"{option} is not usable: {exc}") from None

    return parse


def targets(
    endpoint: list[str] | None,
    verifier: list[str] | None,
    reverify: str | None,
    judge_failed_only: bool,
    force: bool,
    *refusing: Any,
) -> dict[str, Any]:
    """Config's endpoints (from -e, or with --reverify from --verifier) and reverify; UsageError
    for an option given without what it goes with, or with what it cannot go with (`refusing`:
    --demo, --summarize and --materialized's values)."""
    demo, summarize, materialized = refusing
    del demo  # the demo agent is a resources server too
    refused = {"-e": bool(endpoint), "--summarize": summarize, "--materialized": bool(materialized)}
    rescoring = rescoring_settings(reverify, verifier or (), judge_failed_only, force=force, refused=refused)
    if rescoring is None:
        return {"endpoints": endpoints(endpoint or ())}
    return {"endpoints": verifiers(verifier or ()), "reverify": rescoring}


def rescoring_settings(
    materialized: str | None,
    verifiers: Iterable[str],
    judge_failed_only: bool,
    *,
    force: bool,
    refused: dict[str, bool],
) -> Reverify | None:
    """Config.reverify from --reverify and the options that go with it; UsageError for those given
    without it, and for those it cannot go with."""
    if materialized is None:
        alone = [name for name, given in (("--verifier", any(True for _ in verifiers)),
                 ("--judge-failed-only", judge_failed_only), ("--force", force)) if given]  # fmt: skip
        if alone:
            raise UsageError(f"{alone[0]} is about re-scoring rollouts: give --reverify MATERIALIZED")
        return None
    if not materialized:
        raise UsageError("--reverify wants the materialized inputs file (NeMo Gym's OUT_materialized_inputs.jsonl)")
    for option, given in refused.items():
        if given:
            raise UsageError(
                f"--reverify sends to resources servers (--verifier, -u, --head-server): not with {option}"
            )
    return Reverify(materialized, judge_failed_only=judge_failed_only, force=force)


def verifiers(specs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """--verifier `NAME=URL`, repeatable: the resources server of agent NAME's rollouts."""
    found: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url.strip():
            raise UsageError(f"--verifier wants NAME=URL, got {spec!r}")
        found[name] = (verify_url(url.strip()),)
    return found


def endpoints(specs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """-e `NAME=URL[,URL...]`, repeatable; several URLs for one NAME are its replicas (UsageError
    for one given twice: two replicas of one server would count its requests and failures apart)."""
    found: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        name, sep, urls = spec.partition("=")
        if not sep or not name or not urls:
            raise UsageError(f"-e/--endpoint wants NAME=URL, got {spec!r}")
        replicas = tuple(as_typed(agent_url, url.strip()) for url in _replicas(urls) if url.strip())
        for url in replicas:
            if url in found.get(name, ()):
                raise UsageError(
                    f"-e/--endpoint {name}: {shown(url)} is given twice: each replica is one URL, given once"
                )
            found[name] = (*found.get(name, ()), url)
    return found


def _replicas(urls: str) -> list[str]:
    """-e's `URL,URL...` split into its URLs. A comma in a URL's query or fragment (`?tags=a,b`)
    stays in it, unless what follows it names a scheme: that is the next replica."""
    found: list[str] = []
    for piece in urls.split(","):
        if found and ("?" in found[-1] or "#" in found[-1]) and "://" not in piece:
            found[-1] += "," + piece
        else:
            found.append(piece)
    return found


def prices(specs: Iterable[str], path: str | None) -> tuple[tuple[str | None, Price], ...]:
    """`--prices FILE` (YAML or JSON), then each `--price [AGENT=]IN,OUT[,CACHED]`; the last for an
    agent wins."""
    found: dict[str | None, Price] = {}
    if path is not None:
        import yaml  # only a run given a prices file pays for importing it

        try:
            with open(path, encoding="utf-8") as file:
                data = yaml.safe_load(file)
        except OSError as exc:
            raise UsageError(f"cannot read --prices {path}: {exc.strerror}") from None
        except (yaml.YAMLError, UnicodeDecodeError):
            raise UsageError(f"--prices {path} is not YAML or JSON") from None
        try:
            found.update(prices_from_mapping(data))
        except PriceError as exc:
            raise UsageError(f"--prices {path}: {exc}") from None
    for spec in specs:
        agent, price = parse_price(spec)
        found[agent] = price
    return tuple(found.items())


def parse_price(spec: str) -> tuple[str | None, Price]:
    """--price `[AGENT=]IN,OUT[,CACHED]`: the agent (None: every agent not priced by name) and its price."""
    name, sep, numbers = spec.rpartition("=")
    parts = numbers.split(",")
    try:
        if not all(DECIMAL.fullmatch(part.strip()) for part in parts):
            raise ValueError
        values = [float(part) for part in parts]
        if len(values) not in (2, 3) or (sep and not name):
            raise ValueError
        return (name if sep else None), Price(*values)
    except (ValueError, PriceError):
        raise UsageError(f"--price wants [AGENT=]IN,OUT[,CACHED] in USD per million tokens, got {spec!r}") from None


def prices_from_mapping(data: Any) -> list[tuple[str | None, Price]]:
    """A prices file's content: {AGENT or "_default": [IN, OUT(, CACHED)] or {input, output, cached}}."""
    if not isinstance(data, dict):
        raise PriceError("a prices file holds a map of agent names to prices")
    found: list[tuple[str | None, Price]] = []
    for agent, value in data.items():
        name = None if agent == DEFAULT_AGENT else str(agent)
        try:
            if isinstance(value, list) and len(value) in (2, 3):
                price = Price(*value)
            elif isinstance(value, dict) and {"input", "output"} <= set(value) <= {"input", "output", "cached"}:
                price = Price(value["input"], value["output"], value.get("cached"))
            else:
                raise PriceError("want [IN, OUT] or [IN, OUT, CACHED], or {input: IN, output: OUT, cached: CACHED}")
        except (TypeError, PriceError) as exc:
            raise PriceError(f"the price of {agent!r}: {exc}") from None
        found.append((name, price))
    return found


def retry_budget(spec: str | float | None) -> float | None:
    """`--retry-budget R`: a number of retries a row, 0 or more; `off` for no budget."""
    if not isinstance(spec, str):  # the default
        return spec
    if spec.strip().lower() == "off":
        return None
    try:
        ratio = float(spec)
    except ValueError:
        ratio = math.nan
    if not 0 <= ratio < math.inf:
        raise UsageError(f"--retry-budget wants R (retries a row, 0 or more) or off, got {spec!r}")
    return ratio


def repeats(specs: Iterable[str]) -> tuple[int | None, dict[str, int]]:
    """-r `K` (the default for every agent) and `NAME=K` (for agent NAME), each repeatable; the last
    wins. The default is None when no `K` is given."""
    default = None
    by_agent: dict[str, int] = {}
    for spec in specs:
        name, sep, count = spec.rpartition("=")
        count = count.strip()
        if not is_decimal(count) or (sep and not name) or not 1 <= int(count) <= MAX_REPEATS:
            raise UsageError(f"-r/--repeats wants K or NAME=K with 1 <= K <= {MAX_REPEATS}, got {spec!r}")
        if sep:
            by_agent[name] = int(count)
        else:
            default = int(count)
    return default, by_agent


def rate_limits(specs: Iterable[str], option: str) -> tuple[float | None, dict[str, float]]:
    """--rpm or --tpm: `N` (for every agent without its own) and `NAME=N` (for agent NAME), each
    repeatable, N a positive number a minute; the last wins."""
    default = None
    by_agent: dict[str, float] = {}
    for spec in specs:
        name, sep, text = spec.rpartition("=")
        text = text.strip()
        number = float(text) if DECIMAL.fullmatch(text) else math.nan
        if not (MIN_RATE <= number <= sys.float_info.max) or (sep and not name):
            raise UsageError(f"{option} wants N or NAME=N, N a number a minute of {MIN_RATE} or more, got {spec!r}")
        if sep:
            by_agent[name] = number
        else:
            default = number
    return default, by_agent


def rates(rpm: Iterable[str], tpm: Iterable[str]) -> dict[str, Any]:
    """Config.rates' fields from --rpm and --tpm."""
    (rpm_default, rpm_by_agent), (tpm_default, tpm_by_agent) = rate_limits(rpm, "--rpm"), rate_limits(tpm, "--tpm")
    return {"rpm": rpm_default, "rpm_by_agent": rpm_by_agent, "tpm": tpm_default, "tpm_by_agent": tpm_by_agent}


# NeMo Gym's own spelling of an override (Hydra's, with + to add a key): `-p` sets keys inside it.
GYM_PARAMS_PREFIX = "responses_create_params."


def param(spec: str) -> tuple[str, Any]:
    """-p `KEY=VALUE`: VALUE as JSON when it parses as JSON, else as a string. NeMo Gym's
    `responses_create_params.KEY=VALUE` and `+responses_create_params.KEY=VALUE` mean `KEY=VALUE`."""
    key, sep, text = spec.partition("=")
    key = key.lstrip("+").removeprefix(GYM_PARAMS_PREFIX)
    if key.partition(".")[0] == GYM_PARAMS_PREFIX.rstrip("."):  # bare, or named twice: never sent nested
        raise UsageError(f"-p sets keys inside responses_create_params: give -p KEY=VALUE for each, got {spec!r}")
    if not sep or not key or any(not part for part in key.split(".")):
        raise UsageError(f"-p/--param wants KEY=VALUE, got {spec!r}")
    try:
        value: Any = msgspec.json.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        value = text
    return key, value


def max_attempts(given: int | None, environ: Mapping[str, str]) -> int:
    """--max-attempts N, or else NEMO_GYM_MAX_ROLLOUT_ATTEMPTS's, as NeMo Gym reads it."""
    return given if given is not None else max_attempts_from_environment(environ)


def cacert(path: str | None) -> str | None:
    """--cacert's file (Tls checks that it can be used when a run starts)."""
    if path == "":
        raise UsageError("--cacert wants the path of a PEM file of CA certificates")
    return path


def header(spec: str) -> tuple[str, str]:
    """-H `Name: value`, as curl's (Config checks that it can go on the wire). The value is a
    secret: it never appears in a message."""
    name, sep, value = spec.partition(":")
    if not sep:
        raise UsageError("-H/--header wants 'Name: value' (the value is not shown)")
    return name.strip(), value.strip()


def statuses(spec: str | frozenset[int]) -> frozenset[int]:
    """--retry-on: a comma list of HTTP statuses, as `429,503`; empty retries no status."""
    if not isinstance(spec, str):
        return spec
    found: set[int] = set()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if not is_decimal(item) or not 100 <= int(item) <= 599:
            raise UsageError(f"--retry-on wants HTTP statuses like 429,503, got {item!r}")
        found.add(int(item))
    return frozenset(found)


def shard(spec: str | None, environ: Mapping[str, str]) -> tuple[int, int] | None:
    """--shard `I/N`: this process's share of the tasks (Config checks 0 <= I < N); `auto`: this
    Slurm array task's (see `slurm_shard`)."""
    if spec is None:
        return None
    if spec == SHARD_AUTO:
        return slurm_shard(environ)
    index, sep, count = spec.partition("/")
    if not sep or not is_decimal(index.strip()) or not is_decimal(count.strip()):
        raise UsageError(f"--shard wants I/N, like 0/4, got {spec!r}")
    return int(index), int(count)


def slurm_shard(environ: Mapping[str, str]) -> tuple[int, int]:
    """The shard of a Slurm job array's task: I = (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN) / step,
    N = SLURM_ARRAY_TASK_COUNT, so `--array=0-3` and `--array=1-4` both run shards 0..3 of 4.

    UsageError outside a job array, or in one whose task IDs are not an evenly stepped range."""
    names = ("ID", "MIN", "COUNT")
    if any(f"SLURM_ARRAY_TASK_{name}" not in environ for name in names):
        raise UsageError("--shard auto works inside a Slurm job array (sbatch --array): give --shard I/N")
    try:
        task, first, count = (int(environ[f"SLURM_ARRAY_TASK_{name}"]) for name in names)
        step = int(environ.get("SLURM_ARRAY_TASK_STEP") or 1)
    except ValueError:
        raise UsageError("--shard auto: the SLURM_ARRAY_TASK_* variables do not hold numbers") from None
    offset = task - first
    if step < 1 or offset % step or not 0 <= offset // step < count:
        raise UsageError(
            f"--shard auto: array task {task} is not in an evenly stepped range of {count} tasks from {first}"
            " (sbatch --array=A-B[:S]): give --shard I/N"
        )
    return offset // step, count


def failure_limit(spec: str | FailureLimit | None) -> FailureLimit:
    """--max-failures: `N` rollouts, or `P%` of the rollouts ended so far."""
    if spec is None:
        return FailureLimit()
    if isinstance(spec, FailureLimit):  # the default
        return spec
    try:
        count, fraction = _count_or_rate(spec)
    except ValueError:
        raise UsageError(f"--max-failures wants a count like 10 or a rate like 5%, got {spec!r}") from None
    return FailureLimit(count=count, fraction=fraction)


def _count_or_rate(text: str) -> tuple[int | None, float | None]:
    """`N` (a whole number, at least 1) or `P%` (over 0, at most 100) as (count, fraction);
    ValueError for anything else."""
    text = text.strip()
    if text.endswith("%") and DECIMAL.fullmatch(text[:-1]):  # float() alone takes 1_0, +5, other scripts' digits
        percent = float(text[:-1])
        if not (math.isfinite(percent) and 0 < percent <= 100):
            raise ValueError
        return None, percent / 100
    if not is_decimal(text) or int(text) < 1:
        raise ValueError
    return int(text), None


def unhealthy(text: str) -> str:
    """--unhealthy: what to do with an unhealthy rollout (keep, mask or fail)."""
    if text not in UNHEALTHY_MODES:
        raise UsageError(f"--unhealthy {text!r}: the choices are keep, mask and fail")
    return text


def recent_limit(option: str) -> Any:
    """A parser of `option` (--max-unhealthy, --max-masked): `N` rollouts, or `P%` of the last 100
    ended; neither 0% nor over 100%."""

    def parse(spec: str | RecentLimit | None) -> RecentLimit | None:
        if spec is None or isinstance(spec, RecentLimit):
            return spec
        try:
            count, fraction = _count_or_rate(spec)
        except ValueError:
            raise UsageError(
                f"{option} wants a count like 10 or a rate like 30% (over 0, at most 100), got {spec!r}"
            ) from None
        return RecentLimit(count=count, fraction=fraction)

    return parse


def positive(option: str, what: str) -> Any:
    """A parser of `option`'s positive, finite number (`what` it counts: seconds, USD)."""

    def parse(value: str | float | None) -> float | None:
        if value is None:
            return None
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not 0 < number < math.inf:
            raise UsageError(f"{option} must be a positive, finite number of {what}, got {value!r}")
        return number

    return parse


def finite(option: str) -> Any:
    """A parser of `option`'s finite number."""

    def parse(value: str | float) -> float:
        if isinstance(value, float):  # the default
            return value
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise UsageError(f"{option} must be a finite number, got {value!r}")
        return number

    return parse


GymFiles = tuple[str | None, str | None, str | None, str | None]  # materialized, errors, aggregate, progress


def gym_files(gym: bool, output: str | None, given: GymFiles, *, summarize: bool) -> GymFiles:
    """The four files --gym-layout names (`given` without it); --summarize writes none of them."""
    if not gym:
        return given
    if any(path is not None for path in given):
        raise UsageError("--gym-layout names the errors, materialized, aggregate and progress files itself")
    return given if summarize else gym_layout(output)


def gym_layout(output: str | None) -> tuple[str, str, str, str]:
    """The files ng_collect_rollouts writes beside OUT.jsonl: its materialized inputs, failures
    sidecar, aggregate metrics and progress counter, named as NeMo Gym names them."""
    if output is None:
        raise UsageError("--gym-layout needs -o OUT.jsonl: the other files are named after it")
    path = pathlib.Path(output)
    return (
        str(path.with_stem(path.stem + "_materialized_inputs").with_suffix(".jsonl")),
        str(path.with_name(path.stem + "_failures.jsonl")),
        str(path.with_stem(path.stem + "_aggregate_metrics").with_suffix(".json")),
        str(path.with_name(path.stem + "_progress")),
    )


def policy_version(version: int | None) -> int | None:
    """--policy-version; UsageError for a version past 2**53."""
    if version is not None and abs(version) > MAX_POLICY_VERSION:
        raise UsageError(f"--policy-version is a whole number of at most {MAX_POLICY_VERSION} (2**53)")
    return version


def groups(
    grouped: bool,
    *,
    keep_incomplete: bool,
    drop_uniform: bool,
    field: str | None,
    target: int | None,
    max_staleness: int | None,
    batch: int | None,
    refused: dict[str, bool],
) -> Groups | None:
    """Config.groups from --groups (`grouped`), --drop-uniform (which implies it) and the options
    of groups (None: no groups); UsageError for what `Groups` cannot tell: a --group-field without
    --drop-uniform (its field has a default), an option of groups given without them, and an
    option groups cannot go with (those `refused`, named as typed). `Groups` checks the rest (a
    staleness bound's two figures, a --group-field that can be a number), and Config that a group
    has more than one rollout."""
    if field is not None and not drop_uniform:
        raise UsageError("--group-field is what --drop-uniform compares: give --drop-uniform")
    for option, value in refused.items() if grouped or drop_uniform else ():
        if value:
            grouping = "--groups" if grouped else "--drop-uniform"
            raise UsageError(f"{grouping} cannot go with {option}: {_REFUSED_WITH_GROUPS[option]}")
    settings = Groups(keep_incomplete, drop_uniform, field or "reward", target, max_staleness, batch)
    if grouped or drop_uniform:
        return settings
    if max_staleness is not None:
        raise UsageError("--max-staleness needs --groups (or --drop-uniform): staleness is bounded group by group")
    for option, given in (("--keep-incomplete", keep_incomplete), ("--target-groups", target is not None)):
        if given:
            raise UsageError(f"{option} is about groups: give --groups (or --drop-uniform)")
    return None


_REFUSED_WITH_GROUPS = {
    "--dry-run": "a dry run sends nothing, so no group ever ends",
    "-k": "a group is written as soon as it is whole, not in input order",
    "--ordered": "a group is written as soon as it is whole, not in input order",
}


def route(text: str | None) -> Literal["task", "least-outstanding"] | None:
    """--route's policy; UsageError naming the ones there are."""
    if text is None:
        return None
    if text == ROUTE_BY_TASK:
        return "task"
    if text == ROUTE_LEAST_OUTSTANDING:
        return "least-outstanding"
    raise UsageError(f"--route {text!r}: the policies are {' and '.join(ROUTES)}")


def affinity_header(name: str | None, headers: Sequence[str]) -> str | None:
    """--affinity-header's name; UsageError when -H sets it too (Config checks that it is a header
    name, and not one every request carries)."""
    if name is None:
        return None
    given = [text.partition(":")[0].strip() for text in headers]
    if name.lower() in {other.lower() for other in given}:
        raise UsageError(
            f"--affinity-header {name}: -H sets it already, one value for every request: leave it out"
            " of -H (the affinity header carries one value a task), or name another header"
        )
    return name


def prometheus(address: str | None, file: str | None) -> dict[str, Any]:
    """--prometheus HOST:PORT and --prometheus-file FILE, as CommandConfig takes them."""
    if file == "":
        raise UsageError("--prometheus-file wants the path of a file")
    return {"prometheus": None if address is None else listen_address(address), "prometheus_file": file}


def listen_address(text: str) -> tuple[str, int]:
    """--prometheus's HOST:PORT (an IPv6 address in brackets, [::1]:9464); UsageError when it is
    none. Whether it can be bound is known once it is (`cli/exporter.listen`)."""
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise UsageError(f"--prometheus {text}: an IPv6 address goes in brackets, [::1]:9464")
    if not colon or not host:
        raise UsageError(f"--prometheus {text}: give HOST:PORT, such as 127.0.0.1:9464")
    if not is_decimal(port) or not 1 <= int(port) <= 65535:
        raise UsageError(f"--prometheus {text}: the port must be a number from 1 to 65535")
    return host, int(port)


# Beside -o OUT.jsonl: the ids of the tracker runs that a --resume of it continues.
TRACKER_IDS_SUFFIX = ".trackers.json"
# The module of each tracker's client, and its extra, by the option that needs it.
TRACKER_EXTRAS = {"--mlflow": ("mlflow", "mlflow"), "--wandb": ("wandb", "wandb")}


def trackers(
    *,
    mlflow: str | None,
    experiment: str | None,
    wandb: str | None,
    run_name: str | None,
    rollouts: int | None,
    output: str | None,
) -> Trackers | None:
    """--mlflow, --wandb and what goes with them, as Config.trackers (None: no tracker). The run
    name is --run-name, else the -o file's stem; the ids are kept beside -o (`OUT.jsonl.trackers.json`:
    the run drops that when -o keeps no run record). UsageError when a tracker's client is not
    installed (with the pip command), or an option that goes with one is given alone."""
    if mlflow is None and wandb is None:
        alone = [name for name, value in (("--experiment", experiment), ("--run-name", run_name)) if value is not None]
        alone += ["--track-rollouts"] if rollouts is not None else []
        if alone:
            raise UsageError(f"{alone[0]} goes with --mlflow or --wandb: give one of them")
        return None
    if experiment is not None and mlflow is None:
        raise UsageError("--experiment names an MLflow experiment: give it with --mlflow")
    for option, value in (("--mlflow", mlflow), ("--wandb", wandb), ("--experiment", experiment)):
        if value is not None and not value.strip():
            raise UsageError(f"{option} wants a name, not an empty text")
    import importlib.util

    for option, value in (("--mlflow", mlflow), ("--wandb", wandb)):
        module, extra = TRACKER_EXTRAS[option]
        if value is not None and importlib.util.find_spec(module) is None:
            raise UsageError(f"{option} needs its client, not installed here: pip install 'rollfilter[{extra}]'")
    if run_name is None and output is not None:
        run_name = pathlib.Path(output).stem or None
    return Trackers(
        mlflow=mlflow,
        experiment=experiment or "rollfilter",
        wandb=wandb,
        run_name=run_name or None,
        rollouts=DEFAULT_TRACKED_ROLLOUTS if rollouts is None else rollouts,
        ids_file=os.path.realpath(output) + TRACKER_IDS_SUFFIX if output else None,
    )
