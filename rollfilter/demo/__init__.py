"""The demo agent: a small NeMo Gym agent server speaking the real `/run` protocol.

`rollfilter --demo` runs it in-process; `python -m rollfilter.demo` runs it on its own.

- `agent`: what it answers (the reward formula, the faults a row or an option asks for, the
  queue and refusals of a model server's capacity);
- `server`: the HTTP/1.1 server over trio;
- `command_line`: `python -m rollfilter.demo`'s options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rollfilter.demo.agent import DemoAgent, DemoOptions, demo_reward, input_text
from rollfilter.demo.server import serve, serving

if TYPE_CHECKING:
    from rollfilter.demo.command_line import main, parse_args

__all__ = ["DemoAgent", "DemoOptions", "demo_reward", "input_text", "main", "parse_args", "serve", "serving"]


def __getattr__(name: str) -> Any:
    # `python -m rollfilter.demo`'s options (argparse) are not loaded by `rollfilter --demo`.
    if name in ("main", "parse_args"):
        from rollfilter.demo import command_line

        return getattr(command_line, name)
    raise AttributeError(f"module 'rollfilter.demo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})  # the names imported on first use too
