"""The command line's options (typer): each parsed by its own parser (`cli/parsers.py`), which
names the option in what it refuses, into a `Config` and a `CommandConfig`, then run.

Declaring the options is all that --help needs, and the command declares them before it knows
whether it will run: this module imports typer and constants only. The parsers, the library's
`Config` and the run (trio, httpx) are imported in `parse`, once the options are to be used.
"""

# No `from __future__ import annotations`: typer reads these annotations several times a start,
# and as strings it would evaluate each of them again at every read (docs/benchmarks.md, start-up).
import functools
import os
import re
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer._click.types import IntRange
from typer.core import TyperCommand  # typer's own click (0.28), whose ranges --help describes

from rollfilter._version import __version__
from rollfilter.cli.environment import Environment, of_process
from rollfilter.cli.messages import say
from rollfilter.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_RATIO,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_STATUSES,
)
from rollfilter.errors import UsageError
from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES

if TYPE_CHECKING:
    from rollfilter.cli.command import CommandConfig

# What `parse` gives `main` to execute: the run, given the stop signals to attach to
# (`cli.signals.StopSignals`), which ends with a `cli.statuses.RunEnd` (neither named here:
# typer resolves this annotation, and those modules load the engine).
Execute = Callable[[Any], Awaitable[object]]
# The --help panels, in the order they are shown (typer's rich_help_panel; drawn by PanelledCommand).
PANEL_AGENTS = "Agents and routing"
PANEL_REPEATS = "Repeats and groups"
PANEL_OUTPUTS = "Outputs"
PANEL_FAULTS = "Faults and retries"
PANEL_LIMITS = "Limits and cost"
PANEL_GYM = "NeMo Gym"
PANEL_OBSERVE = "Observability"
PANELS = (PANEL_AGENTS, PANEL_REPEATS, PANEL_OUTPUTS, PANEL_FAULTS, PANEL_LIMITS, PANEL_GYM, PANEL_OBSERVE)
PANEL_OTHER = "Other options"
HELP_MAX_WIDTH = 160
# click rewraps an epilog's paragraphs, except one that opens with \b.
EXAMPLES = """\b
Examples:
  rollfilter --demo                       # the demo agent, five example rows
  rollfilter -u :8000 --errors err.jsonl in.jsonl > out.jsonl 2> summary.json
  rollfilter -e agent=:8000 -a agent -r 4 --gym-layout -o out.jsonl in.jsonl
  rollfilter --summarize -r 4 out-*.jsonl | jq '{"mean@4", "pass@4"}'

The manual (man rollfilter, or man -l man/rollfilter.1) documents each option in full.
"""
# NeMo Gym's five-row example
EXAMPLE_ROWS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples", "weather.jsonl")
HELP = """Collect agent rollouts: JSONL rows in (FILEs or stdin), one result line out per row as it finishes.

Each row is POSTed to an agent's /run endpoint as NeMo Gym's collector sends it; each JSON
answer is written to stdout as one line with the row's _ng_task_index, _ng_rollout_index
and agent_ref. A metrics summary (one JSON object, stderr's last line) goes to stderr when the run ends. Failed
rows are reported on stderr (or in --errors FILE), never written as results.

Exit status: 0 all rollouts succeeded, 1 some failed or were not persisted, 2 usage error,
3 head server unreachable or an agent never answered, 74 an output could not be written, 75 another run holds an output,
129 hung up, 130 interrupted, 141 stdout closed, 143 terminated.
"""

typer_app = typer.Typer(
    add_completion=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    # As wide as the terminal (click's default stops at 80 columns), up to where lines get hard to read.
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": HELP_MAX_WIDTH},
)


