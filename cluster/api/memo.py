"""What a web process remembers for a moment: answers kept for ``ttl_s`` seconds per key.

Used for what every API request would otherwise ask the database or Redis again: a token found
(cluster.api.authentication) and an address not locked out (cluster.api.throttling). Bounded: past
``most`` keys it starts over rather than grow.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

MISSING = object()


class Memo:
    def __init__(self, ttl_s: float, most: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.most = most
        self._kept: dict[Hashable, tuple[float, object]] = {}

    def get(self, key: Hashable):
        """The value kept for ``key`` less than ``ttl_s`` ago, else MISSING."""
        kept = self._kept.get(key)
        if kept is not None and time.monotonic() - kept[0] < self.ttl_s:
            return kept[1]
        return MISSING

    def put(self, key: Hashable, value: object) -> None:
        if len(self._kept) >= self.most:
            self._kept.clear()
        self._kept[key] = (time.monotonic(), value)

    def forget(self, key: Hashable) -> None:
        self._kept.pop(key, None)

    def clear(self) -> None:
        self._kept.clear()
