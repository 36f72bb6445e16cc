"""The command line's options as typer takes them: made from their declarations
(`cli/definition.py`), each option's text parsed by its own parser (`cli/parsers.py`), which
names the option in what it refuses, into a `Config` and a `CommandConfig`, then run.

Declaring the options is all that --help needs, and the command declares them before it knows
whether it will run: this module imports typer and constants only. The parsers, the library's
`Config` and the run (trio, httpx) are imported in `parse`, once the options are to be used.
"""

# No `from __future__ import annotations`: typer resolves the command's annotations, which are
# made here as objects (`SIGNATURE`), and as strings it would evaluate them again at every read.
import functools
import inspect
import re
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer._click.types import IntRange
from typer.core import TyperCommand  # typer's own click (0.28), whose ranges --help describes

from rollfilter._version import __version__
from rollfilter.cli.definition import (
    EXAMPLE_ROWS,
    EXAMPLES,
    FILES_HELP,
    HELP,
    OPTIONS,
    PANEL_OTHER,
    PANELS,
    OptionSpec,
)
from rollfilter.cli.environment import Environment, of_process
from rollfilter.cli.messages import say
from rollfilter.errors import UsageError

if TYPE_CHECKING:
    from rollfilter.cli.command import CommandConfig
    from rollfilter.config import Config, Groups

# What `parse` gives `main` to execute: the run, given the stop signals to attach to
# (`cli.signals.StopSignals`), which ends with a `cli.statuses.RunEnd` (neither named here:
# typer resolves this annotation, and those modules load the engine).
Execute = Callable[[Any], Awaitable[object]]
HELP_MAX_WIDTH = 160

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


def parameter_of(spec: OptionSpec) -> inspect.Parameter:
    """The option `spec` as typer reads one: a keyword parameter, its type annotated with its
    `typer.Option`."""
    read: dict[str, Any] = {}  # typer takes a click type or a parser, not both
    if spec.whole is not None:
        read["click_type"] = WholeNumber(min=spec.whole)
    elif spec.parser:
        read["parser"] = parsed_by(*spec.parser)
    info = typer.Option(
        *spec.flags,
        **read,
        help=spec.help,
        metavar=spec.metavar,
        envvar=spec.envvar,
        show_default=spec.show_default,
        min=spec.least,
        rich_help_panel=spec.panel,
    )
    return _keyword(spec.name, spec.kind, info, spec.default)


def _keyword(name: str, kind: Any, info: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info])


_VERSION = typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
_FILES = typer.Argument(metavar="[FILE]...", help=FILES_HELP, show_default=False)


# The command's parameters, as typer reads a function's: the context, the files, the options of
# the table, and --version (answered as it is read).
SIGNATURE = inspect.Signature(
    [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        _keyword("files", list[str] | None, _FILES, None),
        *map(parameter_of, OPTIONS),
        _keyword("version", bool, _VERSION, False),
    ],
    return_annotation=Execute,
)


def parse(ctx: typer.Context, **given: Any) -> Execute:
    """The run the command line asks for, ready to start; a RollfilterError if it cannot be.
    `given` holds every option's value, as typer gives it, by its name (`SIGNATURE`)."""
    if given["view"]:
        return viewing(ctx, command_of(ctx, given), given)
    check_view_alone(ctx)
    return chosen(ctx, command_of(ctx, given), demo=given["demo"], summarize=given["summarize"])


parse.__signature__ = SIGNATURE  # type: ignore[attr-defined]
typer_app.command(help=HELP, epilog=EXAMPLES, no_args_is_help=False, cls=PanelledCommand)(parse)


