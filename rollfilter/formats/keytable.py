"""A compact map from byte strings to small unsigned integers, for numbering and resume.

A run may meet millions of distinct rows, and what it must remember about each (its task
index, how many rollouts it has had, whether an earlier run finished it) must not cost a
Python object per row. Keys are kept as 16-byte BLAKE2b digests, packed into a fixed set
of buckets that `bytearray.find` searches in C. Memory grows by about 30 bytes a key and
never with the keys' values (a task index of 2**39 costs what 0 costs); no resize ever
rehashes every key at once, so no pause stalls the rows in flight.

Two different keys share a digest with a chance of about n**2 / 2**129 for n keys: for a
billion keys, about one in 10**20.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

DIGEST_BYTES = 16
BUCKETS = 4096  # a bucket holds n/4096 digests: at a million keys, one find scans ~4 KB
_BUCKET_HIGH_BITS = 0x0F  # 12 bits of the digest choose the bucket: its first byte, and 4 bits of the next
_blake2b = hashlib.blake2b


class KeyTable:
    """Byte strings seen so far, each with `len(fields)` unsigned integers (array typecodes).

    `add(key)` returns a handle for the key's values and whether the key is new (its values
    start at 0); `find(key)` returns the handle of a known key, or -1.
    """

    def __init__(self, fields: Sequence[str] = ()) -> None:
        # A bucket gets arrays of its own with its first key: most tables (a run's resume state,
        # a small run's numbering) hold few keys, and making an empty array for every bucket
        # was most of the cost of starting a run's planner. Until then every bucket shares one
        # empty digest string and one empty array a field, which nothing appends to.
        self._digests: list[bytes | bytearray] = [b""] * BUCKETS
        self._codes = tuple(fields)
        self._values = [[array(code)] * BUCKETS for code in fields]
        self.count = 0

    def find(self, key: bytes) -> int:
        bucket, position, _ = self._locate(key)
        return -1 if position < 0 else position * BUCKETS + bucket

    def add(self, key: bytes) -> tuple[int, bool]:
        bucket, position, digest = self._locate(key)
        if position >= 0:
            return position * BUCKETS + bucket, False
        return self._insert(bucket, digest, 0) * BUCKETS + bucket, True

    def setdefault(self, key: bytes, value: int) -> int:
        """The first field of `key`, which is `value` if the key is new (the hot path of numbering)."""
        bucket, position, digest = self._locate(key)
        if position >= 0:
            return self._values[0][bucket][position]
        self._insert(bucket, digest, value)
        return value

    def value(self, handle: int, field: int = 0) -> int:
        position, bucket = divmod(handle, BUCKETS)
        return self._values[field][bucket][position]

    def set_value(self, handle: int, value: int, field: int = 0) -> None:
        position, bucket = divmod(handle, BUCKETS)
        self._values[field][bucket][position] = value

    def __contains__(self, key: bytes) -> bool:
        return self.find(key) >= 0

    def _locate(self, key: bytes) -> tuple[int, int, bytes]:
        """The key's bucket, its position there (-1 when unknown), and its digest."""
        digest = _blake2b(key, digest_size=DIGEST_BYTES).digest()
        bucket = digest[0] | (digest[1] & _BUCKET_HIGH_BITS) << 8
        digests = self._digests[bucket]
        offset = digests.find(digest)
        while offset > 0 and offset % DIGEST_BYTES:  # a match straddling two digests is not one
            offset = digests.find(digest, offset + 1)
        return bucket, offset if offset < 0 else offset // DIGEST_BYTES, digest

    def _insert(self, bucket: int, digest: bytes, first: int) -> int:
        """Append a new key's digest to its bucket, its first field `first` and the others 0; its position."""
        digests = self._digests[bucket]
        if not digests:  # the bucket's first key: its arrays are made holding it
            self._digests[bucket] = bytearray(digest)
            for field, code in enumerate(self._codes):
                self._values[field][bucket] = array(code, (first if field == 0 else 0,))
            self.count += 1
            return 0
        position = len(digests) // DIGEST_BYTES
        digests += digest
        for field, values in enumerate(self._values):
            values[bucket].append(first if field == 0 else 0)
        self.count += 1
        return position
