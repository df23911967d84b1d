"""Training data for the predictors: profiling sweeps that produce `Row`s.

One idea: a row is what one batch of `batch` identical requests, submitted together to a replica,
really cost there. `run_batch` submits the batch through the `Replica` protocol's `submit` and
reads runtime (last finish − submission) from the outcomes; memory and load time come from the
engine itself. Two sources:

- `simulator_rows` (`source="simulator"`): each (model, device) is cold-loaded on a `SimPool`
  (load time = the pool's executed load lifecycle, start to ready), then every shape runs on that
  replica; a shape whose whole KV cache does not fit at once (it would run preempted, in waves)
  is skipped with a note, as in the measured sweep. Peak memory = weights + the peak KV blocks
  the batch's scheduled requests held (from the replica's step records: tokens in cache after
  each step, rounded up to blocks) × block bytes + the activation peak of the largest step the
  records show (tokens, sequences). Load time here *is* the catalog load plan the formula uses,
  so load-time scores on simulator rows are exact by construction.
- `measured_rows` (`source="measured"`): the real operator profiles composed into request
  runtimes — the same scheduler, priced by `measured.MeasuredStepModel` (vLLM's profiled
  configuration: 2048-token budget, 256 sequences, no prefix caching). Memory and load time were
  not measured: NaN. `modelled_share` says how much of a row's runtime the roofline filled in
  (attention and lm_head on the Vidur devices). A shape whose KV would not fit next to the
  weights on the device is skipped with a note.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from maserve_prefect.predictors.base import Shape
from maserve_prefect.predictors.measured import MeasuredStepModel, measured_step_models
from maserve_prefect.predictors.rows import NAN, Row, read_rows, write_rows

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.memory import activation_peak_bytes, num_gpu_blocks
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.kv.manager import cdiv
from maserve_prefect.engines.sim.pool.sim_pool import Deployment, SimPool
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.engines.sim.step.scheduler import SchedulerConfig
from maserve_prefect.errors import ConfigError, SimulationError
from maserve_prefect.protocol.outcomes import Acceptance, Outcome
from maserve_prefect.protocol.requests import Request

__all__ = [
    "BatchRun",
    "Row",
    "Sweep",
    "measured_rows",
    "read_rows",
    "run_batch",
    "shape_grid",
    "simulator_rows",
    "write_rows",
]

MEASURED_CONFIG = SchedulerConfig(
    max_num_batched_tokens=2048,
    max_num_seqs=256,
    enable_prefix_caching=False,
    fast_forward=False,
)


@dataclass(frozen=True, slots=True)
class BatchRun:
    """What one batch did on a simulated replica."""

    runtime_s: float
    peak_kv_blocks: int
    max_step_tokens: int
    max_step_seqs: int
    cost_by_group: dict[str, float]  # StepCost field -> seconds summed over the batch's steps


@dataclass(slots=True)
class Sweep:
    """Rows of a sweep and notes on what was skipped."""

    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def shape_grid(
    batches: Iterable[int], inputs: Iterable[int], outputs: Iterable[int]
) -> list[Shape]:
    """Every combination, in (batch, input, output) order.

    Examples:
        >>> len(shape_grid((1, 4), (128,), (16, 64)))
        4
    """
    return [Shape(b, i, o) for b in batches for i in inputs for o in outputs]


def run_batch(replica: SimReplica, clock: Kernel, deployment: str, shape: Shape) -> BatchRun:
    """Submit `shape.batch` length-locked requests now, run the clock, measure the batch.

    Raises:
        SimulationError: a request was not accepted or did not complete.
    """
    start = clock.now()
    n0 = len(replica.records)
    outcomes: list[Outcome] = []
    for i in range(shape.batch):
        req = Request(
            f"profile-{n0}-{i}",
            deployment,
            num_prompt_tokens=shape.input_len,
            max_tokens=shape.output_len,
            min_tokens=shape.output_len,
        )
        ticket = replica.submit(req)
        if not ticket.accepted:
            raise SimulationError(f"{replica.name}: {shape} not accepted: {ticket.reason}")
        ticket.on_done(outcomes.append)
    clock.run()
    if len(outcomes) != shape.batch or any(o.status.value != "completed" for o in outcomes):
        raise SimulationError(f"{replica.name}: {shape} did not complete every request")
    block = replica.config.block_size
    peak_blocks, max_tokens, max_seqs = 0, 0, 0
    groups = dict.fromkeys(("linear_s", "attention_s", "lm_head_s", "overhead_s"), 0.0)
    for rec in replica.records[n0:]:
        held = sum(cdiv(s.num_computed_before + s.num_new_tokens, block) for s in rec.scheduled)
        peak_blocks = max(peak_blocks, held)
        max_tokens = max(max_tokens, rec.num_scheduled_tokens)
        max_seqs = max(max_seqs, len(rec.scheduled))
        for name in groups:
            groups[name] += getattr(rec, name)
    runtime = max(o.finish_s for o in outcomes) - start
    return BatchRun(runtime, peak_blocks, max_tokens, max_seqs, groups)


def simulator_rows(
    models: Sequence[str],
    devices: Sequence[str],
    shapes: Sequence[Shape],
    *,
    weight_source: str = "disk",
) -> Sweep:
    """Load each model on each device of a `SimPool` and run every shape (module docstring).

    A model that does not fit a device, or a shape the replica rejects, is skipped with a note.
    """
    sweep = Sweep()
    for device in devices:
        gpu = get_gpu(device)
        for model in models:
            spec = get_model(model)
            clock = Kernel()
            pool = SimPool(clock, [f"{gpu.name}:0"])
            dep = Deployment(spec.name, spec.name, weight_source=weight_source)
            ticket = pool.load(dep, f"{gpu.name}:0")
            if ticket.acceptance is not Acceptance.ACCEPTED:
                sweep.notes.append(f"{spec.name} on {gpu.name}: not loaded ({ticket.reason})")
                continue
            clock.run()
            record = pool.lifecycle_log[-1]
            load_s = record.end_s - record.start_s
            replica = pool.replica(ticket.replica)
            block_bytes = replica.config.block_size * spec.kv_bytes_per_token
            for shape in shapes:
                if shape.input_len + shape.output_len > replica.config.max_model_len:
                    sweep.notes.append(
                        f"{spec.name} on {gpu.name}: {shape} exceeds its context window "
                        f"({replica.config.max_model_len} tokens); skipped"
                    )
                    continue
                per_request = cdiv(
                    shape.input_len + shape.output_len - 1, replica.config.block_size
                )
                if shape.batch * per_request > replica.kv.num_blocks:
                    sweep.notes.append(
                        f"{spec.name} on {gpu.name}: {shape} needs {shape.batch * per_request} KV "
                        f"blocks at once, {replica.kv.num_blocks} exist; skipped"
                    )
                    continue
                run = run_batch(replica, clock, dep.name, shape)
                act = activation_peak_bytes(spec, run.max_step_tokens, run.max_step_seqs)
                mem = spec.weight_bytes + run.peak_kv_blocks * block_bytes + act
                sweep.rows.append(
                    Row(spec.name, gpu.name, shape.batch, shape.input_len, shape.output_len,
                        run.runtime_s, float(mem), load_s, "simulator")
                )  # fmt: skip
    return sweep


def _measured_blocks(spec: ModelSpec, gpu: GpuSpec) -> int:
    """KV blocks vLLM's profiled configuration would get (eager mode, utilization 0.9)."""
    cfg = MEASURED_CONFIG
    return num_gpu_blocks(
        spec,
        gpu,
        cfg.block_size,
        gpu_memory_utilization=0.9,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_num_seqs=cfg.max_num_seqs,
        enforce_eager=True,
    )


