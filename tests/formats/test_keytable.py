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


def test_a_new_key_holds_the_value_it_was_set_to_in_its_first_field_and_0_in_the_others():
    table = KeyTable(("I", "B"))
    first_keys = [b"key %d" % i for i in range(3)]
    for value, key in enumerate(first_keys, start=5):  # each the first key of its bucket
        assert table.setdefault(key, value) == value
    assert table.setdefault(first_keys[1], 99) == 6
    assert [table.value(table.find(key)) for key in first_keys] == [5, 6, 7]
    assert [table.value(table.find(key), 1) for key in first_keys] == [0, 0, 0]
    assert table.count == 3
