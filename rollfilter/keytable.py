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
        self._digests = [bytearray() for _ in range(BUCKETS)]
        self._values = [[array(code) for _ in range(BUCKETS)] for code in fields]
        self.count = 0

    def find(self, key: bytes) -> int:
        digest = _blake2b(key, digest_size=DIGEST_BYTES).digest()
        bucket = digest[0] | (digest[1] & _BUCKET_HIGH_BITS) << 8
        return self._position(bucket, digest)

    def add(self, key: bytes) -> tuple[int, bool]:
        digest = _blake2b(key, digest_size=DIGEST_BYTES).digest()
        bucket = digest[0] | (digest[1] & _BUCKET_HIGH_BITS) << 8
        handle = self._position(bucket, digest)
        if handle >= 0:
            return handle, False
        digests = self._digests[bucket]
        handle = (len(digests) // DIGEST_BYTES) * BUCKETS + bucket
        digests += digest
        for values in self._values:
            values[bucket].append(0)
        self.count += 1
        return handle, True

    def setdefault(self, key: bytes, value: int) -> int:
        """The first field of `key`, which is `value` if the key is new (the hot path of numbering)."""
        digest = _blake2b(key, digest_size=DIGEST_BYTES).digest()
        bucket = digest[0] | (digest[1] & _BUCKET_HIGH_BITS) << 8
        digests = self._digests[bucket]
        offset = digests.find(digest)
        while offset > 0 and offset % DIGEST_BYTES:
            offset = digests.find(digest, offset + 1)
        if offset >= 0:
            return self._values[0][bucket][offset // DIGEST_BYTES]
        digests += digest
        self._values[0][bucket].append(value)
        for values in self._values[1:]:
            values[bucket].append(0)
        self.count += 1
        return value

    def value(self, handle: int, field: int = 0) -> int:
        position, bucket = divmod(handle, BUCKETS)
        return self._values[field][bucket][position]

    def set_value(self, handle: int, value: int, field: int = 0) -> None:
        position, bucket = divmod(handle, BUCKETS)
        self._values[field][bucket][position] = value

    def __contains__(self, key: bytes) -> bool:
        return self.find(key) >= 0

    def _position(self, bucket: int, digest: bytes) -> int:
        digests = self._digests[bucket]
        offset = digests.find(digest)
        while offset > 0 and offset % DIGEST_BYTES:  # a match straddling two digests is not one
            offset = digests.find(digest, offset + 1)
        return -1 if offset < 0 else (offset // DIGEST_BYTES) * BUCKETS + bucket
