"""Scenario files: what a replay experiment holds fixed and which arms it compares (YAML, pydantic).

One idea: a scenario binds a trace set to root arrivals and lists *arms* that differ only in
release rule, pool or plan; everything the comparison depends on — arrivals and their seeds, the
model-input contract, the measurement window, the per-class deadlines — is fixed in the file (or
computed and locked once, before any arm runs). Errors name the file and the field.

    name: fj-barrier
    cohorts:                       # one or more trace sets; several get id prefixes "<name>/"
      - {name: target, role: target, bundle: out/fj}             # a bundle folder, or:
      # - {name: mc, mooncake: requests.jsonl}  # a Mooncake JSONL (arrivals: {kind: trace},
      #                                         # lock: length), or:
      - {name: bg, role: background, native: {workflow: fork_join, users: 4, seed: 1}}
      # native: {..., pool: my_pool.yaml} realizes on that pool (default: the shipped one)
    placement: interleaved         # target roots spread over the slots, or `clustered`,
                                   # `round_robin` / `concatenated` (fixed global slots, below)
    arrivals: {kind: poisson, rate_per_s: 0.5, seed: 0}   # burst | explicit | trace | closed_loop
                                   # | slots
    lock: token                    # token | length (model-input contract)
    initial_state: drained         # each arm starts on a fresh pool / a drained server
    window: {start_s: 0.0, end_s: null}                   # roots arriving in it are measured
    deadlines: {classes: {fork_join: 30.0}, reference: {factor: 1.5, quantile: 0.95}}
    blocks: 2                      # paired blocks, arm order alternating, fresh seed per block
    timeout_s: 600                 # wall-clock limit per arm run on a real engine (sim: unused)
    arms:
      - {name: dag, release: dag}
      - {name: barrier, release: barrier, barrier: [{before: analyst_a, after: analyst_b}]}
      - name: turns                # op edges relative to a root, applied in every root
        release: barrier
        barrier: [{src: research.child0/0, dst: research.child1/0, each_root: true}]
      - {name: flat, release: flat, pool: my_pool.yaml, plan: fcfs,
         overrides: {main: {max_num_seqs: 8, gpu_memory_utilization: 0.5}}}

Relative paths (bundles, pool files) are resolved against the scenario file's folder.

Fixed global arrival slots (seed paper App. G.1): `placement: round_robin` or `concatenated`
puts the target roots first, then the background grouped by workflow class in lexicographic
order — round-robin across the classes (`round_robin`, the paper's interleaved A) or one class
after another (`concatenated`, the clustered B); within a class, its cohorts alternate (each
cohort's roots keep their recorded order) and block b rotates the cohort order by b (the paper's
block rotation of bindings). `arrivals: {kind: slots, target_start_s, target_step_s,
background_start_s, background_step_s}` times those slots. An arm may set its own `placement`,
so two arms of one scenario replay the same traces with only the background mapping changed
(`replay.traceset.place_fixed_slots`).

Every number must be finite (`.inf` / `.nan` are refused: an infinite rate or an arrival at
infinity would never end the run), a measurement window must end after it starts, a uniform
think time needs `low_s <= high_s`, and a deadline must name a class some root of the trace set
has (checked when the scenario runs, `replay.arms.check_deadline_classes`).

A `barrier` entry takes one of three forms (`BarrierSpec`): `before` + `after` stage names (every
root; `root_id` restricts it to one), `src` + `dst` op ids (one root's ops), or `src` + `dst` op
ids relative to a root with `each_root: true` (`trace.barrier.PerRootEdge`: one edge in every
root that realized both ops, so the barrier does not depend on the trace set's size). Whether the
ops exist is checked against the trace set when the scenario runs (`replay.arms.arm_barrier`).

On a real engine (`engine: openai:URL`) every arm replay — and the deadline reference replay — runs
in wall time under `timeout_s` (default `DEFAULT_WALL_TIMEOUT_S`): a stuck op ends the arm with
its unfinished ops and roots reported, never a hang. The simulator runs in virtual time, where
nothing can hang, and ignores the field.

Examples:
    >>> s = Scenario.model_validate({"name": "x", "cohorts": [{"name": "t", "bundle": "b"}],
    ...                              "arms": [{"name": "dag", "release": "dag"}]})
    >>> s.arrivals.kind, s.blocks
    ('burst', 1)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from maserve_prefect.engines.target import parse_engine
from maserve_prefect.errors import ConfigError, MaserveError
from maserve_prefect.trace.barrier import Barrier, BarrierEdge, PerRootEdge, StageBarrier
from maserve_prefect.trace.release import ReleaseRule
from maserve_prefect.workloads import arrivals as arr
from maserve_prefect.yamlfiles import read_yaml_mapping

DEFAULT_WALL_TIMEOUT_S = 1800.0
"""Wall-clock limit of one arm run on a real engine when the scenario sets no `timeout_s`: long
enough for a demo-scale arm on a slow server, short enough that a stuck op ends the run."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NativeRecipe(_Model):
    """Realize the trace set natively on the simulator first (`flows.native.run_native`), on
    `pool` (a pool file, relative to the scenario file; default: the shipped default pool) — the
    replay-vs-native comparison realizes on the pool its replay arms use."""

    workflow: str
    binding: str | None = None
    users: int = Field(default=1, ge=1)
    seed: int = 0
    pool: Path | None = None


