"""Capability discovery: what one engine can honour, in HEAR's terms.

One idea: the engine seam's `Capabilities` plus HEAR's extras (cache controls prepare / retain /
release, KV tiers, waiting-time requirements) give one `HearCapabilities`, and one predicate —
`support_reason(control, caps)` — decides whether a single control (not its fallbacks) can be
honoured. `force.resolve` (engine side) and `usable` (harness side) both use that predicate, so
the two sides never disagree about support.

`usable(controls, caps)` lets a harness send only what the engine supports: a control is sent
when it or one of its explicitly allowed fallbacks is supported; otherwise it is withheld with a
reason. A withheld *requirement* makes `Usable.ok` False — the harness must answer that request
UNSUPPORTED itself (as `Channel.submit` does), never drop it in silence.

Fallbacks are not chained: a fallback control's own `fallback` tuple is ignored.

Examples:
    >>> from maserve_prefect.protocol.capabilities import Capabilities
    >>> base = Capabilities((ExecutionMode,), True, True, False, True, False, (), ("default",))
    >>> caps = HearCapabilities.from_engine(base, cache_controls={CacheOp.RETAIN})
    >>> support_reason(ExecutionMode("default"), caps)
    ''
    >>> support_reason(ExecutionMode("eager"), caps)
    "mode 'eager' is not among the engine's modes ('default',)"
    >>> u = usable([ExecutionMode("eager", fallback=("default",)), Priority(1)], caps)
    >>> [type(c).__name__ for c in u.send], u.ok
    (['ExecutionMode'], True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from maserve_prefect.errors import ConfigError, RequestError
from maserve_prefect.protocol.controls import (
    CacheOp,
    CachePrepare,
    CacheRelease,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    MaxWait,
    Priority,
    Tier,
)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can honour; a control type not listed is unsupported."""

    control_types: tuple[type[Control], ...]
    accepts_token_ids: bool
    length_lock: bool
    priority_scheduling: bool
    prefix_caching: bool
    kv_events: bool
    sleep_levels: tuple[int, ...]
    modes: tuple[str, ...]
    max_model_len: int | None = None
    """The longest prompt + output a request may have (vLLM's `max_model_len`); None: unknown."""


_CACHE_TYPES: dict[CacheOp, type[Control]] = {
    CacheOp.PREPARE: CachePrepare,
    CacheOp.RETAIN: CacheRetain,
    CacheOp.RELEASE: CacheRelease,
}


@dataclass(frozen=True, slots=True)
class HearCapabilities:
    """One engine's HEAR capabilities. Build with `from_engine`."""

    engine: Capabilities
    control_types: tuple[type[Control], ...]
    modes: tuple[str, ...]
    cache_controls: frozenset[CacheOp]
    kv_tiers: tuple[Tier, ...]
    waiting_requirements: bool
    priority_scheduling: bool

    @classmethod
    def from_engine(
        cls,
        caps: Capabilities,
        *,
        cache_controls: Iterable[CacheOp] | None = None,
        kv_tiers: Iterable[Tier] | None = None,
        waiting_requirements: bool | None = None,
    ) -> HearCapabilities:
        """Derive HEAR capabilities from the engine seam's, plus the extras the engine declares.

        Each extra defaults to what `caps.control_types` implies (a cache control type listed
        means that op is supported; `MaxWait` listed means waiting requirements are);
        `kv_tiers` defaults to GPU when the engine does prefix caching. Declared extras add their
        control types.

        Raises:
            ConfigError: cache controls are declared but the engine has no KV tier.
        """
        types = list(caps.control_types)
        if cache_controls is None:
            ops = frozenset(op for op, t in _CACHE_TYPES.items() if t in types)
        else:
            ops = frozenset(cache_controls)
        tiers = tuple(sorted(set(kv_tiers))) if kv_tiers is not None else None
        if tiers is None:
            tiers = (Tier.GPU,) if caps.prefix_caching else ()
        waiting = MaxWait in types if waiting_requirements is None else waiting_requirements
        if ops and not tiers:
            raise ConfigError(
                f"cache controls {sorted(o.value for o in ops)} need at least one KV tier; "
                "declare kv_tiers or enable prefix caching"
            )
        for op in sorted(ops, key=lambda o: o.value):
            if _CACHE_TYPES[op] not in types:
                types.append(_CACHE_TYPES[op])
        if waiting and MaxWait not in types:
            types.append(MaxWait)
        return cls(
            engine=caps,
            control_types=tuple(types),
            modes=tuple(caps.modes),
            cache_controls=ops,
            kv_tiers=tiers,
            waiting_requirements=waiting,
            priority_scheduling=caps.priority_scheduling,
        )


