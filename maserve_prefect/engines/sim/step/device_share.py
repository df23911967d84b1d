"""Replicas that share a device share its compute: processor sharing of steps on the clock.

The model (egalitarian processor sharing, the way the CUDA driver time-slices processes): a
step's cost-model duration `d` is the work it needs at the device's full speed. While `k`
replicas on a device have a step in flight, each step there advances at `1/k` of full speed; a
replica spanning several devices (tp > 1) advances at the rate of its most contended device,
`1/max(k_d)`, since its ranks synchronise every layer. So a device's replicas together never do
more than one device-second of work per second, and two replicas on one device each run slower
than alone while their pair never out-serves the device.

Exact and deterministic on the event clock: a step in flight keeps an end time and its stretch
factor `f` (`max k_d` over its devices). Whenever a step starts or ends, every other step in
flight on the devices it touches whose factor changed is re-timed at that instant,
`end' = now + (end - now) / f * f'` (the remaining work, at the new rate), and its end event is
moved. A step whose factor stays 1 is never re-timed and ends at exactly `start + d`, the sum an
unshared replica computes, so a replica alone on its device gives bit-identical results.

Fast-forwarded runs (`loop.py`) assume nothing outside the replica moves their step ends, so a
replica plans a run of several steps only while no other replica on its devices is busy, and
when another starts a step beside a run in flight, the run is first cut to the step in progress
(the lane's `on_shared` hook, as an arrival cuts it); only that one step is then stretched.

Not shared: a `CachePrepare` host-to-GPU load between steps and lifecycle transfers (weights
over disk / PCIe) hold a replica but not the device's compute, so they run at full speed.

Examples:
    >>> from maserve_prefect.clock.kernel import Kernel
    >>> k, ends = Kernel(), []
    >>> share = DeviceShare(k)
    >>> a = share.lane("a", ("A100:0",))
    >>> b = share.lane("b", ("A100:0",))
    >>> a.start(0.0, 1.0, lambda: ends.append(("a", k.now())))
    >>> _ = k.call_at(0.5, lambda: b.start(0.5, 1.5, lambda: ends.append(("b", k.now()))))
    >>> k.run()
    >>> ends   # a: 0.5 alone + 0.5 work at half speed; b: 0.5 at half speed, then alone
    [('a', 1.5), ('b', 2.0)]
"""

from __future__ import annotations

from collections.abc import Callable

from maserve_prefect.clock import NORMAL, Cancellable
from maserve_prefect.clock.kernel import Kernel

__all__ = ["DeviceShare", "Lane"]


def _nothing() -> None:
    return None


class DeviceShare:
    """The devices of one pool and the steps in flight on each (module docstring).

    Args:
        clock: the kernel the replicas' steps run on.
    """

    def __init__(self, clock: Kernel) -> None:
        self.clock = clock
        self._busy: dict[str, list[Lane]] = {}  # device -> lanes with a step in flight

    def lane(
        self, name: str, devices: tuple[str, ...], on_shared: Callable[[], None] = _nothing
    ) -> Lane:
        """A replica's lane on `devices`; `on_shared()` is called when a step beside its step in
        flight makes that step share the device (the replica cuts a fast-forwarded run there)."""
        for d in devices:
            self._busy.setdefault(d, [])
        return Lane(self, name, devices, on_shared)

    def num_busy(self, device: str) -> int:
        """Replicas with a step in flight on `device` now."""
        return len(self._busy.get(device, ()))

    def _factor(self, lane: Lane) -> int:
        return max(len(self._busy[d]) for d in lane.devices)

    def _neighbours(self, lane: Lane) -> list[Lane]:
        """Other lanes in flight on `lane`'s devices, each once, in a fixed order."""
        out: list[Lane] = []
        for d in lane.devices:
            for other in self._busy[d]:
                if other is not lane and other not in out:
                    out.append(other)
        return out

    def _retime(self, lanes: list[Lane]) -> None:
        now = self.clock.now()
        for lane in lanes:
            f = self._factor(lane)
            if f == lane.factor:
                continue
            if lane.factor == 1:
                lane.on_shared()  # may cut a run in flight (`Lane.move_end`) while still alone
            lane.end_s = now + (lane.end_s - now) / lane.factor * f
            lane.factor = f
            lane.reschedule()


class Lane:
    """One replica's steps on its device(s): at most one step (or run) in flight at a time."""

    __slots__ = ("_fire", "devices", "end_s", "factor", "handle", "name", "on_shared", "share")

    def __init__(
        self, share: DeviceShare, name: str, devices: tuple[str, ...], on_shared: Callable[[], None]
    ) -> None:
        self.share = share
        self.name = name
        self.devices = devices
        self.on_shared = on_shared
        self.end_s = 0.0
        self.factor = 0  # 0 = no step in flight
        self.handle: Cancellable | None = None
        self._fire: Callable[[], None] = _nothing

    @property
    def in_flight(self) -> bool:
        return self.factor > 0

    def alone(self) -> bool:
        """No other replica has a step in flight on this lane's devices."""
        busy = self.share._busy
        return all(not busy[d] or busy[d] == [self] for d in self.devices)

    def start(self, now: float, end_s: float, fire: Callable[[], None]) -> None:
        """Begin a step (or run) that needs `end_s - now` seconds of full-speed work; `fire()`
        runs when it ends (stretched while the device is shared)."""
        assert not self.in_flight, f"{self.name}: a step is already in flight"
        share = self.share
        for d in self.devices:
            share._busy[d].append(self)
        share._retime(share._neighbours(self))
        self._fire = fire
        self.factor = share._factor(self)
        self.end_s = end_s if self.factor == 1 else now + (end_s - now) * self.factor
        self.reschedule()

    def move_end(self, end_s: float) -> None:
        """A cut run ends at `end_s` (its unstretched end: only while the step is alone)."""
        assert self.factor == 1, f"{self.name}: a run was cut while its device is shared"
        self.end_s = end_s
        self.reschedule()

    def reschedule(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle = self.share.clock.call_at(self.end_s, self._end, NORMAL, self.name)

    def _end(self) -> None:
        share = self.share
        self.handle = None
        self.factor = 0
        for d in self.devices:
            share._busy[d].remove(self)
        share._retime(share._neighbours(self))
        fire, self._fire = self._fire, _nothing
        fire()