class Cohort(_Model):
    """A trace set: a bundle folder, a native-run recipe, or a Mooncake JSONL request trace
    (`mooncake`: one single-call root per row, arriving at its `timestamp`,
    `trace.mooncake.import_mooncake`; a row that does not import is an error naming its line);
    `role` target or background."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    role: Literal["target", "background"] = "target"
    bundle: Path | None = None
    native: NativeRecipe | None = None
    mooncake: Path | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Cohort:
        if sum(x is not None for x in (self.bundle, self.native, self.mooncake)) != 1:
            raise ValueError("give exactly one of `bundle`, `native` or `mooncake`")
        return self


class Poisson(_Model):
    kind: Literal["poisson"]
    rate_per_s: float = Field(gt=0)
    seed: int = 0


class Burst(_Model):
    kind: Literal["burst"] = "burst"
    at_s: float = Field(default=0.0, ge=0)


class Explicit(_Model):
    kind: Literal["explicit"]
    times_s: tuple[Annotated[float, Field(ge=0)], ...] = Field(min_length=1)


class Slots(_Model):
    """Fixed global slots: targets from `target_start_s` every `target_step_s`, then the
    background from `background_start_s` every `background_step_s` (needs a fixed-slot
    placement, `round_robin` or `concatenated`)."""

    kind: Literal["slots"]
    target_start_s: float = Field(default=0.0, ge=0)
    target_step_s: float = Field(default=0.0, ge=0)
    background_start_s: float = Field(ge=0)
    background_step_s: float = Field(default=0.0, ge=0)


class FromTrace(_Model):
    kind: Literal["trace"]


class Think(_Model):
    dist: Literal["constant", "exponential", "uniform"] = "constant"
    value_s: float = Field(default=0.0, ge=0, description="constant value / exponential mean")
    low_s: float = Field(default=0.0, ge=0)
    high_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _ordered_bounds(self) -> Think:
        if self.dist == "uniform" and self.low_s > self.high_s:
            raise ValueError(
                f"uniform think time needs low_s <= high_s, got low_s={self.low_s} > "
                f"high_s={self.high_s}"
            )
        return self


class ClosedLoop(_Model):
    kind: Literal["closed_loop"]
    users: int = Field(ge=1)
    think_time: Think = Think()
    seed: int = 0


ArrivalSpec = Annotated[
    Poisson | Burst | Explicit | Slots | FromTrace | ClosedLoop, Field(discriminator="kind")
]

Placement = Literal["interleaved", "clustered", "round_robin", "concatenated"]
FIXED_SLOT_PLACEMENTS: tuple[str, ...] = ("round_robin", "concatenated")
"""Placements that put the targets first, as `kind: slots` arrivals need."""


def arrival_process(spec: ArrivalSpec, num_targets: int = 0) -> arr.ArrivalProcess:
    """The runtime arrival process of a parsed spec (`num_targets`: target slots, for
    `kind: slots`)."""
    if isinstance(spec, Slots):
        return arr.SlotArrivals(
            num_targets,
            spec.target_start_s,
            spec.target_step_s,
            spec.background_start_s,
            spec.background_step_s,
        )
    if isinstance(spec, Poisson):
        return arr.PoissonArrivals(spec.rate_per_s, spec.seed)
    if isinstance(spec, Burst):
        return arr.BurstArrivals(spec.at_s)
    if isinstance(spec, Explicit):
        return arr.ExplicitArrivals(tuple(spec.times_s))
    if isinstance(spec, FromTrace):
        return arr.TraceArrivals()
    t = spec.think_time
    think = (
        arr.ThinkTime("uniform", t.low_s, t.high_s)
        if t.dist == "uniform"
        else arr.ThinkTime(t.dist, t.value_s)
    )
    return arr.ClosedLoopArrivals(spec.users, think, spec.seed)


class BarrierSpec(_Model):
    """One barrier of an arm: a stage barrier (`before` / `after` stage names, `root_id` to
    restrict it to one root), an op edge (`src` / `dst` op ids), or, with `each_root: true`, an
    op edge relative to a root applied in every root (see the module docstring).

    Examples:
        >>> BarrierSpec(src="research.child0/0", dst="research.child1/0", each_root=True).to_release()
        PerRootEdge(src_op='research.child0/0', dst_op='research.child1/0')
    """

    before: str | None = None
    after: str | None = None
    root_id: str | None = None
    src: str | None = None
    dst: str | None = None
    each_root: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> BarrierSpec:
        stage = self.before is not None and self.after is not None
        edge = self.src is not None and self.dst is not None
        if self.each_root and not edge:
            raise ValueError(
                "`each_root: true` needs `src` + `dst`: op ids relative to each root, e.g. "
                "{src: research.child0/0, dst: research.child1/0, each_root: true}"
            )
        if stage == edge:
            raise ValueError(
                "give either `before` + `after` (stages), `src` + `dst` (op ids), or `src` + "
                "`dst` + `each_root: true` (op ids relative to each root)"
            )
        if edge and self.root_id is not None:
            raise ValueError(
                "`root_id` restricts a stage barrier; an op edge names its root in its op ids "
                "(`src` / `dst`), and `each_root: true` applies it in every root"
            )
        return self

    def to_release(self) -> Barrier:
        """The `trace.release` form of this barrier."""
        if self.src is not None and self.dst is not None:
            if self.each_root:
                return PerRootEdge(self.src, self.dst)
            return BarrierEdge(self.src, self.dst, "scenario")
        assert self.before is not None and self.after is not None
        return StageBarrier(self.before, self.after, self.root_id)


class DeploymentOverride(_Model):
    """Serving knobs an arm may change on one deployment of its pool."""

    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    kv_cache_gib: float | None = Field(default=None, gt=0)


class Arm(_Model):
    """One arm: a release rule on a pool with a plan; everything else is the scenario's."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    release: ReleaseRule = ReleaseRule.DAG
    barrier: tuple[BarrierSpec, ...] = ()
    pool: Path | None = None
    plan: str = "fcfs"
    overrides: dict[str, DeploymentOverride] = Field(default_factory=dict)
    placement: Placement | None = None
    """The arm's slot placement (None: the scenario's)."""

    @model_validator(mode="after")
    def _barrier_only_for_barrier(self) -> Arm:
        if self.barrier and self.release is not ReleaseRule.BARRIER:
            raise ValueError(f"`barrier` edges need `release: barrier`, not {self.release.value}")
        if self.release is ReleaseRule.BARRIER and not self.barrier:
            raise ValueError("`release: barrier` needs at least one `barrier` edge")
        return self


