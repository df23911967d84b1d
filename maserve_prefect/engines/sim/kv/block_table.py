"""`BlockTable`: one request's KV block ids, kept in a growable numpy buffer.

The one idea: the KV cache works on block ids as arrays (taking free blocks, hashing, freeing),
so a request's table stays an array end to end. A Python list would cost a `tolist()` on every
allocation and an `np.array(...)` on every free — for a long prompt (thousands of blocks) those
conversions cost more than the KV work itself. Appends amortize by doubling the buffer.

Examples:
    >>> import numpy as np
    >>> t = BlockTable()
    >>> t.extend(np.array([4, 5, 6]))
    >>> t.append(9)
    >>> len(t), t.view().tolist(), list(t)
    (4, [4, 5, 6, 9], [4, 5, 6, 9])
    >>> t.truncate(2).tolist(), t.tolist()
    ([6, 9], [4, 5])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)


class BlockTable:
    """A request's block ids in order (int64); `view()` is the live array. A filled entry of a
    buffer is never rewritten (`truncate` moves to a new one), so a kept view keeps its
    contents; it does not see later `extend` / `append` calls.

    Args:
        capacity: blocks to make room for at once (the most the request can hold, when known).
    """

    __slots__ = ("_buf", "_n")

    def __init__(self, capacity: int = 0) -> None:
        self._buf = np.empty(capacity, dtype=np.int64) if capacity > 0 else _EMPTY
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def view(self) -> np.ndarray:
        """The block ids as an int64 array (a view of the buffer)."""
        return self._buf[: self._n]

    def tolist(self) -> list[int]:
        return self._buf[: self._n].tolist()

    def _grow(self, end: int) -> None:
        buf = np.empty(max(end, 2 * len(self._buf), 16), dtype=np.int64)
        buf[: self._n] = self._buf[: self._n]
        self._buf = buf

    def extend(self, blocks: np.ndarray | Sequence[int]) -> None:
        """Append `blocks` (an int array or a short list of ints) in order."""
        end = self._n + len(blocks)
        if end > len(self._buf):
            self._grow(end)
        self._buf[self._n : end] = blocks
        self._n = end

    def append(self, block: int) -> None:
        n = self._n
        if n == len(self._buf):
            self._grow(n + 1)
        self._buf[n] = block
        self._n = n + 1

    def truncate(self, n: int) -> np.ndarray:
        """Keep the first `n` blocks (in a new buffer: a filled entry of a buffer is never
        rewritten, so views of `view()` stay valid); returns the dropped tail (a copy)."""
        tail = self._buf[n : self._n].copy()
        if n < self._n:
            self._buf = self._buf[:n].copy()
            self._n = n
        return tail
