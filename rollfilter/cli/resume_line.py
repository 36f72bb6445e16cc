"""The line an interrupted run leaves at a terminal: the command that goes on where it stopped.

It is the command as it was given, word for word (quoted for a shell), with `--resume`
added and `--overwrite` left out (a resumed run keeps what the first wrote). A header's value and
a URL's credentials, query and fragment are never printed: they are cut, and the line says to
give them again.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from rollfilter.cli.definition import OPTIONS
from rollfilter.redact import printable, shown_as_typed

PROGRAM = "rollfilter"
_HEADER_OPTIONS = ("-H", "--header")
_LEFT_OUT = ("--overwrite",)
# The options whose value is the next word (or the rest of a word of short options, `-kH VALUE`),
# and of those, the ones whose value holds URLs (`URL`, `NAME=URL[,URL...]`), with or without a scheme.
_VALUED = frozenset(flag for spec in OPTIONS if spec.metavar for flag in spec.flags)
_URL_VALUED = frozenset(flag for spec in OPTIONS if spec.metavar and "URL" in spec.metavar for flag in spec.flags)
_NAMED_URL_VALUED = frozenset(flag for spec in OPTIONS if spec.metavar == "NAME=URL" for flag in spec.flags)


def resume_line(argv: Sequence[str], *, from_stdin: bool) -> str:
    """The line that resumes the run given `argv` (the words after the program's name); with
    `from_stdin`, it says that the same rows go on standard input again."""
    words, cut = _resumed_words(argv)
    line = f"to go on where it stopped: {' '.join(_quoted(word) for word in [PROGRAM, *words])}"
    notes = []
    if cut:
        notes.append("give again the header values and the URL credentials or queries cut here")
    if from_stdin:
        notes.append("with the same rows on standard input")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def _quoted(word: str) -> str:
    """`word` quoted for a shell; one with a control or other unprintable character as $'...',
    its escapes (`\\n`, `\\x1b`, `\\u202e`) read back by bash and zsh as the character, which is
    never printed itself."""
    if word.isprintable():
        return shlex.quote(word)
    return "$'" + printable(word.replace("\\", "\\\\").replace("'", "\\'")) + "'"


def _resumed_words(argv: Sequence[str]) -> tuple[list[str], bool]:
    """`argv` with --resume added and --overwrite left out, each secret cut; and whether one was."""
    words: list[str] = []
    cut = False
    value_of: str | None = None  # the option the next word is the value of
    options_over = False
    for word in argv:
        if options_over:
            words.append(word)
            continue
        if value_of is not None:
            safe, value_of = _cut_value(value_of, word), None
        else:
            safe, value_of = _cut_option(word)
            options_over = word == "--"
        cut = cut or safe != word
        if word not in _LEFT_OUT:
            words.append(safe)
    if "--resume" not in words:
        at = words.index("--") if "--" in words else len(words)
        words.insert(at, "--resume")
    return words, cut


def _cut_option(word: str) -> tuple[str, str | None]:
    """A word that is no option's value, its secrets cut; and the option whose value the next word
    is, if any. Short options may share a word as click reads them: `-kH VALUE`, `-kHVALUE`."""
    if word.startswith("--"):
        name, equals, value = word.partition("=")
        if equals:
            return name + equals + _cut_value(name, value), None
        return word, word if word in _VALUED else None
    if word.startswith("-") and len(word) > 1:
        for position in range(1, len(word)):
            option = "-" + word[position]
            if option in _VALUED:
                rest = word[position + 1 :]
                if not rest:
                    return word, option
                return word[: position + 1] + _cut_value(option, rest), None
        return word, None
    return _cut_url(word), None


def _cut_value(option: str, value: str) -> str:
    """The value given to `option`, its secrets cut: a header's value, a URL's credentials and query."""
    if option in _HEADER_OPTIONS:
        return _cut_header(value)
    if option not in _URL_VALUED:
        return _cut_url(value)
    name, equals, urls = value.partition("=") if option in _NAMED_URL_VALUED else ("", "", value)
    return name + equals + ",".join(shown_as_typed(url) for url in urls.split(","))


def _cut_header(value: str) -> str:
    """A header `NAME: VALUE` as NAME alone: its value is never printed."""
    name, colon, _ = value.partition(":")
    return f"{name}: ..." if colon else "..."


def _cut_url(word: str) -> str:
    """A word holding a URL (`-u URL`, `NAME=URL`) without its credentials, query and fragment."""
    scheme_end = word.find("://")
    if scheme_end < 0:
        return word
    named = word.rfind("=", 0, scheme_end) + 1  # 0: the word is the URL
    return word[:named] + shown_as_typed(word[named:])
