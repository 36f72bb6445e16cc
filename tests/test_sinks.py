"""sinks.py: results put back in input order."""

from __future__ import annotations

from rollfilter.sinks import Reorderer


def test_reorderer_emits_in_sequence():
    out: list[int] = []
    reorderer = Reorderer()
    for seq in (2, 0, 3, 1, 5):
        reorderer.emit(seq, lambda s=seq: out.append(s))
    assert out == [0, 1, 2, 3]  # 5 is held behind the 4 that never came
    reorderer.flush()
    assert out == [0, 1, 2, 3, 5]
