"""Engine-level metrics computed after the fact from the simulator's step records and timelines.

The one idea: every figure is a time- or token-weighted sum over `StepRecord`s, and a
fast-forwarded record (`num_steps = k` identical-shape decode steps) is summed in closed form, so
results equal what stepping one by one would give.

Request ids join records to the trace (native runs: request id = op id); a request's class is its
root's class (`metrics.task.root_class`), `UNKNOWN_CLASS` when the id is not in the trace.

**Arithmetic intensity** (modeled, whole model across tensor-parallel ranks). Seed formula
`F = 2PT + 4·L·N_h·d·A + 2HVr`, per step:

- P = weights of the transformer blocks' linear layers, `L · Σ in·out` over QKV, O, gate-up and
  down (embedding and lm_head excluded; lm_head is the `2HVr` term, norms are negligible);
- T = tokens computed (`Σ num_new_tokens`);
- A = attention context summed over computed tokens: a chunk of `n` new tokens after `c`
  computed ones attends `Σ_{i=1..n} (c + i) = n·c + n(n+1)/2` positions (causal);
- r = sequences producing logits (vLLM v1 computes one logit row per scheduled request);
- L, N_h, d, H, V = layers, attention heads, head_dim, hidden size, vocabulary.

Bytes `B = W + KV_read + KV_write + act` per step: `W = (P + H·V)·dtype` (all weights read
once per step); `KV_read = Σ (c + n) · kv_bytes_per_token` (every cached and new K/V read once);
`KV_write = T · kv_bytes_per_token`; `act = dtype · (L·T·Σ(in + out) + r·(H + V) + T·H)` (GEMM
inputs and outputs, lm_head, embedding gather). Intensity = F / B FLOP/byte per step; a run's (or a
replica's) intensity is `ΣF / ΣB` over its steps (`run_intensity`, the paper's aggregate run
intensity), not a time-weighted mean of per-step ratios. A fast-forwarded
decode run of k steps sums those terms over its steps exactly (one new token per request per
step: `A = k·c + k(k+1)/2`, `KV_read` likewise, weights read k times).

**Prefill factor** = processed prefill tokens / source prefill tokens, over requests whose op
completed: processed = every position the engine computed for the request minus the
`num_output_tokens − 1` decode positions a preemption-free run needs; source = prompt tokens
minus those served from the prefix cache at first scheduling (`num_computed_before` of the
request's first chunk). It is 1 without preemption and grows with recomputation after preemption.

**Time-weighted decode batch** = `Σ num_decode · duration / Σ duration` over records with at
least one decoding request (decode records: every request; mixed records: 1-token chunks).
**Co-batching share** of class Y for target class X = time during which an X request was
scheduled together with a request of class Y (a *different* X request when Y = X), divided by
the time during which an X request was scheduled.
**KV memory-time** = `∫ usage(t) · capacity_bytes dt` (byte-seconds), each timeline sample
holding until the next (or `end_s`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.pool.lifecycle_exec import PoolReplica
from maserve_prefect.engines.sim.step.records import StepKind, StepRecord, Timeline
from maserve_prefect.errors import ConfigError
from maserve_prefect.metrics.task import final_attempts, root_class
from maserve_prefect.trace.model import OpStatus, Trace

UNKNOWN_CLASS = "<unknown>"
KV_USAGE = "vllm:kv_cache_usage_perc"


def request_classes(trace: Trace) -> dict[str, str]:
    """Map op id (= request id of native runs) → its root's class."""
    cls = {r.root_id: root_class(r) for r in trace.roots}
    return {op.op_id: cls.get(op.root_id, UNKNOWN_CLASS) for op in trace.ops}