def support_reason(control: Control, caps: HearCapabilities) -> str:
    """Why `caps` cannot honour `control` itself (fallbacks not considered); "" if it can."""
    name = type(control).__name__
    if not isinstance(control, tuple(caps.control_types)):
        known = ", ".join(t.__name__ for t in caps.control_types) or "none"
        return f"{name} is not among the engine's control types ({known})"
    if isinstance(control, ExecutionMode) and control.mode not in caps.modes:
        return f"mode {control.mode!r} is not among the engine's modes {caps.modes}"
    if isinstance(control, Priority) and not caps.priority_scheduling:
        return "the engine does not schedule by priority"
    if isinstance(control, MaxWait) and not caps.waiting_requirements:
        return "the engine does not take waiting-time requirements"
    for op, t in _CACHE_TYPES.items():
        if isinstance(control, t) and op not in caps.cache_controls:
            return f"the engine does not support cache {op.value}"
    if isinstance(control, CachePrepare | CacheRetain) and control.tier not in caps.kv_tiers:
        return f"KV tier {control.tier.name} is not among the engine's tiers {caps.kv_tiers}"
    return ""


def alternatives(control: Control) -> tuple[Control, ...]:
    """`control` then its allowed fallbacks, in order, each as a plain control.

    A fallback is a `Control`, or for `ExecutionMode` a mode name. Fallbacks are not chained.

    Raises:
        RequestError: a fallback is neither (names the control and the entry).
    """
    out = [control]
    for entry in control.fallback:
        if isinstance(entry, Control):
            out.append(dataclasses.replace(entry, fallback=()))
        elif isinstance(control, ExecutionMode) and isinstance(entry, str):
            out.append(dataclasses.replace(control, mode=entry, fallback=()))
        else:
            raise RequestError(
                f"{control!r}: fallback entry {entry!r} is neither a Control nor (for "
                "ExecutionMode) a mode name"
            )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Usable:
    """`usable`'s answer: the controls to send and the ones withheld (with reasons)."""

    send: tuple[Control, ...]
    withheld: tuple[tuple[Control, str], ...] = ()

    @property
    def ok(self) -> bool:
        """False when a requirement was withheld: the request must be answered UNSUPPORTED."""
        return not any(c.force is Force.REQUIREMENT for c, _ in self.withheld)


def usable(controls: Sequence[Control], caps: HearCapabilities) -> Usable:
    """Split `controls` into those `caps` can honour (directly or by a fallback) and the rest.

    Examples:
        >>> caps = HearCapabilities.from_engine(
        ...     Capabilities((), True, True, False, False, False, (), ("default",)))
        >>> u = usable([Priority(1, force=Force.REQUIREMENT)], caps)
        >>> u.ok, u.withheld[0][1]
        (False, "Priority is not among the engine's control types (none)")
    """
    send: list[Control] = []
    withheld: list[tuple[Control, str]] = []
    for c in controls:
        reasons = [support_reason(a, caps) for a in alternatives(c)]
        if any(r == "" for r in reasons):
            send.append(c)
        else:
            withheld.append((c, "; ".join(reasons)))
    return Usable(tuple(send), tuple(withheld))
