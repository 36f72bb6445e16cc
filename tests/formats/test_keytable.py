"""keytable.py: values kept per key in flat arrays."""

from __future__ import annotations

from rollfilter.formats.keytable import KeyTable


def test_key_table_keeps_values_per_key_and_knows_what_it_lacks():
    table = KeyTable(("Q", "B"))
    handles = {}
    for i in range(20_000):
        handle, new = table.add(b"key %d" % i)
        assert new
        table.set_value(handle, i * 7)
        table.set_value(handle, i % 2, 1)
        handles[i] = handle
    assert table.count == 20_000
    assert table.add(b"key 123") == (handles[123], False)
    assert table.value(table.find(b"key 19999")) == 19999 * 7
    assert table.value(table.find(b"key 3"), 1) == 1
    assert table.find(b"key 20000") == -1
    assert b"" not in table