class Window(_Model):
    """Roots whose arrival offset lies in [start_s, end_s) are measured (end None: no end)."""

    start_s: float = Field(default=0.0, ge=0)
    end_s: float | None = None

    @model_validator(mode="after")
    def _ends_after_start(self) -> Window:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(
                f"the window must end after it starts, got start_s={self.start_s} >= "
                f"end_s={self.end_s}; swap them, or leave end_s out for no end"
            )
        return self

    def holds(self, offset_s: float) -> bool:
        return offset_s >= self.start_s and (self.end_s is None or offset_s < self.end_s)


class Reference(_Model):
    """Deadline = factor × quantile of a class's root latency in a low-load reference replay.

    The reference replays on `pool` as written (no arm's overrides), so the deadlines do not
    depend on arm order or on any arm's serving knobs. Without `pool` it is the pool file every
    arm names (the shipped default pool when they name none); arms on different pool files must
    name the reference's pool.
    """

    factor: float = Field(default=1.5, gt=0)
    quantile: float = Field(default=0.95, gt=0, le=1)
    pool: Path | None = None


class Deadlines(_Model):
    """Per-class deadlines in seconds; classes left out come from `reference` when given."""

    classes: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    reference: Reference | None = None


class Scenario(_Model):
    """A parsed scenario file (see the module docstring)."""

    name: str = Field(min_length=1)
    cohorts: tuple[Cohort, ...] = Field(min_length=1)
    placement: Placement = "interleaved"
    arrivals: ArrivalSpec = Burst()
    lock: Literal["token", "length"] = "token"
    initial_state: Literal["drained"] = "drained"
    engine: str = "sim"
    window: Window = Window()
    deadlines: Deadlines = Deadlines()
    blocks: int = Field(default=1, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    arms: tuple[Arm, ...] = Field(min_length=1)
    base_dir: Path = Path(".")
    source: str = "(inline)"
    """Where the scenario was read from (set by `parse_scenario`), for errors found when it runs."""

    @field_validator("engine")
    @classmethod
    def _redacted_engine(cls, value: str) -> str:
        """Keep the engine's redacted form: credentials in its URL stay in this process only
        (`engines.target`); a malformed engine is refused when the scenario runs."""
        try:
            return str(parse_engine(value))
        except MaserveError:
            return value

    @model_validator(mode="after")
    def _unique_names(self) -> Scenario:
        for what, names in (
            ("arm", [a.name for a in self.arms]),
            ("cohort", [c.name for c in self.cohorts]),
        ):
            if len(set(names)) != len(names):
                raise ValueError(f"{what} names must be unique, got {names}")
        return self

    @model_validator(mode="after")
    def _slots_need_fixed_placement(self) -> Scenario:
        if not isinstance(self.arrivals, Slots):
            return self
        for arm in self.arms:
            placement = self.placement_of(arm)
            if placement not in FIXED_SLOT_PLACEMENTS:
                raise ValueError(
                    f"`arrivals.kind: slots` puts the targets first, which placement "
                    f"{placement!r} (arm {arm.name!r}) does not; use round_robin or concatenated"
                )
        return self

    @model_validator(mode="after")
    def _reference_pool_known(self) -> Scenario:
        ref = self.deadlines.reference
        pools = {a.pool for a in self.arms}
        if ref is not None and ref.pool is None and len(pools) > 1:
            named = ", ".join(sorted(str(p) if p is not None else "(default)" for p in pools))
            raise ValueError(
                f"arms use different pool files ({named}); set deadlines.reference.pool to the "
                "pool the deadline reference replays on"
            )
        return self

    def placement_of(self, arm: Arm) -> str:
        """The arm's slot placement: its own, else the scenario's."""
        return arm.placement or self.placement

    def reference_pool(self) -> Path | None:
        """The pool file of the deadline reference replay (None: the shipped default pool)."""
        ref = self.deadlines.reference
        if ref is not None and ref.pool is not None:
            return ref.pool
        return self.arms[0].pool  # every arm names the same pool file (checked above)

    def wall_timeout_s(self) -> float | None:
        """The wall-clock limit of one arm run: None on the simulator, else `timeout_s` or
        `DEFAULT_WALL_TIMEOUT_S`.

        Examples:
            >>> s = Scenario.model_validate({"name": "x", "engine": "openai:http://h:1",
            ...     "cohorts": [{"name": "t", "bundle": "b"}], "arms": [{"name": "dag"}]})
            >>> s.wall_timeout_s(), s.model_copy(update={"engine": "sim"}).wall_timeout_s()
            (1800.0, None)
        """
        if parse_engine(self.engine).is_sim:
            return None
        return self.timeout_s if self.timeout_s is not None else DEFAULT_WALL_TIMEOUT_S

    def path(self, p: Path) -> Path:
        """`p` resolved against the scenario file's folder."""
        return p if p.is_absolute() else self.base_dir / p


def load_scenario(path: str | Path) -> Scenario:
    """Parse and check a scenario file.

    Raises:
        ConfigError: unreadable file, bad YAML, or an invalid field (file and field named).

    Examples:
        >>> load_scenario("/nonexistent.yaml")
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: scenario /nonexistent.yaml: cannot read it: [Errno 2] No such file or directory: '/nonexistent.yaml'
    """
    path = Path(path)
    data = read_yaml_mapping(path, "scenario")
    return parse_scenario(data, source=str(path), base_dir=path.parent)


def parse_scenario(
    data: dict[str, Any], *, source: str = "(inline)", base_dir: Path = Path(".")
) -> Scenario:
    """Validate a scenario mapping; errors name `source` and the field path."""
    try:
        return Scenario.model_validate({**data, "base_dir": base_dir, "source": source})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"scenario {source}: {loc}: {first['msg']}{more}") from None


