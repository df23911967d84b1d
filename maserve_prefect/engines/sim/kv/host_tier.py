"""The host-memory KV tier: block hashes the GPU evicted, kept in a capacity-bounded LRU.

One idea: the host tier is a *victim* cache of the GPU prefix cache. When the GPU reuses a free
cached block (the free queue's head), the block's hash moves here instead of being forgotten; a
later prefix lookup that misses on the GPU but finds the following blocks here loads them back
(they count as cached tokens of that request, split out as CPU-tier hits) at a transfer cost of
`bytes / host-to-device bandwidth`. A hash lives in at most one tier: loading moves it back to
the GPU, and a GPU block that caches a hash the host holds (the prefix was recomputed) supersedes
the host copy. So every hash the tier ever stored is resident here, loaded, superseded or
dropped (`num_stored == len + num_loaded + num_superseded + num_dropped`, checked).

Eviction is LRU (the least recently stored or looked-up hash goes first); when retention pins
reach the host (`engines/sim/kv/retention.py`), the same rule as on the GPU applies: unpinned hashes
first, oldest first, then preference pins by lowest retention priority, requirement pins never —
kept incrementally by a `victim_index.VictimIndex` while pins exist (`set_protection`, `repin`).

How this compares with real engines: vLLM's native CPU offloading (`OffloadingConnector`,
`--kv-offloading-size` in GiB) and LMCache copy every completed block to host memory as it is
produced (write-through), so their CPU tier also holds copies of GPU-resident blocks; a victim
tier of the same size holds more distinct blocks. The device-to-host copy on eviction is not
charged: those engines run it asynchronously, overlapped with compute. The host-to-device load
is charged (see `HostTierConfig.transfer_s`), in the step that schedules the request's first
chunk, as a synchronous load would delay it.

Capacity and bandwidth: `host_kv_bytes` is the replica's whole host buffer (all tensor-parallel
ranks together, like `--kv-offloading-size`), so it holds `host_kv_bytes // block_bytes` blocks
where a block's bytes are `block_size * kv_bytes_per_token` of the unsharded model. Each rank
moves its own shard over its own PCIe link in parallel, so a block loads in
`block_bytes / (tp * host_link_bytes_s)`; `host_link_bytes_s` is the catalog's sustained
per-direction PCIe figure (`engines/catalog/gpus.py`: ~80% of the Gen3 / Gen4 / Gen5 x16 link
rate, the usual pinned-memory `cudaMemcpy` throughput).

Examples:
    >>> tier = HostTier(HostTierConfig(capacity_blocks=2, block_bytes=1 << 20, link_bytes_s=1e9))
    >>> tier.offer([11, 12, 13])   # 11 is the oldest: it falls out
    [11]
    >>> tier.prefix_run([12, 13, 99]), tier.hashes()
    (2, [12, 13])
    >>> round(tier.config.transfer_s(2), 6)
    0.002097
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice

from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.kv.victim_index import Protect, VictimIndex
from maserve_prefect.errors import ConfigError, SimulationError


@dataclass(frozen=True, slots=True)
class HostTierConfig:
    """Size and link of one replica's host KV tier.

    Attributes:
        capacity_blocks: blocks the host buffer holds (>= 1).
        block_bytes: one KV block's bytes, all tensor-parallel ranks together.
        link_bytes_s: host-to-device bytes per second for those bytes (all ranks' links).
    """

    capacity_blocks: int
    block_bytes: int
    link_bytes_s: float

    def __post_init__(self) -> None:
        if self.capacity_blocks < 1 or self.block_bytes < 1 or not self.link_bytes_s > 0:
            raise ConfigError(
                "host KV tier needs capacity_blocks >= 1, block_bytes >= 1 and link_bytes_s > 0, "
                f"got {self.capacity_blocks}, {self.block_bytes}, {self.link_bytes_s}; "
                "raise host_kv_bytes to at least one block"
            )

    @classmethod
    def of(
        cls, host_kv_bytes: int, model: ModelSpec, gpu: GpuSpec, block_size: int, tp: int = 1
    ) -> HostTierConfig:
        """The tier `host_kv_bytes` gives a replica of `model` on `tp` GPUs of kind `gpu`.

        Raises:
            ConfigError: the bytes hold no block.

        Examples:
            >>> from maserve_prefect.engines.catalog import get_gpu, get_model
            >>> cfg = HostTierConfig.of(8 << 30, get_model("Qwen3-8B"), get_gpu("H100"), 16)
            >>> cfg.capacity_blocks, cfg.block_bytes
            (3640, 2359296)
        """
        block_bytes = block_size * model.kv_bytes_per_token
        if host_kv_bytes < block_bytes:
            raise ConfigError(
                f"host_kv_bytes={host_kv_bytes} holds no {block_size}-token KV block of "
                f"{model.name} ({block_bytes} bytes); raise it or set it to 0 (no host tier)"
            )
        return cls(host_kv_bytes // block_bytes, block_bytes, tp * gpu.host_link_bytes_s)

    def transfer_s(self, num_blocks: int) -> float:
        """Seconds to load `num_blocks` blocks from host memory onto the GPU."""
        return num_blocks * self.block_bytes / self.link_bytes_s


class HostTier:
    """The LRU of host-resident block hashes (see the module docstring)."""

    __slots__ = (
        "_index",
        "_lru",
        "config",
        "num_dropped",
        "num_hit_tokens",
        "num_loaded",
        "num_stored",
        "num_superseded",
        "on_change",
    )

    def __init__(self, config: HostTierConfig) -> None:
        self.config = config
        self._lru: OrderedDict[int, None] = OrderedDict()  # oldest first
        # the victim order while retention pins exist (None: plain LRU)
        self._index: VictimIndex | None = None
        # told of every change: (True, hashes stored) / (False, hashes removed); None: nobody
        self.on_change: Callable[[bool, list[int]], None] | None = None
        self.num_stored = 0
        self.num_loaded = 0
        self.num_superseded = 0
        self.num_dropped = 0
        self.num_hit_tokens = 0  # prompt tokens admissions loaded from here (CPU-tier hits)

    # -- views -----------------------------------------------------------------------------

    @property
    def protect(self) -> Protect | None:
        """hash -> (pin level, retention priority) while retention pins exist, else None."""
        return self._index.protect if self._index is not None else None

    @property
    def capacity_blocks(self) -> int:
        return self.config.capacity_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.config.capacity_blocks - len(self._lru)

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def hashes(self) -> list[int]:
        """Resident hashes, least recently used first."""
        return list(self._lru)

    def resident_among(self, hashes: Iterable[int]) -> list[int]:
        """Which of `hashes` are resident here, in their order (a C-level filter: a harness
        asks about tens of thousands of hashes at once)."""
        return list(filter(self._lru.__contains__, hashes))

    def prefix_run(self, hashes: Sequence[int]) -> int:
        """How many leading `hashes` are resident here."""
        n = 0
        lru = self._lru
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def any_of(self, hashes: Iterable[int]) -> bool:
        lru = self._lru
        return any(h in lru for h in hashes)

    # -- changes ---------------------------------------------------------------------------

    def offer(self, hashes: Iterable[int]) -> list[int]:
        """Store hashes the GPU evicted (most recent last); returns those dropped to make room,
        in drop order (they are resident in no tier any more)."""
        lru = self._lru
        hs = list(hashes)
        if any(map(lru.__contains__, hs)):  # some stored already: now the most recent
            for h in hs:
                if h in lru:
                    lru.move_to_end(h)
                else:
                    lru[h] = None
                    self.num_stored += 1
        else:  # the usual case (a hash lives in one tier): one C-level update
            lru.update(dict.fromkeys(hs))
            self.num_stored += len(hs)
        index = self._index
        if index is not None:
            index.stored(hs)
        if self.on_change is not None:
            self.on_change(True, hs)
        excess = len(lru) - self.config.capacity_blocks
        if excess <= 0:
            return []
        if index is None:
            dropped = list(islice(lru, excess))  # the least recently used
        else:
            dropped = index.evict(excess)
            if len(dropped) < excess:
                raise SimulationError(
                    f"host KV tier over capacity: {len(lru)} hashes in "
                    f"{self.config.capacity_blocks} blocks and the rest pinned by requirement; "
                    "requirement pins in the host tier must fit its capacity"
                )
        deque(map(lru.__delitem__, dropped), maxlen=0)  # C-level loop: drops are many
        self.num_dropped += len(dropped)
        if self.on_change is not None:
            self.on_change(False, dropped)
        return dropped

    def set_protection(self, protect: Protect | None) -> None:
        """Evict by the retention rule with `protect` (hash -> (level, priority)), or by plain
        LRU when None (no pins). Indexes every resident hash when pins first appear."""
        if protect is None:
            self._index = None
        elif self._index is None:
            self._index = VictimIndex(protect)
            self._index.build(self._lru)
        else:
            self._index.protect = protect

    def repin(self, hashes: Iterable[int]) -> None:
        """The pins of `hashes` changed (the retention table's `_refresh`)."""
        if self._index is not None:
            self._index.repinned(hashes)

    def take(self, hashes: Sequence[int]) -> None:
        """Remove hashes being loaded onto the GPU (each must be resident)."""
        lru = self._lru
        for h in hashes:
            del lru[h]
        if self._index is not None:
            self._index.removed(hashes)
        self.num_loaded += len(hashes)
        if self.on_change is not None:
            self.on_change(False, list(hashes))

    def supersede(self, hashes: Iterable[int]) -> int:
        """Drop host copies of hashes the GPU now caches (recomputed); returns how many."""
        lru = self._lru
        common = list(filter(lru.__contains__, hashes))
        deque(map(lru.__delitem__, common), maxlen=0)
        if self._index is not None and common:
            self._index.removed(common)
        self.num_superseded += len(common)
        if common and self.on_change is not None:
            self.on_change(False, common)
        return len(common)

    def clear(self) -> list[int]:
        """Forget everything (counted as dropped); returns what was resident."""
        gone = list(self._lru)
        self._lru.clear()
        if self._index is not None:
            self._index.build(())
        self.num_dropped += len(gone)
        if self.on_change is not None:
            self.on_change(False, gone)
        return gone

    def check_invariants(self) -> None:
        """Within capacity; every stored hash accounted for."""
        n = len(self._lru)
        if n > self.config.capacity_blocks:
            raise SimulationError(
                f"host KV tier holds {n} blocks, capacity {self.config.capacity_blocks}"
            )
        gone = self.num_loaded + self.num_superseded + self.num_dropped
        if self.num_stored != n + gone:
            raise SimulationError(
                f"host KV tier miscounts: stored {self.num_stored} != resident {n} + loaded "
                f"{self.num_loaded} + superseded {self.num_superseded} + dropped "
                f"{self.num_dropped}"
            )
