"""cli/resume_line.py: the command that resumes an interrupted run, with nothing secret in it."""

from __future__ import annotations

from rollfilter.cli.resume_line import resume_line


def test_the_words_given_again_with_resume_and_without_overwrite():
    line = resume_line(
        ["-u", "http://127.0.0.1:8000", "-o", "out put.jsonl", "--overwrite", "in.jsonl"], from_stdin=False
    )
    assert line == "to go on where it stopped: rollfilter -u http://127.0.0.1:8000 -o 'out put.jsonl' in.jsonl --resume"
    again = resume_line(["--resume", "-o", "o.jsonl", "--", "-odd name"], from_stdin=True)
    assert again == (
        "to go on where it stopped: rollfilter --resume -o o.jsonl -- '-odd name'"
        " (with the same rows on standard input)"
    )


def test_header_values_and_url_secrets_are_cut_and_said_to_be():
    argv = ["-H", "Authorization: Bearer t1", "--header=X-Key: t2", "-HX-Other: t3", "-o", "o.jsonl"]
    argv += ["-u", "https://user:t4@agent.example/run?token=t5", "-e", "a=http://h:1/x?k=t6#t7"]
    line = resume_line(argv, from_stdin=False)
    assert not [secret for secret in ("t1", "t2", "t3", "t4", "t5", "t6", "t7") if secret in line]
    assert line == (
        "to go on where it stopped: rollfilter -H 'Authorization: ...' '--header=X-Key: ...' '-HX-Other: ...'"
        " -o o.jsonl -u https://agent.example/run -e a=http://h:1/x --resume"
        " (give again the header values and the URL credentials or queries cut here)"
    )


def test_a_header_in_a_word_of_short_options_and_credentials_without_a_scheme_are_cut():
    argv = ["-kH", "Authorization: Bearer t1", "-qHX-Key: t2", "--proxy", "u:t3@127.0.0.1:3128", "-o", "o@1.jsonl"]
    argv += ["-e", "a=http://u:t4@h1:1,http://u:t5@h2:2?k=t6", "--verifier=v=u:t7@h3:3", "-uu:t8@h4:4/run?k=t9"]
    line = resume_line(argv, from_stdin=False)
    assert not [secret for secret in ("t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9") if secret in line]
    assert line == (
        "to go on where it stopped: rollfilter -kH 'Authorization: ...' '-qHX-Key: ...' --proxy 127.0.0.1:3128"
        " -o o@1.jsonl -e a=http://h1:1,http://h2:2 --verifier=v=h3:3 -uh4:4/run --resume"
        " (give again the header values and the URL credentials or queries cut here)"
    )


def test_a_word_with_a_control_character_is_quoted_so_that_bash_reads_it_back_whole():
    line = resume_line(["-o", "a\nb\\c'd.jsonl", "\u202eevil", "\x1b[31m.jsonl"], from_stdin=False)
    # Escaped, never printed raw; in single quotes the escapes would name another file.
    assert line == (
        "to go on where it stopped: rollfilter -o $'a\\nb\\\\c\\'d.jsonl' $'\\u202eevil' $'\\x1b[31m.jsonl' --resume"
    )