MOONCAKE_ARM = "schedule"
"""The arm of `mooncake_scenario`: every request sent at its row's timestamp."""


def mooncake_scenario(
    path: str | Path, engine: str = "sim", *, timeout_s: float | None = None
) -> Scenario:
    """ "Replay this Mooncake file on its timestamps": the scenario `maserve replay --mooncake`
    runs, the same as the shipped `deployments/suites/scenarios/mooncake_replay.yaml` with
    another file.

    One cohort read from the JSONL (`Cohort.mooncake`: one single-call root per row), roots
    arriving at their `timestamp`s (`arrivals: {kind: trace}`, the first at 0), lengths locked
    (`lock: length`: prompts synthesized from `input_length` and `hash_ids`, outputs held at
    `output_length`), the server drained and its prefix cache reset before the arm, and one arm
    whose rule releases each request as its root arrives (`release: dag`).

    Examples:
        >>> s = mooncake_scenario("/data/requests.jsonl", "openai:http://127.0.0.1:8000")
        >>> s.name, s.cohorts[0].mooncake.name, s.arrivals.kind, s.lock, s.arms[0].name
        ('mooncake-requests', 'requests.jsonl', 'trace', 'length', 'schedule')
    """
    path = Path(path)
    data: dict[str, Any] = {
        "name": f"mooncake-{path.stem}",
        "engine": engine,
        "cohorts": [{"name": "mooncake", "mooncake": str(path.resolve())}],
        "arrivals": {"kind": "trace"},
        "lock": "length",
        "initial_state": "drained",
        "arms": [{"name": MOONCAKE_ARM, "release": "dag"}],
    }
    if timeout_s is not None:
        data["timeout_s"] = timeout_s
    return parse_scenario(data, source=f"--mooncake {path}", base_dir=path.parent)
