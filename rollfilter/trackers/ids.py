"""The file that keeps a run's tracker run ids (beside the command's run record), so that a run that
resumes continues the same tracker runs rather than starting others."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any


def read_ids(path: str | None, key: str = "") -> dict[str, str]:
    """The tracker run ids kept in `path` by tracker name ("mlflow", "wandb"), when it holds
    them for `key` (what they were kept for, as --summarize's files); none when it is missing,
    unreadable, for another key, or not ours."""
    return _read(path, key, "ids")


def read_places(path: str | None, key: str = "") -> dict[str, str]:
    """Where each tracker run kept in `path` for `key` is, by tracker name: its MLflow experiment,
    its W&B project (none for a file kept before they were)."""
    return _read(path, key, "places")


def read_servers(path: str | None, key: str = "") -> dict[str, str]:
    """The server of each tracker run kept in `path` for `key` that has one, by tracker name: MLflow's
    tracking URI, without what may be a secret in it (none for a file kept before they were)."""
    return _read(path, key, "servers")


def _read(path: str | None, key: str, part: str) -> dict[str, str]:
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            kept: Any = json.load(file)
    except (OSError, ValueError):
        return {}
    if not isinstance(kept, dict) or kept.get("key", "") != key or not isinstance(kept.get("ids"), dict):
        return {}
    found = kept.get(part)
    return {name: value for name, value in found.items() if isinstance(value, str)} if isinstance(found, dict) else {}


def keep_ids(
    path: str,
    ids: dict[str, str],
    key: str = "",
    places: dict[str, str] | None = None,
    servers: dict[str, str] | None = None,
) -> None:
    """Keep `ids` in `path`, with where each run is (`places`, on `servers`), replaced at once (a
    run killed while writing leaves the old or the new). OSError when it cannot be written."""
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"key": key, "ids": ids, "places": places or {}, "servers": servers or {}}, file)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
