"""How many replicas a HEAR suite's pool gets: the smallest that meets a stated TTFT SLO.

One idea: the pool size is a *rule*, fixed before any policy is compared, never a number picked
for a result. `SizingRule` states it — at load fraction `load`, under policy `policy` (FCFS),
the `ttft_quantile`-th percentile of TTFT must be at most `ttft_slo_s` — and `size_pool` finds
the smallest number of devices (1, 2, 3, ... up to `max_devices`) whose replay of that load level
meets it. Every arm and load then runs on that many devices. The sweep is linear from one device,
so the answer is the smallest size by definition (TTFT need not be monotone in the pool size,
which a bisection would assume); each step is one FCFS replay, returned as a `SizingStep` row
so the suite prints the whole sweep beside its tables.

Why these defaults (`deployments/suites/hear_mooncake.yaml` states them): the trace's prompts
average ~15k tokens and the longest take ~25 s to prefill alone on one RTX PRO 6000, so an SLO
on the very tail (p99, max) cannot be met at any size; p90 leaves that tail out. A p90 TTFT of
10 s is an interactive-but-long-prompt target; the printed sweep shows how wide the band of SLOs
is that gives the same size (on the synthetic trace, any p90 SLO between ~4 s and ~80 s).

Examples:
    >>> rule = SizingRule.from_config({"load": 0.5, "ttft_quantile": 90, "ttft_slo_s": 10})
    >>> rule.policy, rule.max_devices
    ('fcfs', 16)
    >>> rule.describe()
    'smallest pool where fcfs p90 TTFT <= 10 s at 50% load'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from maserve_prefect.bench.hear.arms import make_pool, parse_arm, run_arm
from maserve_prefect.errors import ConfigError
from maserve_prefect.workloads.sessions import SessionSet

__all__ = ["SizingRule", "SizingStep", "size_pool"]


@dataclass(frozen=True, slots=True)
class SizingRule:
    """The pool-size rule (module docstring).

    Raises:
        ConfigError: a load outside (0, 1], a quantile outside (0, 100], an SLO that is not
            positive, or `max_devices < 1`.
    """

    load: float
    ttft_quantile: float
    ttft_slo_s: float
    policy: str = "fcfs"
    max_devices: int = 16

    def __post_init__(self) -> None:
        if not 0 < self.load <= 1:
            raise ConfigError(f"pool.sizing.load must be in (0, 1], got {self.load}")
        if not 0 < self.ttft_quantile <= 100:
            raise ConfigError(
                f"pool.sizing.ttft_quantile must be in (0, 100], got {self.ttft_quantile}"
            )
        if not self.ttft_slo_s > 0:
            raise ConfigError(f"pool.sizing.ttft_slo_s must be > 0, got {self.ttft_slo_s}")
        if self.max_devices < 1:
            raise ConfigError(f"pool.sizing.max_devices must be >= 1, got {self.max_devices}")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> SizingRule:
        """The rule from a suite's `pool.sizing` mapping.

        Raises:
            ConfigError: a missing or unknown key, or a bad value.
        """
        need = {"load", "ttft_quantile", "ttft_slo_s"}
        known = need | {"policy", "max_devices"}
        if missing := need - set(cfg):
            raise ConfigError(f"pool.sizing lacks {sorted(missing)}; it needs {sorted(need)}")
        if unknown := set(cfg) - known:
            raise ConfigError(f"pool.sizing: unknown keys {sorted(unknown)}; use {sorted(known)}")
        return cls(
            float(cfg["load"]),
            float(cfg["ttft_quantile"]),
            float(cfg["ttft_slo_s"]),
            str(cfg.get("policy", "fcfs")),
            int(cfg.get("max_devices", 16)),
        )

    def describe(self) -> str:
        return (
            f"smallest pool where {self.policy} p{self.ttft_quantile:g} TTFT <= "
            f"{self.ttft_slo_s:g} s at {self.load:.0%} load"
        )


@dataclass(frozen=True, slots=True)
class SizingStep:
    """One size tried: its TTFT at the rule's quantile (and p50) and whether it meets the SLO."""

    num_devices: int
    ttft_quantile_s: float
    ttft_p50_s: float
    makespan_s: float
    reuse: float
    meets_slo: bool

    def row(self) -> dict[str, Any]:
        return asdict(self)


def size_pool(
    sset: SessionSet,
    rule: SizingRule,
    *,
    gpu: str,
    model: str,
    host_kv_gib: float,
    scheduler: Mapping[str, Any] | None = None,
) -> tuple[int, list[SizingStep]]:
    """The smallest device count whose `rule.policy` replay of `sset` meets the SLO.

    Args:
        sset: the workload at the rule's load level.

    Returns:
        (devices, the sweep's steps in order; the last one met the SLO).

    Raises:
        ConfigError: no size up to `rule.max_devices` meets it (the message shows the sweep).
    """
    arm = parse_arm(rule.policy, rule.policy)
    steps: list[SizingStep] = []
    for n in range(1, rule.max_devices + 1):
        sched = {**(scheduler or {}), "policy": arm.engine_policy}
        res = run_arm(sset, arm, make_pool(gpu, model, n, host_kv_gib, sched)).result
        q = res.ttft_percentile(rule.ttft_quantile)
        step = SizingStep(n, q, res.ttft_percentile(50), res.makespan_s, res.reuse,
                          q <= rule.ttft_slo_s)  # fmt: skip
        steps.append(step)
        if step.meets_slo:
            return n, steps
    tried = ", ".join(f"{s.num_devices}: {s.ttft_quantile_s:.1f} s" for s in steps)
    raise ConfigError(
        f"no pool of 1..{rule.max_devices} x {gpu} meets the sizing rule ({rule.describe()}); "
        f"p{rule.ttft_quantile:g} TTFT by size: {tried}. Raise pool.sizing.max_devices or "
        "state a looser SLO in the suite YAML"
    )
