"""The command's options, declared as data (as httpie's `cli/definition.py`): what --help shows
of each, how typer reads its text, and the field it sets, if it sets one alone.

`cli/options.py` makes the typer command of this table and puts together what the options
give; an option that sets one field (`sets`) needs nothing more there. This module imports
constants only: declaring the options is all that --help needs.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from rollfilter.defaults import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_RATIO,
    DEFAULT_RETRIES,
    DEFAULT_RETRY_STATUSES,
)
from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES

# The --help panels, in the order they are shown (drawn by options.PanelledCommand).
PANEL_AGENTS = "Agents and routing"
PANEL_REPEATS = "Repeats and groups"
PANEL_OUTPUTS = "Outputs"
PANEL_FAULTS = "Faults and retries"
PANEL_LIMITS = "Limits and cost"
PANEL_GYM = "NeMo Gym"
PANEL_OBSERVE = "Observability"
PANELS = (PANEL_AGENTS, PANEL_REPEATS, PANEL_OUTPUTS, PANEL_FAULTS, PANEL_LIMITS, PANEL_GYM, PANEL_OBSERVE)
PANEL_OTHER = "Other options"
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
FILES_HELP = "JSONL input files, read in order; - or none means stdin."


# A NamedTuple, not a dataclass: the class is made at every start, and a dataclass takes longer to
# make (docs/benchmarks.md, start-up).
class OptionSpec(NamedTuple):
    """One option: its spellings (`flags`), what --help says of it, the type typer converts its
    text to (`kind`) and its `default`, and the field it sets alone (`sets`: "Config.limit",
    "Config.retries.count", "CommandConfig.ordered"), as typer gives it; None when the command
    puts it together with others."""

    flags: tuple[str, ...]
    help: str
    panel: str | None = None  # None: "Other options"
    metavar: str | None = None
    kind: Any = bool
    default: Any = False
    sets: str | None = None
    envvar: str | None = None
    whole: int | None = None  # a whole number of at least this, read as options.WholeNumber reads it
    least: int | None = None  # click's own range check (an IntRange)
    parser: tuple[str, ...] = ()  # the parser of cli/parsers.py that reads the text, and what it is made with
    show_default: bool = True

    @property
    def name(self) -> str:
        """The parameter's name, typer's (`--progress/--no-progress`: progress)."""
        return self.flags[-1].split("/")[0].lstrip("-").replace("-", "_")


def option(*flags: str, help: str, metavar: str | None = None, many: bool = False, **settings: Any) -> OptionSpec:
    """An option spelled `flags`: a flag (False unless given) without a `metavar`, a text (None
    unless given) with one, a list of texts with `many`; `settings` as OptionSpec's."""
    kind, default = (list[str] | None, None) if many else (str | None, None) if metavar else (bool, False)
    return OptionSpec(flags, help, metavar=metavar, **{"kind": kind, "default": default, **settings})


