"""Tiny synthetic traces for replay tests that need no native run (`make_trace`: chains of
tools and a model op; `make_dag_trace`: any DAG of model and tool ops per root), and wall-clock
replica factories: simulated replicas paced on the replay's wall clock stand in for a server (the
real vLLM runs in the integration tests)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from maserve_prefect.clock import WallClock
from maserve_prefect.engines.sim.cost.step_time import make_step_model
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.trace.model import (
    Dep,
    EdgeKind,
    GenerationSettings,
    Manifest,
    OpKind,
    OpRecord,
    RootRecord,
    StageRecord,
    Trace,
)


def make_trace(
    num_roots: int = 2,
    *,
    tool_s: Sequence[float] = (1.0, 2.0),
    model_tokens: tuple[int, int] | None = None,
    workflow: str = "toy",
) -> Trace:
    """Roots of a chain `a -> b` (tools of the given durations), optionally `-> m` (a model op
    with (input, output) tokens, length-locked)."""
    roots, stages, ops = [], [], []
    for i in range(num_roots):
        r = f"r{i}"
        roots.append(RootRecord(root_id=r, workflow=workflow, arrival_s=float(i)))
        for name in ("s1", "s2"):
            stages.append(StageRecord(stage_id=f"{r}/{name}", root_id=r, name=name))
        a = OpRecord(op_id=f"{r}/a", root_id=r, stage_id=f"{r}/s1", kind=OpKind.TOOL,
                     tool_name="t", tool_duration_s=tool_s[0])  # fmt: skip
        b = OpRecord(op_id=f"{r}/b", root_id=r, stage_id=f"{r}/s2", kind=OpKind.TOOL,
                     tool_name="t", tool_duration_s=tool_s[1])  # fmt: skip
        ops += [a, b]
        if model_tokens is not None:
            ops.append(
                OpRecord(
                    op_id=f"{r}/m",
                    root_id=r,
                    stage_id=f"{r}/s2",
                    kind=OpKind.MODEL,
                    deps=(Dep(op_id=f"{r}/a", kind=EdgeKind.DATA),),
                    generation=GenerationSettings(deployment="main"),
                    num_input_tokens=model_tokens[0],
                    num_output_tokens=model_tokens[1],
                )
            )
    return Trace(manifest=Manifest(trace_id="toy"), roots=roots, stages=stages, ops=ops)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op of a `make_dag_trace` root: a model op of `deployment` with (input, output)
    `tokens`, or a tool op of `tool_s` seconds when `deployment` is ""; `deps` are
    `(op name, edge kind, required)` of earlier ops of the same root."""

    name: str
    deps: tuple[tuple[str, EdgeKind, bool], ...] = ()
    deployment: str = ""
    tokens: tuple[int, int] = (64, 8)
    tool_s: float = 1.0


def make_dag_trace(
    roots: Mapping[str, Sequence[OpSpec]], arrival_s: Mapping[str, float] | None = None
) -> Trace:
    """A trace of the given roots (op ids `root/name`, one stage per root), length-locked model
    ops, roots arriving at `arrival_s` (default 0)."""
    records, stages, ops = [], [], []
    for r, specs in roots.items():
        records.append(
            RootRecord(root_id=r, workflow="dag", arrival_s=(arrival_s or {}).get(r, 0.0))
        )
        stages.append(StageRecord(stage_id=f"{r}/s", root_id=r, name="s"))
        for spec in specs:
            deps = tuple(
                Dep(op_id=f"{r}/{d}", kind=kind, required=required)
                for d, kind, required in spec.deps
            )
            common = dict(op_id=f"{r}/{spec.name}", root_id=r, stage_id=f"{r}/s", deps=deps)
            if spec.deployment:
                op = OpRecord(**common, kind=OpKind.MODEL,  # type: ignore[arg-type]
                              generation=GenerationSettings(deployment=spec.deployment),
                              num_input_tokens=spec.tokens[0],
                              num_output_tokens=spec.tokens[1])  # fmt: skip
            else:
                op = OpRecord(**common, kind=OpKind.TOOL, tool_name="t",  # type: ignore[arg-type]
                              tool_duration_s=spec.tool_s)  # fmt: skip
            ops.append(op)
    return Trace(manifest=Manifest(trace_id="dag"), roots=records, stages=stages, ops=ops)


Factory = Callable[[WallClock, Sequence[str]], tuple[Sequence[object], Callable[[], None]]]


def paced_sim(
    clock: WallClock, deployments: Sequence[str]
) -> tuple[list[SimReplica], Callable[[], None]]:
    """One simulated replica per deployment, paced on the run's wall clock."""
    model = make_step_model("Qwen3-0.6B", "H100")
    reps = [SimReplica(clock, model, 2000, name=f"wall-{d}", deployment=d) for d in deployments]
    return reps, lambda: None


def scaled(scale: float) -> Factory:
    """`paced_sim` with the run's clock slowed: 1 simulated second takes `scale` wall seconds."""

    def factory(
        clock: WallClock, deployments: Sequence[str]
    ) -> tuple[Sequence[object], Callable[[], None]]:
        clock.scale = scale
        return paced_sim(clock, deployments)

    return factory


class Wrapped:
    """A paced simulated replica that rejects the requests named in `reject` and can hide its
    token-id support."""

    def __init__(self, inner: SimReplica, reject: set[str], token_ids: bool = True) -> None:
        self.inner, self.reject, self.token_ids = inner, reject, token_ids
        self.name, self.deployment = inner.name, inner.deployment

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)

    def capabilities(self) -> Capabilities:
        caps = self.inner.capabilities()
        return dataclasses.replace(
            caps, accepts_token_ids=caps.accepts_token_ids and self.token_ids
        )

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket:
        if request.request_id in self.reject:
            return Ticket(request.request_id, Acceptance.REJECTED, "test rejects it")
        return self.inner.submit(request, controls)


def wrapped(reject: Sequence[str] = (), *, token_ids: bool = True) -> Factory:
    """`paced_sim` replicas wrapped in `Wrapped`."""

    def factory(
        clock: WallClock, deployments: Sequence[str]
    ) -> tuple[Sequence[object], Callable[[], None]]:
        reps, close = paced_sim(clock, deployments)
        return [Wrapped(r, set(reject), token_ids) for r in reps], close

    return factory
