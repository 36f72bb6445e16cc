"""A rollout as a person reads it: the input messages, then each output item in order (assistant
messages, reasoning, tool calls with their name and arguments, tool outputs), then its verdicts.
Every string of the record is shown as text."""

from __future__ import annotations

import json
from typing import Any

from rollfilter.viewer.page import pretty, text

VERDICTS = ("reward", "reward_components", "_rf_health", "mask_sample", "_rf_policy_version", "error")


def transcript(record: dict[str, Any]) -> str:
    """The input messages and the output items of `record`, in order, then its verdicts and usage."""
    params = record.get("responses_create_params")
    given = params.get("input") if isinstance(params, dict) else None
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    response = record.get("response")
    output = response.get("output") if isinstance(response, dict) else None
    parts = ['<section class="transcript"><h2>Input</h2>']
    parts += [_item(item) for item in (given if isinstance(given, list) else [])]
    parts.append("<h2>Output</h2>")
    parts += [_item(item) for item in (output if isinstance(output, list) else [])]
    if not output:
        parts.append("<p class=note>no output items</p>")
    parts.append("</section>")
    return "".join(parts) + verdicts(record)


def verdicts(record: dict[str, Any]) -> str:
    """The reward, its components, the health verdicts, mask_sample, the policy version, the
    error of a failed attempt, and the usage, as far as `record` has them."""
    response = record.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    rows = [(name, record[name]) for name in VERDICTS if name in record]
    rows += [("usage", usage)] if usage is not None else []
    if not rows:
        return ""
    cells = "".join(f"<tr><th>{text(name)}</th><td><pre>{pretty(value)}</pre></td></tr>" for name, value in rows)
    return f'<h2>Verdicts</h2><table class="verdicts">{cells}</table>'


def _item(item: Any) -> str:
    if not isinstance(item, dict):
        return _box("item", pretty(item))
    kind = item.get("type") or "message"
    if kind == "message":
        role = str(item.get("role", ""))
        return _box(role, _content(item.get("content")), css=role)
    if kind == "reasoning":
        summary = item.get("summary") or item.get("content")
        return _box("reasoning", _content(summary), css="reasoning")
    if kind == "function_call":
        arguments = item.get("arguments")
        shown = _arguments(arguments)
        name = text(item.get("name", ""))
        call = f'<span class="tool-name">{name}</span> <span class=note>{text(item.get("call_id", ""))}</span>'
        return _box("tool call", f"{call}<pre class=arguments>{shown}</pre>", css="function_call")
    if kind == "function_call_output":
        note = f"<span class=note>{text(item.get('call_id', ''))}</span>"
        return _box("tool output", f"{note}{_content(item.get('output'))}", css="function_call_output")
    return _box(str(kind), f"<pre>{pretty(item)}</pre>")


def _arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return pretty(json.loads(arguments))
        except ValueError:
            return text(arguments)
    return pretty(arguments)


def _content(content: Any) -> str:
    """A message's content: a string, or parts whose text is shown (others as JSON)."""
    if isinstance(content, str):
        return f"<pre>{text(content)}</pre>"
    if isinstance(content, list):
        shown = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                shown.append(f"<pre>{text(part['text'])}</pre>")
            else:
                shown.append(f"<pre>{pretty(part)}</pre>")
        return "".join(shown)
    return f"<pre>{pretty(content)}</pre>" if content is not None else ""


def _box(kind: str, body: str, *, css: str = "") -> str:
    classes = " ".join(["item", *(word for word in css.split() if word.isidentifier())])
    return f'<div class="{text(classes)}"><div class="kind">{text(kind)}</div>{body}</div>'
