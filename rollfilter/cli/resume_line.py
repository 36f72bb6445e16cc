"""The line an interrupted run leaves at a terminal: the command that goes on where it stopped.

It is the command as it was given, word for word (quoted for a POSIX shell), with `--resume`
added and `--overwrite` left out (a resumed run keeps what the first wrote). A header's value and
a URL's credentials, query and fragment are never printed: they are cut, and the line says to
give them again.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from rollfilter.redact import printable, shown_as_typed

PROGRAM = "rollfilter"
_HEADER_OPTIONS = ("-H", "--header")
_LEFT_OUT = ("--overwrite",)


def resume_line(argv: Sequence[str], *, from_stdin: bool) -> str:
    """The line that resumes the run given `argv` (the words after the program's name); with
    `from_stdin`, it says that the same rows go on standard input again."""
    words, cut = _resumed_words(argv)
    line = f"to go on where it stopped: {' '.join(shlex.quote(printable(word)) for word in [PROGRAM, *words])}"
    notes = []
    if cut:
        notes.append("give again the header values and the URL credentials or queries cut here")
    if from_stdin:
        notes.append("with the same rows on standard input")
    return line + (f" ({'; '.join(notes)})" if notes else "")


def _resumed_words(argv: Sequence[str]) -> tuple[list[str], bool]:
    """`argv` with --resume added and --overwrite left out, each secret cut; and whether one was."""
    words: list[str] = []
    cut = False
    header_next = options_over = False
    for word in argv:
        if options_over:
            words.append(word)
            continue
        safe = _cut_header(word) if header_next else _cut_url(_cut_inline_header(word))
        header_next = word in _HEADER_OPTIONS
        options_over = word == "--"
        cut = cut or safe != word
        if word not in _LEFT_OUT:
            words.append(safe)
    if "--resume" not in words:
        at = words.index("--") if "--" in words else len(words)
        words.insert(at, "--resume")
    return words, cut


def _cut_header(value: str) -> str:
    """A header `NAME: VALUE` as NAME alone: its value is never printed."""
    name, colon, _ = value.partition(":")
    return f"{name}: ..." if colon else "..."


def _cut_inline_header(word: str) -> str:
    """`--header=NAME: VALUE` and `-HNAME: VALUE`, cut as `_cut_header` cuts a value."""
    for option in ("--header=", "-H"):
        if word.startswith(option) and word != option:
            return option + _cut_header(word[len(option) :])
    return word


def _cut_url(word: str) -> str:
    """A word holding a URL (`-u URL`, `NAME=URL`) without its credentials, query and fragment."""
    scheme_end = word.find("://")
    if scheme_end < 0:
        return word
    named = word.rfind("=", 0, scheme_end) + 1  # 0: the word is the URL
    return word[:named] + shown_as_typed(word[named:])