class PanelledCommand(TyperCommand):
    """The command, its --help options in the panels their `rich_help_panel` names, in PANELS'
    order. typer draws panels only through rich, which --help does not load (its start-up cost),
    so they are drawn here with click's plain formatter; options of no panel come last.

    Its options' variables (ROLLFILTER_URL) and shell completion's (_ROLLFILTER_COMPLETE) are
    read from the command's `Environment` (click reads `os.environ`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.envvar:
                param.resolve_envvar_value = functools.partial(variable_of, param)  # type: ignore[method-assign]

    def _main_shell_completion(
        self, ctx_args: MutableMapping[str, Any], prog_name: str, complete_var: str | None = None
    ) -> None:
        name = complete_var or f"_{prog_name}_COMPLETE".replace("-", "_").upper()
        instruction = environment_of(ctx_args.get("obj")).variables.get(name)
        if instruction:
            from typer.completion import shell_complete

            sys.exit(shell_complete(self, ctx_args, prog_name, name, instruction))

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or PANEL_OTHER, []).append(record)
        sections = [("Arguments", arguments), *((name, panels.get(name, [])) for name in (*PANELS, PANEL_OTHER))]
        for name, records in sections:
            if records:
                with formatter.section(name):
                    formatter.write_dl(records)


def environment_of(obj: object) -> Environment:
    """The command's environment, as `cli/main.py` gives it with the context's object; the
    process's own for a context without one (`typer_app` called as a function)."""
    given = obj.get("environment") if isinstance(obj, dict) else None
    return given if isinstance(given, Environment) else of_process()


def variable_of(param: Any, ctx: Any) -> str | None:
    """`param`'s value from the command's environment variables: the first of its variables
    that is set and not empty, as click reads them."""
    variables = environment_of(ctx.find_root().obj).variables
    names = [param.envvar] if isinstance(param.envvar, str) else param.envvar
    return next((variables[name] for name in names if variables.get(name)), None)


def parsed_by(name: str, *made_with: str) -> Callable[[Any], Any]:
    """The parser `name` of cli/parsers.py (made by calling it with `made_with`, if given),
    imported when an option is parsed: declaring the options loads neither it nor `Config`."""

    def parse(value: Any) -> Any:
        from rollfilter.cli import parsers

        parser = getattr(parsers, name)
        return (parser(*made_with) if made_with else parser)(value)

    return parse


# What typer 0.29 (through pydantic) took as a whole number, and how it said what it did not take:
# "1.0", " 3 ", "1_000" and "+4" are numbers; "2.5", "1e3" and digits beyond ASCII are not.
_WHOLE = re.compile(r"\s*[+-]?[0-9](?:_?[0-9])*(?:\.0*)?\s*")


class WholeNumber(IntRange):
    """An option's whole number, `min` or more, read and refused as typer 0.29 did (its --help
    gives the range, as for any IntRange)."""

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):  # the default
            number = value
        elif isinstance(value, str) and _WHOLE.fullmatch(value):
            number = int(value.strip().split(".")[0])
        else:
            self.fail("Input should be a valid integer, unable to parse string as an integer", param, ctx)
        if self.min is not None and number < self.min:
            self.fail(f"Input should be greater than or equal to {self.min}", param, ctx)
        return number


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rollfilter {__version__}")
        raise typer.Exit()


