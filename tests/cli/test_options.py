"""cli/options.py: --help as a person reads it, in panels, at the terminal's width, with examples; and a
ConfigError said by the option of its field."""

from __future__ import annotations

import re

from rollfilter.cli.definition import PANELS
from rollfilter.cli.messages import OPTION_OF_FIELD, option_message
from rollfilter.config import ONE_ROLLOUT_GROUPS
from tests.cli.test_command import USE_OF_FIELD, leaf_fields
from tests.conftest import clean_env, run


def help_text(columns: int) -> str:
    proc = run(["--help"], env=clean_env(COLUMNS=str(columns)))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.decode()


def panels_of(text: str) -> dict[str, str]:
    """Each heading of --help (a line that ends with a colon, not indented) and the text under it."""
    parts = re.split(r"^(\S[^\n]*):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_help_groups_the_options_in_panels_in_order():
    panels = panels_of(help_text(160))
    assert [name for name in panels if name in PANELS] == list(PANELS)
    for panel, option in [
        ("Agents and routing", "--url"),
        ("Repeats and groups", "--repeats"),
        ("Outputs", "--overwrite"),
        ("Faults and retries", "--retry-budget"),
        ("Limits and cost", "--max-cost"),
        ("NeMo Gym", "--gym-layout"),
        ("Observability", "--quiet"),
    ]:
        assert re.search(rf"^  (-\w, )?{option}\b", panels[panel], flags=re.M), (panel, option)


def test_help_says_what_repeats_and_quiet_do_beyond_their_names():
    text = " ".join(help_text(200).split())
    assert re.search(
        r"-r, --repeats K\|NAME=K Run each row K times, adjacent \(the summary gives mean@K and pass@k\)", text
    )
    assert "-q, --quiet Print no summary and no progress line on stderr" in text


def test_help_takes_the_terminal_s_width():
    wide, narrow = help_text(160).splitlines(), help_text(80).splitlines()
    assert max(map(len, wide)) > 120
    assert max(map(len, narrow)) <= 80
    assert len(narrow) > len(wide)


def test_help_ends_with_examples_that_fit_80_columns():
    text = help_text(80)
    examples = text.split("Examples:\n")[1].split("\n\n")[0].splitlines()
    assert len(examples) >= 3
    assert all(line.lstrip().startswith("rollfilter ") and len(line) <= 80 for line in examples)
    assert text.rstrip().endswith("option in full.")


def test_every_config_field_is_said_by_the_option_that_sets_it():
    """Each field (a part's by its path) has its option, and so has each part a Config's own
    check names (`Config.groups: needs Config.repeats over 1`)."""
    assert set(OPTION_OF_FIELD) == leaf_fields() | {"groups", "repeats", "reverify"}
    for name, option in OPTION_OF_FIELD.items():
        spellings = option.split()[0].split("/")  # "-r {key}=K": -r; "-H/--header": -H or --header
        if name in USE_OF_FIELD:
            assert set(spellings) & set(USE_OF_FIELD[name]), name


def test_a_config_error_is_said_by_the_options_of_the_fields_it_names():
    assert option_message("cost.max_usd", "needs Config.cost.prices: without them nothing is spent") == (
        "--max-cost needs --prices: without them nothing is spent"
    )
    assert option_message("groups", "needs Config.repeats over 1: a group is a row's repeated rollouts") == (
        "--groups needs -r over 1: a group is a row's repeated rollouts"
    )
    assert option_message("groups.max_staleness", "needs Config.groups.batch too") == (
        "--max-staleness needs --batch-groups too"
    )
    assert option_message("repeats.by_agent['b']", ONE_ROLLOUT_GROUPS) == (
        "-r b=K is 1, which makes groups of one: with --groups, a row's rollouts are its group"
    )
    assert option_message("headers[0][0]", "holds a name that is empty") == "-H/--header holds a name that is empty"
    assert option_message("retries.budget", "expected `float` >= 0") == "--retry-budget expected `float` >= 0"
    assert option_message("no_such_field", "is wrong") is None  # said as the library says it
    assert option_message("shard", "needs Config.no_such_field") is None
