"""cli/definition.py: the command's options as data, each that sets a field alone naming one that is there."""

from __future__ import annotations

import dataclasses
import typing

import typer.main

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.definition import OPTIONS, option
from rollfilter.cli.options import typer_app
from rollfilter.config import Config


def field_is_there(owner: type, path: list[str]) -> bool:
    """Whether the dataclass `owner` has a field at `path` (a part's: ["retries", "count"])."""
    kind: object = owner
    for name in path:
        if not dataclasses.is_dataclass(kind) or name not in {field.name for field in dataclasses.fields(kind)}:
            return False
        hint = typing.get_type_hints(kind).get(name) if kind is not CommandConfig else None
        kind = next((arg for arg in typing.get_args(hint) if dataclasses.is_dataclass(arg)), hint)  # Groups | None
    return True


def test_each_field_an_option_sets_alone_is_there():
    owners = {"Config": Config, "CommandConfig": CommandConfig}
    set_alone = [spec for spec in OPTIONS if spec.sets is not None]
    assert len(set_alone) > 25
    missing = [
        spec.sets for spec in set_alone if not field_is_there(owners[spec.sets.split(".")[0]], spec.sets.split(".")[1:])
    ]
    assert missing == []
    assert not field_is_there(Config, ["retries", "no_such_field"])


def test_no_two_options_set_one_field_alone():
    fields = [spec.sets for spec in OPTIONS if spec.sets is not None]
    assert len(fields) == len(set(fields))


def test_the_command_has_the_options_of_the_table_by_their_names_in_its_order():
    params = [param.name for param in typer.main.get_command(typer_app).params]
    assert params == ["files", *(spec.name for spec in OPTIONS), "version", "install_completion", "show_completion"]


def test_an_option_is_a_flag_a_text_or_texts_by_what_it_is_declared_with():
    flag, text, texts = (
        option("--x", help=""),
        option("--y", metavar="Y", help=""),
        option("-z", metavar="Z", many=True, help=""),
    )
    assert [(spec.kind, spec.default) for spec in (flag, text, texts)] == [
        (bool, False),
        (str | None, None),
        (list[str] | None, None),
    ]
    assert (option("--progress/--no-progress", help="").name, option("-k", "--ordered", help="").name) == (
        "progress",
        "ordered",
    )


def test_the_url_s_help_says_when_run_is_appended_as_agent_url_appends_it():
    """-u's --help line is the short form of the man page's: a base URL, its path empty or
    ending in /, gets /run; any other path is the endpoint."""
    url = next(spec for spec in OPTIONS if "--url" in spec.flags)
    assert "ends in /" in url.help
