"""--view: result files shown in a browser, served until Ctrl-C, or written as one page (--html)."""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import TYPE_CHECKING

import trio

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.environment import Environment
from rollfilter.cli.files.outputs import OutputFiles, refuse_inputs, replace_content
from rollfilter.cli.messages import say
from rollfilter.cli.statuses import RunEnd
from rollfilter.cli.summarize import baseline_files
from rollfilter.errors import UsageError
from rollfilter.formats.source import STDIN, check_inputs

if TYPE_CHECKING:
    from rollfilter.viewer.catalog import Catalog

STDIN_REFUSED = "--view reads its files again as they grow: give the result files, not standard input"
DEFAULT_LISTEN = ("127.0.0.1", 0)  # loopback, at a free port


@dataclasses.dataclass(frozen=True, slots=True)
class ViewOptions:
    """--listen HOST:PORT (read), --html REPORT.html and --html-rollouts N."""

    listen: tuple[str, int] = DEFAULT_LISTEN
    html_file: str | None = None
    html_rollouts: int = 2000


def listen_address(text: str | None) -> tuple[str, int]:
    """--listen's HOST:PORT ([::1]:PORT for IPv6; port 0: a free one); UsageError when it is not one."""
    if text is None:
        return DEFAULT_LISTEN
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen takes HOST:PORT, such as 127.0.0.1:8000, not {text!r}")
    return host, int(port)


def check_view(command: CommandConfig) -> None:
    """UsageError for standard input or another pipe (read once, it cannot be read again) or a file
    that cannot be read."""
    if STDIN in command.inputs or STDIN in command.compare_files:
        raise UsageError(STDIN_REFUSED)
    paths = (*command.inputs, *command.compare_files, *((command.errors_file,) if command.errors_file else ()))
    check_inputs(paths)
    for path in paths:
        mode = os.stat(path).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):  # a pipe, such as <(...), or a socket
            raise UsageError(f"--view reads its files again as they grow: {path} is a pipe, read once")


async def view(command: CommandConfig, options: ViewOptions, *, environment: Environment) -> RunEnd:
    """Index `command`'s files (with --errors' records; --compare's baseline beside them), then
    write the page (--html) and end, or serve it until a stop signal cancels the serving."""
    from rollfilter.viewer.catalog import Catalog

    # A baseline in shards, given quoted as one pattern, is read as --summarize reads it.
    command = dataclasses.replace(command, compare_files=baseline_files(command.compare_files))
    check_view(command)
    paths = command.inputs + ((command.errors_file,) if command.errors_file is not None else ())
    if options.html_file is not None:  # the page must not be written over a file it shows
        viewed = [(path, path) for path in (*paths, *command.compare_files)]
        refuse_inputs(viewed, [(f"--html {options.html_file}", options.html_file)])
    limit = command.max_line_bytes
    baseline = Catalog(command.compare_files, command.config, max_line_bytes=limit) if command.compare_files else None
    catalog = Catalog(paths, command.config, max_line_bytes=limit, baseline=baseline)
    await trio.to_thread.run_sync(catalog.refresh, abandon_on_cancel=True)
    if options.html_file is not None:
        from rollfilter.viewer.page import encoded
        from rollfilter.viewer.static import static_page

        with OutputFiles() as files:
            page = static_page(catalog, max_rollouts=options.html_rollouts)
            replace_content(files.whole(options.html_file, "--html"), encoded(page))
        return RunEnd()
    await _serve(catalog, options, environment)
    return RunEnd()


async def _serve(catalog: Catalog, options: ViewOptions, environment: Environment) -> None:
    from rollfilter.viewer.server import listening

    host, port = options.listen
    try:
        server, viewer = listening(catalog, host, port)
    except OSError as exc:
        raise UsageError(f"--listen {host}:{port}: cannot listen there: {exc.strerror or exc}") from None
    say(f"viewing {len(catalog)} rollouts at {viewer.url} (Ctrl-C to stop)", environment.stderr)
    try:
        await trio.to_thread.run_sync(server.serve_forever, abandon_on_cancel=True)
    finally:
        server.shutdown()
        server.server_close()