_RETRY_STATUSES = ",".join(map(str, sorted(DEFAULT_RETRY_STATUSES)))  # --retry-on's default: the text it parses
# In the order --help lists them within each panel.
# fmt: off
OPTIONS = (
    option("-u", "--url", metavar="URL", envvar="ROLLFILTER_URL", panel=PANEL_AGENTS,
           help="Send every row to this agent URL (/run is appended when its path is empty or ends in /)."),
    option("-e", "--endpoint", metavar="NAME=URL", many=True, show_default=False, panel=PANEL_AGENTS,
           help="Where the agent NAME lives; repeat, or give URL,URL, for replicas."),
    option("-a", "--agent", metavar="NAME", panel=PANEL_AGENTS, sets="Config.agent",
           help="Agent for rows that name none (adds agent_ref); a row's own agent_ref.name wins."),
    option("--demo", panel=PANEL_AGENTS,
           help="Start the built-in demo agent on a free loopback port and send every row to it (with no FILE at a"
           " terminal: the shipped example rows). Not with -u, -e or --head-server."),
    option("-j", "--concurrency", metavar="N", kind=int, default=DEFAULT_CONCURRENCY, whole=1,
           envvar="ROLLFILTER_CONCURRENCY", panel=PANEL_LIMITS, sets="Config.concurrency",
           help="Rows in flight at once (fewer if the open-file limit cannot fit N connections)."),
    option("--route", metavar="task|least-outstanding", show_default=False, panel=PANEL_AGENTS,
           help="Of an agent's replicas: every rollout of a task on one (its prefix cache), load bounded; or each to"
           " the least busy [default: task with -r K > 1, else least-outstanding]."),
    option("--affinity-header", metavar="NAME", panel=PANEL_AGENTS,
           help="Send header NAME with every /run, one opaque value a task (the same in every run), for a router that"
           " pins sessions (X-Session-ID)."),
    option("--rpm", metavar="[AGENT=]N", many=True, show_default=False, panel=PANEL_LIMITS,
           help="Send an agent at most N requests a minute, paced (a bare N: every agent without its own)."),
    option("--tpm", metavar="[AGENT=]N", many=True, show_default=False, panel=PANEL_LIMITS,
           help="Send an agent at most N tokens a minute, by its replies' usage so far (as --rpm)."),
    option("--adaptive", panel=PANEL_LIMITS, sets="Config.adaptive",
           help="-j becomes a ceiling: each agent's window grows while it keeps up and shrinks on overload."),
    option("-n", "--limit", metavar="N", kind=int | None, whole=0, panel=PANEL_REPEATS, sets="Config.limit",
           help="Take only the first N rows."),
    option("-r", "--repeats", metavar="K|NAME=K", many=True, show_default=False, panel=PANEL_REPEATS,
           help="Run each row K times, adjacent (the summary gives mean@K and pass@k); NAME=K, repeatable, for the"
           " rows of agent NAME."),
    option("--repeat-seeds", panel=PANEL_REPEATS, sets="Config.repeats.seeds",
           help='Each rollout carries "seed": its rollout index in responses_create_params.metadata.extra_body.'),
    option("-p", "--param", metavar="KEY=VALUE", many=True, show_default=False, panel=PANEL_AGENTS,
           help="Set responses_create_params.KEY in every row; VALUE is JSON if it parses, else a string."),
    option("-k", "--ordered", panel=PANEL_OUTPUTS, sets="CommandConfig.ordered",
           help="Write results in input order (holds about the concurrency in memory)."),
    option("-o", "--output", metavar="FILE", panel=PANEL_OUTPUTS, sets="CommandConfig.output",
           help="Write results to FILE instead of stdout (a new or empty FILE, unless --resume or --append)."),
    option("--errors", metavar="FILE", panel=PANEL_OUTPUTS, sets="CommandConfig.errors_file",
           help="Append one JSON record per failed row to FILE (default: one line each on stderr)."),
    option("--metrics", metavar="FILE", panel=PANEL_OUTPUTS, sets="CommandConfig.metrics_file",
           help="Also write the summary to FILE."),
    option("--aggregate", metavar="FILE", panel=PANEL_GYM, sets="CommandConfig.aggregate_file",
           help="When the run ends, ask each agent for its /aggregate_metrics; write NeMo Gym's aggregate file."),
    option("--materialized", metavar="FILE", panel=PANEL_GYM, sets="CommandConfig.materialized_file",
           help="Write every /run body to FILE before the first is sent (the inputs are planned in a first pass)."),
    option("--progress-file", metavar="FILE", panel=PANEL_GYM, sets="CommandConfig.progress_file",
           help="Keep FILE holding the number of finished rollouts (replaced at once, best effort)."),
    option("--prometheus", metavar="HOST:PORT", panel=PANEL_OBSERVE,
           help="Serve the run's metrics at http://HOST:PORT/metrics for Prometheus while it goes (no authentication:"
           " 127.0.0.1 keeps them on this machine)."),
    option("--prometheus-file", metavar="FILE", panel=PANEL_OBSERVE,
           help="Keep FILE holding the same metrics for node_exporter's textfile collector (replaced at once)."),
    option("--control", metavar="SOCKET", panel=PANEL_OBSERVE, sets="CommandConfig.control_socket",
           help="Listen on the Unix socket SOCKET (mode 0600) for commands that steer the run while it goes: pause,"
           " resume, drain [SECONDS], concurrency N, rpm [AGENT=]N|off, tpm [AGENT=]N|off, version V, status; one"
           " JSON line answers each."),
    option("--mlflow", metavar="TRACKING_URI", panel=PANEL_OBSERVE,
           help="Log the run to MLflow at TRACKING_URI while it goes: params, live metrics, the summary's figures,"
           " summary.json and a sample of results at the end (pip install 'rollfilter[mlflow]')."),
    option("--experiment", metavar="NAME", show_default=False, panel=PANEL_OBSERVE,
           help="With --mlflow: the experiment the run is logged in [default: rollfilter]."),
    option("--wandb", metavar="PROJECT", panel=PANEL_OBSERVE,
           help="Log the run to Weights & Biases project PROJECT as --mlflow does (WANDB_MODE, WANDB_API_KEY,"
           " WANDB_ENTITY and WANDB_DIR are W&B's own; pip install 'rollfilter[wandb]')."),
    option("--run-name", metavar="NAME", show_default=False, panel=PANEL_OBSERVE,
           help="The tracker runs' name [default: the -o file's stem, else a time]."),
    option("--track-rollouts", metavar="N", kind=int | None, whole=0, show_default=False, panel=PANEL_OBSERVE,
           help="The most result lines the tracker runs get, a uniform sample [default: 100]."),
    option("--policy-version", metavar="V", kind=int | None, panel=PANEL_REPEATS,
           help="Stamp each result with _rf_policy_version: the policy version (from V, changed by --control's"
           " version) when its /run was sent and when it ended."),
    option("--max-staleness", metavar="K", kind=int | None, least=0, panel=PANEL_REPEATS,
           help="With --groups and --batch-groups B: send group i (counted as groups are admitted) only once the"
           " policy version v has i < (v - V + K + 1) * B, V the first version (--policy-version, 0 if not given);"
           " the rows wait, none is discarded, and groups come out in that order."),
    option("--batch-groups", metavar="B", kind=int | None, least=1, panel=PANEL_REPEATS,
           help="The groups a trainer takes a step (--max-staleness)."),
    option("--gym-layout", panel=PANEL_GYM,
           help="With -o OUT.jsonl: also write OUT_materialized_inputs.jsonl, OUT_failures.jsonl,"
           " OUT_aggregate_metrics.json and OUT_progress, as ng_collect_rollouts does."),
    option("--retries", metavar="N", kind=int, default=DEFAULT_RETRIES, whole=0, envvar="ROLLFILTER_RETRIES",
           panel=PANEL_FAULTS, sets="Config.retries.count",
           help="Retries per row for connection failures, timeouts and --retry-on statuses (a Retry-After wait is"
           " capped at 120 s)."),
    option("--retry-budget", metavar="R|off", kind=float | None, default=DEFAULT_RATIO, parser=("retry_budget",),
           panel=PANEL_FAULTS, sets="Config.retries.budget",
           help="Retries an agent may receive per row sent to it, beyond a reserve of 10 (an outage costs about 1+R"
           " requests a row); off: every failure gets its retries."),
    option("--retry-on", metavar="STATUSES", kind=frozenset[int], default=_RETRY_STATUSES, parser=("statuses",),
           panel=PANEL_FAULTS, sets="Config.retries.statuses",
           help="Comma list of HTTP statuses to retry. A retried /run may replay an episode the agent did run."),
    option("--timeout", metavar="SECONDS", kind=float | None, parser=("positive", "--timeout", "seconds"),
           envvar="ROLLFILTER_TIMEOUT", panel=PANEL_FAULTS, sets="Config.timeout.attempt",
           help="Bound on one attempt and on the wait before the next. Default: none, episodes can take an hour."),
    option("--connect-timeout", metavar="SECONDS", kind=float, default=DEFAULT_CONNECT_TIMEOUT,
           parser=("positive", "--connect-timeout", "seconds"), envvar="ROLLFILTER_CONNECT_TIMEOUT",
           panel=PANEL_FAULTS, sets="Config.timeout.connect",
           help="Bound on connecting to an agent."),
    # A FailureLimit (config.py, which --help does not load); no limit: None, taken as FailureLimit().
    option("--max-failures", metavar="N|P%", kind=Any, parser=("failure_limit",), show_default=False,
           panel=PANEL_FAULTS, sets="Config.max_failures",
           help="Stop once N rows (or P% of ended rows) have failed; exit 1."),
    # Config.health: what an unhealthy rollout (a result that looks like an outage behind the agent) makes.
    option("--unhealthy", metavar="keep|mask|fail", kind=str, default="keep", parser=("unhealthy",),
           panel=PANEL_FAULTS, sets="Config.health.unhealthy",
           help="What an unhealthy result (empty output, no tokens, a failed response...: docs/health.md) makes: kept"
           " and marked _rf_health; masked, out of every figure as mask_sample; or a failed row, retried."),
    option("--max-unhealthy", metavar="N|P%", kind=Any, parser=("recent_limit", "--max-unhealthy"),
           show_default=False, panel=PANEL_FAULTS, sets="Config.health.max_unhealthy",
           help="Stop once N rollouts (or P% of the last 100 ended) have been unhealthy; exit 1."),
    option("--max-masked", metavar="N|P%", kind=Any, parser=("recent_limit", "--max-masked"),
           show_default=False, panel=PANEL_FAULTS, sets="Config.health.max_masked",
           help="Stop once N rollouts (or P% of the last 100 ended) have been masked (mask_sample); exit 1."),
    option("--price", metavar="[AGENT=]IN,OUT[,CACHED]", many=True, panel=PANEL_LIMITS,
           help="USD per million input, output and cached-input tokens (of response.usage); repeatable."),
    option("--prices", metavar="FILE", panel=PANEL_LIMITS,
           help="A YAML or JSON map of agent names (or _default) to prices."),
    option("--max-cost", metavar="USD", kind=float | None, parser=("positive", "--max-cost", "USD"),
           panel=PANEL_LIMITS, sets="Config.cost.max_usd",
           help="Stop once the run has spent USD (needs prices); exit 1."),
    option("--resume", panel=PANEL_OUTPUTS, sets="CommandConfig.resume",
           help="With -o FILE: skip the (task, rollout) pairs already in FILE; retry those failed in --errors FILE."
           " Refused when FILE's run record names other inputs or options."),
    option("--max-attempts", metavar="N", kind=int | None, whole=1, show_default=False, panel=PANEL_OUTPUTS,
           help="--resume gives up a pair after N failed attempts [default: $NEMO_GYM_MAX_ROLLOUT_ATTEMPTS, or 3]."),
    option("--append", panel=PANEL_OUTPUTS, sets="CommandConfig.append",
           help="Let -o and --errors add to files that hold lines of another run."),
    option("--overwrite", panel=PANEL_OUTPUTS, sets="CommandConfig.overwrite",
           help="Replace -o (its run record too), --errors and --dropped files that hold another run's lines."),
    option("--wait-lock", panel=PANEL_OUTPUTS, sets="CommandConfig.wait_lock",
           help="Wait for another run that holds -o, --errors or --per-task to end, instead of exiting 75."),
    option("-H", "--header", metavar="'NAME: VALUE'", many=True, show_default=False, panel=PANEL_AGENTS,
           help="Send this header with every request, in place of rollfilter's own of that name; an empty value"
           " removes ours (never printed)."),
    option("--insecure", panel=PANEL_AGENTS, sets="Config.tls.insecure",
           help="Do not verify TLS certificates."),
    option("--cacert", metavar="FILE", panel=PANEL_AGENTS,
           help="Trust the CA certificates in this PEM file instead of the system's (SSL_CERT_FILE does too)."),
    option("--cross-origin-redirects", panel=PANEL_AGENTS, sets="Config.wire.cross_origin_redirects",
           help="Follow 307/308 redirects to another scheme, host or port too (without credentials)."),
    option("--head-server", metavar="URL", envvar="ROLLFILTER_HEAD_SERVER", panel=PANEL_AGENTS,
           help="Resolve agent names through this NeMo Gym head server (-e NAME=URL wins over it)."),
    option("--proxy", metavar="URL", envvar="ROLLFILTER_PROXY", panel=PANEL_AGENTS,
           help="Send through this HTTP proxy (HTTP_PROXY and HTTPS_PROXY are not read)."),
    option("--shard", metavar="I/N|auto", panel=PANEL_REPEATS,
           help="Keep only the tasks whose index mod N is I (repeats stay together); auto: this Slurm array task's"
           " I/N. With --resume, the shard -o was made with."),
    option("--pass-threshold", metavar="R", kind=float, default=1.0, parser=("finite", "--pass-threshold"),
           panel=PANEL_REPEATS, sets="Config.repeats.pass_threshold",
           help="A rollout counts as correct for pass@k when reward >= R."),
    option("--per-task", metavar="FILE", panel=PANEL_REPEATS, sets="CommandConfig.per_task_file",
           help="With -r K > 1: append one JSON line per finished task to FILE."),
    option("--summarize", panel=PANEL_OUTPUTS,
           help="Send nothing: read result lines (and errors records) from FILEs or stdin, print their summary."),
    option("--reverify", metavar="MATERIALIZED", show_default=False, panel=PANEL_GYM,
           help="Re-score the rollouts in FILEs or stdin at their resources servers' /verify, each joined with its"
           " body in NeMo Gym's materialized inputs file MATERIALIZED; no agent is run."),
    option("--verifier", metavar="NAME=URL", many=True, show_default=False, panel=PANEL_GYM,
           help="With --reverify: the resources server that verifies the rollouts of agent NAME; repeat."),
    option("--judge-failed-only", panel=PANEL_GYM,
           help="With --reverify: re-score only the lines whose _ng_failure_class is judge_failed."),
    option("--force", panel=PANEL_GYM,
           help="With --reverify: re-score at resources servers whose /reverify_mode is not stateless too."),
    option("--compare", metavar="BASELINE", many=True,
           help="With --summarize or --view: compare the results with BASELINE's (result files of another run), task"
           " by task; repeatable."),
    option("--view", panel=PANEL_OUTPUTS,
           help="Send nothing: serve the rollouts of FILEs (and --errors FILE) in a browser on 127.0.0.1, until"
           " Ctrl-C; with --compare BASELINE, the comparison too. Not standard input."),
    option("--listen", metavar="HOST:PORT", panel=PANEL_OUTPUTS,
           help="With --view: serve on HOST:PORT [default: 127.0.0.1 at a free port]; beyond loopback, every request"
           " must give the token of the printed URL."),
    option("--html", metavar="REPORT.html", panel=PANEL_OUTPUTS,
           help="With --view: write the page to REPORT.html (one file, no script, nothing fetched) and exit."),
    option("--html-rollouts", metavar="N", kind=int, default=2000, whole=1, panel=PANEL_OUTPUTS,
           help="With --html: keep the transcripts of at most N rollouts, a uniform sample (said on the page)."),
    option("--max-line-bytes", metavar="N", kind=int, default=DEFAULT_MAX_LINE_BYTES, whole=1, panel=PANEL_FAULTS,
           sets="CommandConfig.max_line_bytes",
           help="Refuse input lines longer than N bytes (each counts as a failed row)."),
    option("--max-reply-bytes", metavar="N", kind=int, default=DEFAULT_MAX_REPLY_BYTES, whole=1, panel=PANEL_FAULTS,
           sets="Config.wire.max_reply_bytes",
           help="Fail a row whose reply body is longer than N bytes, as received or decoded (bad_response)."),
    option("--groups", panel=PANEL_REPEATS,
           help="With -r K > 1: write a row's K rollouts together, in rollout order, once all K have ended; a group"
           " with a failed rollout is not written (see --keep-incomplete)."),
    option("--keep-incomplete", panel=PANEL_REPEATS,
           help="Write the finished rollouts of a group whose other rollouts failed."),
    option("--drop-uniform", panel=PANEL_REPEATS,
           help="Drop a group whose --group-field is the same in every rollout (no gradient); implies --groups."),
    option("--group-field", metavar="FIELD", show_default=False, panel=PANEL_REPEATS,
           help="The numeric result field --drop-uniform compares, or a dotted path such as reward_components.NAME"
           " [default: reward]."),
    option("--dropped", metavar="FILE", panel=PANEL_REPEATS, sets="CommandConfig.dropped_file",
           help="Write the rollouts of groups not written to FILE, each stamped with dropped_because."),
    option("--target-groups", metavar="N", kind=int | None, whole=1, panel=PANEL_REPEATS,
           help="Stop once N groups are written (the rollouts in flight are cancelled, no more rows sent); exit 0."),
    option("--dry-run", panel=PANEL_OUTPUTS, sets="CommandConfig.dry_run",
           help="Send nothing: print each row as it would be sent, its route on stderr."),
    option("-v", "--verbose", panel=PANEL_OBSERVE, sets="CommandConfig.verbose",
           help="One line per row event on stderr: sent, retried, finished, failed."),
    option("--progress/--no-progress", kind=bool | None, default=None, show_default=False, panel=PANEL_OBSERVE,
           sets="CommandConfig.progress",
           help="Force the live progress display on stderr on or off (default: on when stderr is a terminal); where"
           " stderr is no terminal, --progress writes a plain status line every 1% or minute."),
    option("-q", "--quiet", panel=PANEL_OBSERVE, sets="CommandConfig.quiet",
           help="Print no summary and no progress line on stderr (--metrics FILE still gets the summary)."),
)
# fmt: on
