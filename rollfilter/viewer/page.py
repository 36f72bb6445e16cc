"""The frame every viewer page shares: the document, its style sheet, and escaping helpers. A page
is built from escaped text only: what a file holds is shown as text, never read as markup."""

from __future__ import annotations

import base64
import hashlib
import json
from html import escape
from typing import Any
from urllib.parse import quote

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; } td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: left;
  vertical-align: top; }
table.figures td table td { border: none; padding: 0 6px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; } .card { border: 1px solid #ccc; border-radius: 6px;
  padding: 6px 12px; } .card b { font-size: 1.3em; display: block; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; } .chart { margin: 0; width: 360px; }
.chart figcaption { font-weight: bold; } .bar { fill: #4a7ab5; } .label { font-size: 10px; fill: #444; }
form.filters { margin: 1em 0; display: flex; flex-wrap: wrap; gap: 8px; align-items: end; }
form.filters label { display: flex; flex-direction: column; font-size: 0.85em; }
.item { border-left: 4px solid #bbb; margin: 8px 0; padding: 4px 10px; background: #fafafa; }
.item.assistant { border-color: #4a7ab5; } .item.user { border-color: #5a5; } .item.reasoning { border-color: #b9a;
  color: #555; } .item.function_call { border-color: #c83; } .item.function_call_output { border-color: #888; }
.item .kind { font-size: 0.8em; color: #666; text-transform: uppercase; }
pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0; font-size: 13px; }
.side { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.failed { color: #b00; } .note { color: #666; }
"""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


def text(value: object) -> str:
    """`value` as HTML text: every character that could start markup escaped."""
    return escape(str(value), quote=True)


def url_part(value: object) -> str:
    return quote(str(value), safe="")


def pretty(value: Any) -> str:
    """A JSON value as indented text, escaped."""
    return text(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def encoded(page: str) -> bytes:
    """A page as UTF-8; a file name that is not (a byte Python read as a lone surrogate) shown
    as its escape."""
    return page.encode("utf-8", "backslashreplace")


def document(title: str, body: str, *, inline_style: bool = False) -> str:
    """A whole page: served pages link the style sheet (/style.css); a page written as one file
    holds it inline, allowed by its hash alone, and no script at all."""
    if inline_style:
        digest = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
        policy = f"default-src 'none'; style-src 'sha256-{digest}'; img-src data:; base-uri 'none'"
        head = f'<meta http-equiv="Content-Security-Policy" content="{text(policy)}"><style>{STYLE}</style>'
    else:
        head = '<link rel="stylesheet" href="/style.css">'
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">{head}'
        f"<title>{text(title)}</title></head><body>{body}</body></html>"
    )


def figure_table(value: Any) -> str:
    """A summary (or any JSON value) as nested tables, a row a key."""
    if isinstance(value, dict):
        if not value:
            return "<span class=note>none</span>"
        rows = "".join(f"<tr><th>{text(key)}</th><td>{figure_table(item)}</td></tr>" for key, item in value.items())
        return f"<table>{rows}</table>"
    if isinstance(value, list) and all(not isinstance(item, dict | list) for item in value):
        return text(", ".join(_scalar(item) for item in value))
    if isinstance(value, list):
        return "".join(figure_table(item) for item in value)
    return text(_scalar(value))


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