def _measured_row(cost: MeasuredStepModel, shape: Shape, blocks: int) -> Row:
    spec, gpu = cost.model, get_gpu(cost.device)
    clock = Kernel()
    replica = SimReplica(clock, cost, blocks, MEASURED_CONFIG, name=f"{spec.name}@{gpu.name}")
    run = run_batch(replica, clock, "", shape)
    total = sum(run.cost_by_group.values())
    modelled = sum(run.cost_by_group[g] for g in cost.modelled_groups)
    share = modelled / total if total > 0 else 0.0
    return Row(spec.name, gpu.name, shape.batch, shape.input_len, shape.output_len,
               run.runtime_s, NAN, NAN, "measured", share)  # fmt: skip


def measured_rows(profile_root: Path, shapes: Sequence[Shape]) -> Sweep:
    """Compose every profile under `profile_root` into runtimes for `shapes` (module docstring).

    Raises:
        ConfigError: `profile_root` is not a directory.
    """
    costs, notes = measured_step_models(profile_root)
    sweep = Sweep(notes=list(notes))
    for cost in costs:
        spec, gpu = cost.model, get_gpu(cost.device)
        try:
            blocks = _measured_blocks(spec, gpu)
        except ConfigError as exc:
            sweep.notes.append(f"{spec.name} on {gpu.name}: does not fit ({exc})")
            continue
        capacity = blocks * MEASURED_CONFIG.block_size
        for shape in shapes:
            if shape.num_tokens > capacity or shape.batch > MEASURED_CONFIG.max_num_seqs:
                sweep.notes.append(
                    f"{spec.name} on {gpu.name}: {shape} needs {shape.num_tokens} KV tokens, "
                    f"{capacity} fit; skipped"
                )
                continue
            sweep.rows.append(_measured_row(cost, shape, blocks))
    return sweep


def finite_share(rows: Iterable[Row]) -> float:
    """Runtime-weighted modelled share of `rows` (0 when none has a runtime)."""
    num = den = 0.0
    for r in rows:
        if math.isfinite(r.runtime_s):
            num += r.runtime_s * r.modelled_share
            den += r.runtime_s
    return num / den if den > 0 else 0.0
