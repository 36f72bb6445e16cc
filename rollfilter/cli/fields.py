"""The command line's name for each setting: library messages name `Config` fields, and the
command line shows them as the options that set them."""

from __future__ import annotations

from rollfilter.errors import name_options

# The library's messages name settings by their fields (Config.url); the command line names
# the options that set them.
OPTION_OF_FIELD = {  # every Config field and field of its parts, and the CommandConfig fields messages name
    "url": "-u/--url",
    "endpoints": "-e/--endpoint",
    "agent": "-a/--agent",
    "concurrency": "-j/--concurrency",
    "limit": "-n/--limit",
    "repeats": "-r/--repeats",
    "repeats_by_agent": "-r/--repeats NAME=K",
    "repeat_seeds": "--repeat-seeds",
    "params": "-p/--param",
    "retries": "--retries",
    "retries.count": "--retries",
    "retries.budget": "--retry-budget",
    "retries.statuses": "--retry-on",
    "timeout": "--timeout",
    "timeout.attempt": "--timeout",
    "timeout.connect": "--connect-timeout",
    "tls": "--cacert/--insecure",
    "tls.cacert": "--cacert",
    "tls.insecure": "--insecure",
    "max_failures": "--max-failures",
    "max_failures.count": "--max-failures",
    "max_failures.fraction": "--max-failures",
    "prices": "--prices",
    "max_cost": "--max-cost",
    "headers": "-H/--header",
    "shard": "--shard",
    "pass_threshold": "--pass-threshold",
    "head_server": "--head-server",
    "proxy": "--proxy",
    "adaptive": "--adaptive",
    # --aggregate FILE (and --gym-layout) sets both: it asks the agents and names the file.
    "aggregate": "--aggregate",
    "cross_origin_redirects": "--cross-origin-redirects",
    "max_reply_bytes": "--max-reply-bytes",
    "output": "-o",
    "errors_file": "--errors",
    "metrics_file": "--metrics",
    "per_task_file": "--per-task",
    "aggregate_file": "--aggregate",
    "materialized_file": "--materialized",
    "progress_file": "--progress-file",
    "resume": "--resume",
    "max_attempts": "--max-attempts",
}


def in_options(text: str) -> str:
    """A library message as the command line says it: each field it names becomes its option."""
    return name_options(text, OPTION_OF_FIELD)