@typer_app.command(help=HELP, epilog=EXAMPLES, no_args_is_help=False, cls=PanelledCommand)
def parse(
    ctx: typer.Context,
    files: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[FILE]...", help="JSONL input files, read in order; - or none means stdin.", show_default=False
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "-u",
            "--url",
            metavar="URL",
            help="Send every row to this agent URL (/run is appended when it has no path).",
            envvar="ROLLFILTER_URL",
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    endpoint: Annotated[
        list[str] | None,
        typer.Option(
            "-e",
            "--endpoint",
            metavar="NAME=URL",
            help="Where the agent NAME lives; repeat, or give URL,URL, for replicas.",
            show_default=False,
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            "-a",
            "--agent",
            metavar="NAME",
            help="Agent for rows that name none (adds agent_ref); a row's own agent_ref.name wins.",
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help=(
                "Start the built-in demo agent on a free loopback port and send every row to it"
                " (with no FILE at a terminal: the shipped example rows). Not with -u, -e or --head-server."
            ),
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = False,
    concurrency: Annotated[
        int,
        typer.Option(
            "-j",
            "--concurrency",
            metavar="N",
            help="Rows in flight at once (fewer if the open-file limit cannot fit N connections).",
            envvar="ROLLFILTER_CONCURRENCY",
            click_type=WholeNumber(min=1),
            rich_help_panel=PANEL_LIMITS,
        ),
    ] = DEFAULT_CONCURRENCY,
    route: Annotated[
        str | None,
        typer.Option(
            "--route",
            metavar="task|least-outstanding",
            help="Of an agent's replicas: every rollout of a task on one (its prefix cache), load bounded;"
            " or each to the least busy [default: task with -r K > 1, else least-outstanding].",
            show_default=False,
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    affinity_header: Annotated[
        str | None,
        typer.Option(
            "--affinity-header",
            metavar="NAME",
            help="Send header NAME with every /run, one opaque value a task (the same in every run),"
            " for a router that pins sessions (X-Session-ID).",
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    rpm: Annotated[
        list[str] | None,
        typer.Option(
            "--rpm",
            metavar="[AGENT=]N",
            help="Send an agent at most N requests a minute, paced (a bare N: every agent without its own).",
            show_default=False,
            rich_help_panel=PANEL_LIMITS,
        ),
    ] = None,
    tpm: Annotated[
        list[str] | None,
        typer.Option(
            "--tpm",
            metavar="[AGENT=]N",
            help="Send an agent at most N tokens a minute, by its replies' usage so far (as --rpm).",
            show_default=False,
            rich_help_panel=PANEL_LIMITS,
        ),
    ] = None,
    adaptive: Annotated[
        bool,
        typer.Option(
            "--adaptive",
            help="-j becomes a ceiling: each agent's window grows while it keeps up and shrinks on overload.",
            rich_help_panel=PANEL_LIMITS,
        ),
    ] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            "-n",
            "--limit",
            metavar="N",
            help="Take only the first N rows.",
            click_type=WholeNumber(min=0),
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    repeats: Annotated[
        list[str] | None,
        typer.Option(
            "-r",
            "--repeats",
            metavar="K|NAME=K",
            help="Run each row K times, adjacent (the summary gives mean@K and pass@k); NAME=K, repeatable,"
            " for the rows of agent NAME.",
            show_default=False,
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    repeat_seeds: Annotated[
        bool,
        typer.Option(
            "--repeat-seeds",
            help='Each rollout carries "seed": its rollout index in responses_create_params.metadata.extra_body.',
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = False,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "-p",
            "--param",
            metavar="KEY=VALUE",
            help="Set responses_create_params.KEY in every row; VALUE is JSON if it parses, else a string.",
            show_default=False,
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    ordered: Annotated[
        bool,
        typer.Option(
            "-k",
            "--ordered",
            help="Write results in input order (holds about the concurrency in memory).",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = False,
    output: Annotated[
        str | None,
        typer.Option(
            "-o",
            "--output",
            metavar="FILE",
            help="Write results to FILE instead of stdout (a new or empty FILE, unless --resume or --append).",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = None,
    errors: Annotated[
        str | None,
        typer.Option(
            "--errors",
            metavar="FILE",
            help="Append one JSON record per failed row to FILE (default: one line each on stderr).",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics", metavar="FILE", help="Also write the summary to FILE.", rich_help_panel=PANEL_OUTPUTS
        ),
    ] = None,
    aggregate: Annotated[
        str | None,
        typer.Option(
            "--aggregate",
            metavar="FILE",
            help="When the run ends, ask each agent for its /aggregate_metrics; write NeMo Gym's aggregate file.",
            rich_help_panel=PANEL_GYM,
        ),
    ] = None,
    materialized: Annotated[
        str | None,
        typer.Option(
            "--materialized",
            metavar="FILE",
            help="Write every /run body to FILE before the first is sent (the inputs are planned in a first pass).",
            rich_help_panel=PANEL_GYM,
        ),
    ] = None,
    progress_file: Annotated[
        str | None,
        typer.Option(
            "--progress-file",
            metavar="FILE",
            help="Keep FILE holding the number of finished rollouts (replaced at once, best effort).",
            rich_help_panel=PANEL_GYM,
        ),
    ] = None,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            metavar="HOST:PORT",
            help="Serve the run's metrics at http://HOST:PORT/metrics for Prometheus while it goes"
            " (no authentication: 127.0.0.1 keeps them on this machine).",
            rich_help_panel=PANEL_OBSERVE,
        ),
    ] = None,
    prometheus_file: Annotated[
        str | None,
        typer.Option(
            "--prometheus-file",
            metavar="FILE",
            help="Keep FILE holding the same metrics for node_exporter's textfile collector (replaced at once).",
            rich_help_panel=PANEL_OBSERVE,
        ),
    ] = None,
    control: Annotated[
        str | None,
        typer.Option(
            "--control",
            metavar="SOCKET",
            help="Listen on the Unix socket SOCKET (mode 0600) for commands that steer the run while it goes:"
            " pause, resume, drain [SECONDS], concurrency N, rpm [AGENT=]N|off, tpm [AGENT=]N|off,"
            " version V, status; one JSON line answers each.",
            rich_help_panel=PANEL_OBSERVE,
        ),
    ] = None,
    policy_version: Annotated[
        int | None,
        typer.Option(
            "--policy-version",
            metavar="V",
            help="Stamp each result with _rf_policy_version: the policy version (from V, changed by --control's"
            " version) when its /run was sent and when it ended.",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    max_staleness: Annotated[
        int | None,
        typer.Option(
            "--max-staleness",
            metavar="K",
            min=0,
            help="With --groups and --batch-groups B: send group i (counted as groups are admitted) only once"
            " the policy version v has i < (v - V + K + 1) * B, V the first version (--policy-version, 0 if not"
            " given); the rows wait, none is discarded, and groups come out in that order.",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    batch_groups: Annotated[
        int | None,
        typer.Option(
            "--batch-groups",
            metavar="B",
            min=1,
            help="The groups a trainer takes a step (--max-staleness).",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    gym_layout: Annotated[
        bool,
        typer.Option(
            "--gym-layout",
            help="With -o OUT.jsonl: also write OUT_materialized_inputs.jsonl, OUT_failures.jsonl,"
            " OUT_aggregate_metrics.json and OUT_progress, as ng_collect_rollouts does.",
            rich_help_panel=PANEL_GYM,
        ),
    ] = False,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            metavar="N",
            help=(
                "Retries per row for connection failures, timeouts and --retry-on statuses"
                " (a Retry-After wait is capped at 120 s)."
            ),
            envvar="ROLLFILTER_RETRIES",
            click_type=WholeNumber(min=0),
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = DEFAULT_RETRIES,
    retry_budget: Annotated[
        float | None,
        typer.Option(
            "--retry-budget",
            metavar="R|off",
            parser=parsed_by("retry_budget"),
            help=(
                "Retries an agent may receive per row sent to it, beyond a reserve of 10"
                " (an outage costs about 1+R requests a row); off: every failure gets its retries."
            ),
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = DEFAULT_RATIO,
    retry_on: Annotated[
        frozenset[int],
        typer.Option(
            "--retry-on",
            metavar="STATUSES",
            parser=parsed_by("statuses"),
            help="Comma list of HTTP statuses to retry. A retried /run may replay an episode the agent did run.",
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = ",".join(map(str, sorted(DEFAULT_RETRY_STATUSES))),  # type: ignore[assignment]  # the text it parses
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            parser=parsed_by("positive", "--timeout", "seconds"),
            help="Bound on one attempt and on the wait before the next. Default: none, episodes can take an hour.",
            envvar="ROLLFILTER_TIMEOUT",
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = None,
    connect_timeout: Annotated[
        float,
        typer.Option(
            "--connect-timeout",
            metavar="SECONDS",
            parser=parsed_by("positive", "--connect-timeout", "seconds"),
            help="Bound on connecting to an agent.",
            envvar="ROLLFILTER_CONNECT_TIMEOUT",
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = DEFAULT_CONNECT_TIMEOUT,
    max_failures: Annotated[
        Any,  # a FailureLimit (config.py, which --help does not load)
        typer.Option(
            "--max-failures",
            metavar="N|P%",
            help="Stop once N rows (or P% of ended rows) have failed; exit 1.",
            parser=parsed_by("failure_limit"),
            show_default=False,
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            metavar="[AGENT=]IN,OUT[,CACHED]",
            help="USD per million input, output and cached-input tokens (of response.usage); repeatable.",
            rich_help_panel=PANEL_LIMITS,
        ),
    ] = None,
    prices: Annotated[
        str | None,
        typer.Option(
            "--prices",
            metavar="FILE",
            help="A YAML or JSON map of agent names (or _default) to prices.",
            rich_help_panel=PANEL_LIMITS,
        ),
    ] = None,
    max_cost: Annotated[
        float | None,
        typer.Option(
            "--max-cost",
            metavar="USD",
            help="Stop once the run has spent USD (needs prices); exit 1.",
            parser=parsed_by("positive", "--max-cost", "USD"),
            rich_help_panel=PANEL_LIMITS,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="With -o FILE: skip the (task, rollout) pairs already in FILE; retry those failed in --errors FILE."
            " Refused when FILE's run record names other inputs or options.",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = False,
    max_attempts: Annotated[
        int | None,
        typer.Option(
            "--max-attempts",
            metavar="N",
            help="--resume gives up a pair after N failed attempts [default: $NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, or 3].",
            click_type=WholeNumber(min=1),
            show_default=False,
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = None,
    append: Annotated[
        bool,
        typer.Option(
            "--append",
            help="Let -o and --errors add to files that hold lines of another run.",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace -o (its run record too), --errors and --dropped files that hold another run's lines.",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = False,
    wait_lock: Annotated[
        bool,
        typer.Option(
            "--wait-lock",
            help="Wait for another run that holds -o, --errors or --per-task to end, instead of exiting 75.",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = False,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "-H",
            "--header",
            metavar="'NAME: VALUE'",
            help="Send this header with every request, in place of rollfilter's own of that name; an empty"
            " value removes ours (never printed).",
            show_default=False,
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Do not verify TLS certificates.", rich_help_panel=PANEL_AGENTS)
    ] = False,
    cacert: Annotated[
        str | None,
        typer.Option(
            "--cacert",
            metavar="FILE",
            help="Trust the CA certificates in this PEM file instead of the system's (SSL_CERT_FILE does too).",
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    cross_origin_redirects: Annotated[
        bool,
        typer.Option(
            "--cross-origin-redirects",
            help="Follow 307/308 redirects to another scheme, host or port too (without credentials).",
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = False,
    head_server: Annotated[
        str | None,
        typer.Option(
            "--head-server",
            metavar="URL",
            help="Resolve agent names through this NeMo Gym head server (-e NAME=URL wins over it).",
            envvar="ROLLFILTER_HEAD_SERVER",
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    proxy: Annotated[
        str | None,
        typer.Option(
            "--proxy",
            metavar="URL",
            help="Send through this HTTP proxy (HTTP_PROXY and HTTPS_PROXY are not read).",
            envvar="ROLLFILTER_PROXY",
            rich_help_panel=PANEL_AGENTS,
        ),
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            metavar="I/N|auto",
            help="Keep only the tasks whose index mod N is I (repeats stay together); auto: this Slurm array"
            " task's I/N. With --resume, the shard -o was made with.",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    pass_threshold: Annotated[
        float,
        typer.Option(
            "--pass-threshold",
            metavar="R",
            help="A rollout counts as correct for pass@k when reward >= R.",
            parser=parsed_by("finite", "--pass-threshold"),
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = 1.0,
    per_task: Annotated[
        str | None,
        typer.Option(
            "--per-task",
            metavar="FILE",
            help="With -r K > 1: append one JSON line per finished task to FILE.",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    summarize: Annotated[
        bool,
        typer.Option(
            "--summarize",
            help="Send nothing: read result lines (and errors records) from FILEs or stdin, print their summary.",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = False,
    reverify: Annotated[
        str | None,
        typer.Option(
            "--reverify",
            metavar="MATERIALIZED",
            help="Re-score the rollouts in FILEs or stdin at their resources servers' /verify, each joined"
            " with its body in NeMo Gym's materialized inputs file MATERIALIZED; no agent is run.",
            show_default=False,
            rich_help_panel=PANEL_GYM,
        ),
    ] = None,
    verifier: Annotated[
        list[str] | None,
        typer.Option(
            "--verifier",
            metavar="NAME=URL",
            help="With --reverify: the resources server that verifies the rollouts of agent NAME; repeat.",
            show_default=False,
            rich_help_panel=PANEL_GYM,
        ),
    ] = None,
    judge_failed_only: Annotated[
        bool,
        typer.Option(
            "--judge-failed-only",
            help="With --reverify: re-score only the lines whose _ng_failure_class is judge_failed.",
            rich_help_panel=PANEL_GYM,
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="With --reverify: re-score at resources servers whose /reverify_mode is not stateless too.",
            rich_help_panel=PANEL_GYM,
        ),
    ] = False,
    compare: Annotated[
        list[str] | None,
        typer.Option(
            "--compare",
            metavar="BASELINE",
            help="With --summarize: compare the results with BASELINE's (result files of another run), task by"
            " task; repeatable.",
        ),
    ] = None,
    max_line_bytes: Annotated[
        int,
        typer.Option(
            "--max-line-bytes",
            metavar="N",
            help="Refuse input lines longer than N bytes (each counts as a failed row).",
            click_type=WholeNumber(min=1),
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = DEFAULT_MAX_LINE_BYTES,
    max_reply_bytes: Annotated[
        int,
        typer.Option(
            "--max-reply-bytes",
            metavar="N",
            help="Fail a row whose reply body is longer than N bytes, as received or decoded (bad_response).",
            click_type=WholeNumber(min=1),
            rich_help_panel=PANEL_FAULTS,
        ),
    ] = DEFAULT_MAX_REPLY_BYTES,
    groups: Annotated[
        bool,
        typer.Option(
            "--groups",
            help="With -r K > 1: write a row's K rollouts together, in rollout order, once all K have ended;"
            " a group with a failed rollout is not written (see --keep-incomplete).",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = False,
    keep_incomplete: Annotated[
        bool,
        typer.Option(
            "--keep-incomplete",
            help="Write the finished rollouts of a group whose other rollouts failed.",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = False,
    drop_uniform: Annotated[
        bool,
        typer.Option(
            "--drop-uniform",
            help="Drop a group whose --group-field is the same in every rollout (no gradient); implies --groups.",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = False,
    group_field: Annotated[
        str | None,
        typer.Option(
            "--group-field",
            metavar="FIELD",
            help="The numeric result field --drop-uniform compares, or a dotted path such as "
            "reward_components.NAME [default: reward].",
            show_default=False,
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    dropped: Annotated[
        str | None,
        typer.Option(
            "--dropped",
            metavar="FILE",
            help="Write the rollouts of groups not written to FILE, each stamped with dropped_because.",
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    target_groups: Annotated[
        int | None,
        typer.Option(
            "--target-groups",
            metavar="N",
            help="Stop once N groups are written (the rollouts in flight are cancelled, no more rows sent); exit 0.",
            click_type=WholeNumber(min=1),
            rich_help_panel=PANEL_REPEATS,
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Send nothing: print each row as it would be sent, its route on stderr.",
            rich_help_panel=PANEL_OUTPUTS,
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "-v",
            "--verbose",
            help="One line per row event on stderr: sent, retried, finished, failed.",
            rich_help_panel=PANEL_OBSERVE,
        ),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress",
            help="Force the live progress display on stderr on or off (default: on when stderr is a terminal);"
            " where stderr is no terminal, --progress writes a plain status line every 1% or minute.",
            show_default=False,
            rich_help_panel=PANEL_OBSERVE,
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "-q",
            "--quiet",
            help="Print no summary and no progress line on stderr (--metrics FILE still gets the summary).",
            rich_help_panel=PANEL_OBSERVE,
        ),
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> Execute:
    """The run the command line asks for, ready to start; a RollfilterError if it cannot be."""
    from rollfilter.cli import parsers
    from rollfilter.cli.command import CommandConfig
    from rollfilter.config import Config, Cost, Rates, Repeats, Retries, Routing, Timeouts, Tls, Wire

    environment = environment_of(ctx.obj)
    if demo:
        check_demo_alone(ctx, url=url, endpoints=endpoint, head_server=head_server)
        url = head_server = None  # defaults from the environment: --demo replaces them
    default_repeats, repeats_by_agent = parsers.repeats(repeats or ())
    materialized, errors, aggregate, progress_file = parsers.gym_files(
        gym_layout, output, (materialized, errors, aggregate, progress_file), summarize=summarize
    )
    grouping = parsers.groups(
        groups,
        keep_incomplete=keep_incomplete,
        drop_uniform=drop_uniform,
        field=group_field,
        target=target_groups,
        max_staleness=max_staleness,
        batch=batch_groups,
        refused={"--dry-run": dry_run, option_as_typed(ctx, "ordered"): ordered},
    )
    config = Config(
        url=parsers.url(url) if url else None,
        **targets(ctx, endpoint, verifier, reverify, judge_failed_only, force),
        agent=agent,
        concurrency=concurrency,
        adaptive=adaptive,
        limit=limit,
        repeats=Repeats(default_repeats, repeats_by_agent, repeat_seeds),
        groups=grouping,
        policy_version=parsers.policy_version(policy_version),
        params=tuple(parsers.param(p) for p in param or ()),
        retries=Retries(count=retries, budget=retry_budget, statuses=retry_on),
        timeout=Timeouts(attempt=timeout, connect=connect_timeout),
        tls=Tls(parsers.cacert(cacert), insecure=insecure),
        max_failures=parsers.failure_limit(max_failures),
        cost=Cost(parsers.prices(price or (), prices), max_cost),
        headers=tuple(parsers.header(h) for h in header or ()),
        shard=parsers.shard(shard, environment.variables),
        pass_threshold=pass_threshold,
        head_server=parsers.service_url("--head-server")(head_server) if head_server else None,
        wire=Wire(
            parsers.service_url("--proxy", ("http", "https", "socks5"))(proxy) if proxy else None,
            cross_origin_redirects,
            max_reply_bytes,
        ),
        rates=Rates(**parsers.rates(rpm or (), tpm or ())),
        routing=Routing(parsers.route(route), parsers.affinity_header(affinity_header, header or ())),
        aggregate=aggregate is not None,  # --aggregate FILE and --gym-layout ask the agents for it
    )
    command = CommandConfig(
        config,
        inputs=tuple(files) if files else ("-",),
        ordered=ordered,
        output=output,
        errors_file=errors,
        metrics_file=metrics,
        per_task_file=per_task,
        aggregate_file=aggregate,
        materialized_file=None if reverify else materialized,  # the file re-scoring reads is never written
        progress_file=progress_file,
        resume=resume,
        append=append,
        overwrite=overwrite,
        max_attempts=parsers.max_attempts(max_attempts, environment.variables),
        max_line_bytes=max_line_bytes,
        shard_auto=shard == parsers.SHARD_AUTO,
        wait_lock=wait_lock,
        dropped_file=dropped,
        control_socket=control,
        compare_files=tuple(compare or ()),
        **parsers.prometheus(prometheus, prometheus_file),
        quiet=quiet,
        progress=progress,
        verbose=verbose,
        dry_run=dry_run,
    )
    return chosen(ctx, command, demo=demo, summarize=summarize)


def chosen(ctx: typer.Context, config: "CommandConfig", *, demo: bool, summarize: bool) -> Execute:
    """The run or the --summarize that `config` asks for, its inputs settled."""
    environment = environment_of(ctx.obj)
    if config.inputs == ("-",) and environment.stdin_is_terminal:
        config = from_the_terminal(config, environment, demo=demo, summarize=summarize)
    if summarize:
        check_summarize_outputs(ctx)
        return summarizing(config, environment)
    return running(config, environment, demo=demo)


def targets(ctx: typer.Context, *given: Any) -> dict[str, Any]:
    """Config's endpoints and reverify from -e, --verifier, --reverify, --judge-failed-only and
    --force (`given`, in that order), refused beside --demo's, --summarize's or --materialized's
    values as the command line gave them."""
    from rollfilter.cli import parsers

    options = {name: ctx.params.get(name) for name in ("demo", "summarize", "materialized")}
    return parsers.targets(*given, options["demo"], options["summarize"], options["materialized"])


def running(config: "CommandConfig", environment: Environment, *, demo: bool) -> Execute:
    """The run `config` asks for, on `environment`'s streams, with the demo agent's default options
    when `demo`."""
    import dataclasses

    if config.compare_files:
        raise UsageError("--compare compares result files: give it with --summarize")
    groups = config.config.groups
    if groups is not None and groups.max_staleness is not None and config.control_socket is None:
        # Only the control raises the version (the Python API's program does it itself): without
        # it, the run would send the groups the first version admits, then wait for ever.
        raise UsageError(
            "--max-staleness needs --control SOCKET: the groups past the bound wait for a new policy"
            " version, which only the control's version command gives"
        )
    from rollfilter.cli.run import run

    if demo:
        from rollfilter.demo import DemoOptions

        config = dataclasses.replace(config, demo=DemoOptions())
    return lambda stops: run(config, stops=stops, environment=environment)


def summarizing(config: "CommandConfig", environment: Environment) -> Execute:
    from rollfilter.cli.summarize import summarize

    return lambda stops: summarize(config, environment=environment)


def from_the_terminal(
    config: "CommandConfig", environment: Environment, *, demo: bool, summarize: bool
) -> "CommandConfig":
    """The run of a command typed at a terminal with no input: `rollfilter --demo` shows the whole
    job with no setup at all (the example rows); anything else says it reads the terminal."""
    import dataclasses

    if demo and not summarize:
        say(f"--demo with no input: running the example rows in {EXAMPLE_ROWS}", environment.stderr)
        return dataclasses.replace(config, inputs=(EXAMPLE_ROWS,))
    what = "result lines" if summarize else "rows"
    say(f"reading {what} from the terminal (give FILE, or pipe them in; Ctrl-D ends)", environment.stderr)
    return config


def check_demo_alone(
    ctx: typer.Context, *, url: str | None, endpoints: list[str] | None, head_server: str | None
) -> None:
    """UsageError when the command line names an agent beside --demo, which starts its own.
    ROLLFILTER_URL and ROLLFILTER_HEAD_SERVER are only defaults: --demo replaces them."""

    def given(name: str, value: object) -> bool:
        source = ctx.get_parameter_source(name)
        return bool(value) and (source is None or source.name != "ENVIRONMENT")

    named = [
        flag
        for flag, name, value in (
            ("-u", "url", url),
            ("-e", "endpoint", endpoints),
            ("--head-server", "head_server", head_server),
        )
        if given(name, value)
    ]
    if named:
        raise UsageError(f"--demo starts its own agent: it cannot be combined with {' or '.join(named)}")


def option_as_typed(ctx: typer.Context, name: str) -> str:
    """The option of parameter `name` as the command line spelled it (`--ordered`, or `-k`), for
    a message that names it: its last spelling given whole, else its first name."""
    params = [param for param in ctx.command.params if param.name == name]
    opts: list[str] = list(params[0].opts) if params else [name]
    words: list[str] = ctx.obj.get("argv", []) if isinstance(ctx.obj, dict) else []
    for word in reversed(words[: words.index("--")] if "--" in words else words):
        spelled = word.partition("=")[0]
        if spelled in opts:
            return spelled
    return opts[0]


# What --summarize writes: its summary on standard output, --metrics, --aggregate and --per-task.
NOT_SUMMARIZED = (
    *("output", "errors", "materialized", "progress_file", "resume", "append", "overwrite", "wait_lock", "dry_run"),
    *("prometheus", "prometheus_file", "control", "policy_version", "max_staleness", "batch_groups"),
    *("groups", "keep_incomplete", "drop_uniform", "group_field", "dropped", "target_groups"),
)


def check_summarize_outputs(ctx: typer.Context) -> None:
    """UsageError for an option --summarize would leave unused: it sends nothing and writes no rollout."""
    sources = {
        param.opts[-1]: ctx.get_parameter_source(param.name or "")
        for param in ctx.command.params
        if param.name in NOT_SUMMARIZED
    }
    given = [option for option, source in sources.items() if source is not None and source.name != "DEFAULT"]
    if given:
        raise UsageError(
            f"--summarize writes its summary to standard output, --metrics, --aggregate and --per-task:"
            f" {', '.join(given)} {'is' if len(given) == 1 else 'are'} not for it"
        )