# -- arithmetic intensity ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepIntensity:
    """Modeled FLOPs and bytes of one step record (all `num_steps` steps of it)."""

    replica: str
    step_index: int
    start_s: float
    end_s: float
    num_steps: int
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte."""
        return self.flops / self.bytes if self.bytes > 0 else 0.0


def block_params(model: ModelSpec) -> int:
    """P: linear-layer weights of all transformer blocks (no embedding, no lm_head)."""
    return model.num_layers * sum(g.in_dim * g.out_dim for g in model.layer_gemms(1))


def step_intensity(record: StepRecord, model: ModelSpec) -> StepIntensity:
    """FLOPs, bytes and intensity of one record under the module's formulas.

    Examples:
        >>> from maserve_prefect.engines.catalog import get_model
        >>> from maserve_prefect.engines.sim.step.records import ScheduledTokens
        >>> rec = StepRecord("r", 0, 0.0, 1.0, 1, StepKind.PREFILL,
        ...                  (ScheduledTokens("a", 0, 100),), 100, 0.0, 0.0, 0.0, 0.0, ())
        >>> step_intensity(rec, get_model("qwen3-8b")).intensity > 1
        True
    """
    k = record.num_steps
    c = np.array([s.num_computed_before for s in record.scheduled], dtype=np.float64)
    n = np.array([s.num_new_tokens for s in record.scheduled], dtype=np.float64)
    per_step = n / k  # fast-forwarded runs compute one token per request per step
    # tokens at positions c+1 .. c+n, each attending to every position up to its own
    attn_ctx = float(np.sum(n * c + n * (n + 1) / 2))
    # Σ_{j=1..k} (c + j·p) for p tokens per step: k·c + p·k(k+1)/2; for k = 1 that is c + n.
    kv_read = float(np.sum(k * c + per_step * k * (k + 1) / 2))
    tokens = float(n.sum())
    logits = float(len(record.scheduled) * k)
    h, v, d = model.hidden_size, model.vocab_size, model.dtype_bytes
    p = block_params(model)
    flops = (
        2.0 * p * tokens
        + 4.0 * model.num_layers * model.num_attention_heads * model.head_dim * attn_ctx
        + 2.0 * h * v * logits
    )
    gemm_io = sum(g.in_dim + g.out_dim for g in model.layer_gemms(1))
    kvb = model.kv_bytes_per_token
    nbytes = (
        k * (p + h * v) * d
        + kv_read * kvb
        + tokens * kvb
        + d * (model.num_layers * tokens * gemm_io + logits * (h + v) + tokens * h)
    )
    return StepIntensity(
        record.replica, record.step_index, record.start_s, record.end_s, k, flops, nbytes
    )


def run_intensity(rows: Sequence[StepIntensity]) -> float:
    """Aggregate run intensity `ΣF / ΣD` over `rows` (paper, Appendix D: "Aggregate run intensity
    uses ΣF/ΣD"), not a mean of per-step ratios; 0 when the rows move no bytes.

    Examples:
        >>> rows = [StepIntensity("r", 0, 0.0, 1.0, 1, 100.0, 10.0),
        ...         StepIntensity("r", 1, 1.0, 4.0, 1, 20.0, 10.0)]
        >>> run_intensity(rows)  # (100 + 20) / (10 + 10), not (10·1 + 2·3) / 4
        6.0
    """
    total_bytes = sum(r.bytes for r in rows)
    return sum(r.flops for r in rows) / total_bytes if total_bytes > 0 else 0.0


# -- KV memory ---------------------------------------------------------------------------------


def kv_capacity_bytes(replica: PoolReplica) -> int:
    """KV bytes a replica's blocks hold when all are used (all tensor-parallel ranks)."""
    spec = replica.deployment.spec
    tp = replica.deployment.tp
    kv = replica.engine.kv
    per_token = spec.num_layers * spec.kv_bytes_per_token_per_layer(tp) * tp
    return kv.num_blocks * kv.block_size * per_token


def kv_occupancy(timeline: Timeline, capacity_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """`(t_s, used_bytes)` arrays from a timeline's KV usage series."""
    t = np.asarray(timeline.t_s, dtype=np.float64)
    used = np.asarray(timeline.values[KV_USAGE], dtype=np.float64) * capacity_bytes
    return t, used


def kv_memory_time(timeline: Timeline, capacity_bytes: int, end_s: float | None = None) -> float:
    """∫ used KV bytes dt (byte-seconds) from the first sample to `end_s` (default last sample).

    Examples:
        >>> tl = Timeline("r")
        >>> tl.sample(0.0, (0.5, 0, 0, 0, 0, 0)); tl.sample(2.0, (0.25, 0, 0, 0, 0, 0))
        >>> kv_memory_time(tl, 100, end_s=4.0)
        150.0
    """
    t, used = kv_occupancy(timeline, capacity_bytes)
    if t.size == 0:
        return 0.0
    end = t[-1] if end_s is None else end_s
    if end < t[-1]:
        raise ConfigError(f"end_s={end_s} is before the timeline's last sample at {t[-1]} s")
    return float(np.dot(used, np.diff(np.append(t, end))))


# -- prefill factor ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefillFactor:
    """Processed vs source prefill tokens over `num_requests` completed requests."""

    num_requests: int
    processed_tokens: int
    source_tokens: int

    @property
    def factor(self) -> float:
        return self.processed_tokens / self.source_tokens if self.source_tokens else float("nan")


def prefill_factor(records: Iterable[StepRecord], trace: Trace) -> PrefillFactor:
    """Processed / source prefill tokens of requests whose op completed (module docstring).

    Requests not in the trace, or whose op did not complete, are left out.
    """
    computed: dict[str, int] = defaultdict(int)
    cached: dict[str, int] = {}
    for rec in records:
        for s in rec.scheduled:
            computed[s.request_id] += s.num_new_tokens
            cached.setdefault(s.request_id, s.num_computed_before)
    finals = final_attempts(trace.ops)
    num = proc = src = 0
    for rid, total in computed.items():
        op = finals.get(rid)
        if op is None or op.status is not OpStatus.COMPLETED:
            continue
        num += 1
        proc += total - max(op.num_output_tokens - 1, 0)
        src += max(op.num_input_tokens - cached[rid], 0)
    return PrefillFactor(num, proc, src)


# -- batch views -------------------------------------------------------------------------------


def num_decoding(record: StepRecord) -> int:
    """Requests decoding in a record (all of a decode record; 1-token chunks of a mixed one)."""
    if record.kind is StepKind.DECODE:
        return len(record.scheduled)
    if record.kind is StepKind.MIXED:
        return sum(1 for s in record.scheduled if s.num_new_tokens == 1)
    return 0


def decode_batch(records: Iterable[StepRecord]) -> float:
    """Time-weighted decode batch size over records with ≥ 1 decoding request (0 if none).

    Examples:
        >>> from maserve_prefect.engines.sim.step.records import ScheduledTokens as S
        >>> recs = [StepRecord("r", 0, 0.0, 1.0, 1, StepKind.DECODE, (S("a", 5, 1),), 1,
        ...                    0, 0, 0, 0, ()),
        ...         StepRecord("r", 1, 1.0, 4.0, 3, StepKind.DECODE, (S("a", 6, 3), S("b", 6, 3)),
        ...                    2, 0, 0, 0, 0, ())]
        >>> decode_batch(recs)
        1.75
    """
    pairs = [(num_decoding(r), r.duration_s) for r in records]
    arr = np.array([p for p in pairs if p[0] > 0], dtype=np.float64).reshape(-1, 2)
    total = arr[:, 1].sum()
    return float(np.dot(arr[:, 0], arr[:, 1]) / total) if total > 0 else 0.0


def co_batching(
    records: Iterable[StepRecord], classes: Mapping[str, str], target: str
) -> dict[str, float]:
    """Time-weighted share of `target`'s scheduled time co-batched with each class (sorted).

    Examples:
        >>> from maserve_prefect.engines.sim.step.records import ScheduledTokens as S
        >>> recs = [StepRecord("r", 0, 0.0, 1.0, 1, StepKind.DECODE, (S("a", 5, 1), S("b", 5, 1)),
        ...                    2, 0, 0, 0, 0, ()),
        ...         StepRecord("r", 1, 1.0, 4.0, 1, StepKind.DECODE, (S("a", 6, 1),), 1,
        ...                    0, 0, 0, 0, ())]
        >>> co_batching(recs, {"a": "x", "b": "y"}, "x")
        {'y': 0.25}
    """
    total = 0.0
    with_cls: dict[str, float] = defaultdict(float)
    for r in records:
        counts = Counter(classes.get(s.request_id, UNKNOWN_CLASS) for s in r.scheduled)
        if counts[target] == 0:
            continue
        dur = r.duration_s
        total += dur
        for cls, cnt in counts.items():
            if cls != target or cnt >= 2:
                with_cls[cls] += dur
    if total <= 0:
        return {}
    return {c: v / total for c, v in sorted(with_cls.items())}


def preemptions_by_class(
    records: Iterable[StepRecord], classes: Mapping[str, str]
) -> dict[str, int]:
    """Preemption events per victim class (a request preempted twice counts twice)."""
    counts = Counter(classes.get(rid, UNKNOWN_CLASS) for r in records for rid in r.preempted)
    return dict(sorted(counts.items()))


def goodput_per_accelerator(goodput_per_s: float, num_accelerators: int) -> float:
    """SLO-compliant task goodput divided by the accelerators the run held.

    Examples:
        >>> goodput_per_accelerator(3.0, 4)
        0.75
    """
    if num_accelerators < 1:
        raise ConfigError(f"num_accelerators must be >= 1, got {num_accelerators}")
    return goodput_per_s / num_accelerators


# -- per-replica summary -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    """Engine metrics of one replica over its whole run."""

    replica: str
    model: str
    num_records: int
    num_steps: int
    busy_s: float
    kv_memory_time_byte_s: float
    intensity: float
    decode_batch: float
    num_preemptions: int


def replica_metrics(
    replicas: Iterable[PoolReplica], end_s: float | None = None
) -> list[ReplicaMetrics]:
    """One `ReplicaMetrics` per replica (e.g. `SimPool.pool_replicas()`) that ran a step."""
    out = []
    for p in replicas:
        recs = p.engine.records
        if not recs:
            continue
        spec = p.deployment.spec
        tl = p.engine.timeline
        last = tl.t_s[-1] if tl.t_s else None
        end = None if end_s is None or last is None else max(end_s, last)
        out.append(
            ReplicaMetrics(
                p.name,
                spec.name,
                len(recs),
                sum(r.num_steps for r in recs),
                float(sum(r.duration_s for r in recs)),
                kv_memory_time(tl, kv_capacity_bytes(p), end),
                run_intensity([step_intensity(r, spec) for r in recs]),
                decode_batch(recs),
                sum(len(r.preempted) for r in recs),
            )
        )
    return out