def settings_of(given: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The values of the options that set a field alone (`OptionSpec.sets`), by the class that
    has it, a part's fields in a mapping of their own: {"Config": {"retries": {"count": 3}}}."""
    found: dict[str, dict[str, Any]] = {"Config": {}, "CommandConfig": {}}
    for spec in OPTIONS:
        if spec.sets is not None:
            owner, *parts, field = spec.sets.split(".")
            place = found[owner]
            for part in parts:
                place = place.setdefault(part, {})
            place[field] = given[spec.name]
    return found


def command_of(ctx: typer.Context, given: dict[str, Any]) -> "CommandConfig":
    """The command-line run the options `given` ask for."""
    from rollfilter.cli import parsers
    from rollfilter.cli.command import CommandConfig

    environment = environment_of(ctx.obj)
    if given["demo"]:
        check_demo_alone(ctx, url=given["url"], endpoints=given["endpoint"], head_server=given["head_server"])
        given = {**given, "url": None, "head_server": None}  # defaults from the environment: --demo replaces them
    settings = settings_of(given)
    command = settings["CommandConfig"]
    gym = ("materialized_file", "errors_file", "aggregate_file", "progress_file")
    named = parsers.gym_files(
        given["gym_layout"], given["output"], tuple(command[name] for name in gym), summarize=given["summarize"]
    )
    command.update(zip(gym, named, strict=True))
    # The agents are asked for their aggregate when there is a file to write it to (--gym-layout's too).
    config = config_of(ctx, given, settings["Config"], aggregate=command["aggregate_file"] is not None)
    if given["reverify"]:
        command["materialized_file"] = None  # the file re-scoring reads is never written
    return CommandConfig(
        config,
        **command,
        inputs=tuple(given["files"]) if given["files"] else ("-",),
        max_attempts=parsers.max_attempts(given["max_attempts"], environment.variables),
        shard_auto=given["shard"] == parsers.SHARD_AUTO,
        compare_files=tuple(given["compare"] or ()),
        argv=tuple(ctx.obj.get("argv", ())) if isinstance(ctx.obj, dict) else (),
        **parsers.prometheus(given["prometheus"], given["prometheus_file"]),
    )


def config_of(ctx: typer.Context, given: dict[str, Any], fields: dict[str, Any], *, aggregate: bool) -> "Config":
    """The Config the options `given` ask for: `fields`, those the options set alone (a part's
    as a mapping), with those that several options make together."""
    from rollfilter.cli import parsers
    from rollfilter.config import Config, Cost, Health, Rates, Repeats, Retries, Routing, Timeouts, Tls, Wire

    def part(name: str) -> dict[str, Any]:
        settings: dict[str, Any] = fields.setdefault(name, {})
        return settings

    count, by_agent = parsers.repeats(given["repeats"] or ())
    part("repeats").update(count=count, by_agent=by_agent)
    part("cost")["prices"] = parsers.prices(given["price"] or (), given["prices"])
    part("tls")["cacert"] = parsers.cacert(given["cacert"])
    proxy = given["proxy"]
    part("wire")["proxy"] = parsers.service_url("--proxy", ("http", "https", "socks5"))(proxy) if proxy else None
    header = given["header"] or ()
    part("routing").update(
        policy=parsers.route(given["route"]), affinity_header=parsers.affinity_header(given["affinity_header"], header)
    )
    part("rates").update(parsers.rates(given["rpm"] or (), given["tpm"] or ()))
    head_server = given["head_server"]
    fields.update(
        url=parsers.url(given["url"]) if given["url"] else None,
        **targets(ctx, given),
        params=tuple(parsers.param(p) for p in given["param"] or ()),
        headers=tuple(parsers.header(h) for h in header),
        shard=parsers.shard(given["shard"], environment_of(ctx.obj).variables),
        head_server=parsers.service_url("--head-server")(head_server) if head_server else None,
        aggregate=aggregate,
        groups=groups_of(ctx, given),
        policy_version=parsers.policy_version(given["policy_version"]),
        trackers=parsers.trackers(
            mlflow=given["mlflow"],
            experiment=given["experiment"],
            wandb=given["wandb"],
            run_name=given["run_name"],
            rollouts=given["track_rollouts"],
            output=given["output"],
        ),
    )
    parts = {"repeats": Repeats, "retries": Retries, "timeout": Timeouts, "tls": Tls, "wire": Wire, "cost": Cost}
    parts |= {"routing": Routing, "rates": Rates, "health": Health}
    return Config(**{name: parts[name](**value) if name in parts else value for name, value in fields.items()})


def groups_of(ctx: typer.Context, given: dict[str, Any]) -> "Groups | None":
    """Config.groups from the options of groups (a `Groups`, or None)."""
    from rollfilter.cli import parsers

    return parsers.groups(
        given["groups"],
        keep_incomplete=given["keep_incomplete"],
        drop_uniform=given["drop_uniform"],
        field=given["group_field"],
        target=given["target_groups"],
        max_staleness=given["max_staleness"],
        batch=given["batch_groups"],
        refused={"--dry-run": given["dry_run"], option_as_typed(ctx, "ordered"): given["ordered"]},
    )


def chosen(ctx: typer.Context, config: "CommandConfig", *, demo: bool, summarize: bool) -> Execute:
    """The run or the --summarize that `config` asks for, its inputs settled."""
    environment = environment_of(ctx.obj)
    if config.inputs == ("-",) and environment.stdin_is_terminal:
        config = from_the_terminal(config, environment, demo=demo, summarize=summarize)
    if summarize:
        check_summarize_outputs(ctx)
        return summarizing(config, environment)
    return running(config, environment, demo=demo)


def targets(ctx: typer.Context, given: dict[str, Any]) -> dict[str, Any]:
    """Config's endpoints and reverify from -e, --verifier, --reverify, --judge-failed-only and
    --force, refused beside --demo's, --summarize's or --materialized's values as the command line
    gave them."""
    from rollfilter.cli import parsers

    options = {name: ctx.params.get(name) for name in ("demo", "summarize", "materialized")}
    texts = (given[name] for name in ("endpoint", "verifier", "reverify", "judge_failed_only", "force"))
    return parsers.targets(*texts, options["demo"], options["summarize"], options["materialized"])


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
    from rollfilter.cli.collect import collect

    if demo:
        from rollfilter.demo import DemoOptions

        config = dataclasses.replace(config, demo=DemoOptions())
    return lambda stops: collect(config, stops=stops, environment=environment)


# The options of --view, and those it cannot take (it sends nothing and writes no rollout).
VIEW_OPTIONS = ("listen", "html", "html_rollouts")
NOT_VIEWED = ("summarize", "demo", "output", "dry_run", "resume", "metrics", "aggregate", "per_task")


def given_options(ctx: typer.Context, names: tuple[str, ...]) -> list[str]:
    """The options of `names` that the command line (or the environment) gave, as spelled."""
    return [
        param.opts[-1]
        for param in ctx.command.params
        if param.name in names
        and (source := ctx.get_parameter_source(param.name or "")) is not None
        and source.name != "DEFAULT"
    ]


def check_view_alone(ctx: typer.Context) -> None:
    given = given_options(ctx, VIEW_OPTIONS)
    if given:
        raise UsageError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for --view")


def viewing(ctx: typer.Context, config: "CommandConfig", given: dict[str, Any]) -> Execute:
    """--view of `config`'s files (`cli/view.py`), with the view's own options of `given`."""
    from rollfilter.cli.view import ViewOptions, listen_address, view

    refused = given_options(ctx, NOT_VIEWED)
    if refused:
        raise UsageError(f"--view sends nothing and writes no rollout: {', '.join(refused)} is not for it")
    options = ViewOptions(listen_address(given["listen"]), given["html"], given["html_rollouts"])
    environment = environment_of(ctx.obj)
    return lambda stops: view(config, options, environment=environment)


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
