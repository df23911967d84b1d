"""A step-cost model made of real per-operator GPU measurements, for the simulator's scheduler.

One idea: to turn per-layer operator profiles into request-shape runtimes, let the simulator's
vLLM-v1 scheduler decide the steps (chunked prefill, mixed prefill + decode, growing decode
context) and price each step with the *measured* operator times instead of the roofline:

    step = Σ_layer-ops time(op, M) * num_layers + Σ_step-ops time(op, M)
           + lm_head(S) + sampler(S) + attention(step) * num_layers

with M the step's tokens and S its sequences. What a source measured, and what is filled in:

- LLMServingSim (RTX PRO 6000; `dense.csv`, `per_sequence.csv`, `attention.csv`): everything
  measured. Per layer: `layernorm` twice (vLLM's fused add + RMSNorm before attention and before
  the MLP), `qkv_proj`, `rotary_emb`, `qk_norm` (Qwen3), `o_proj`, `gate_up_proj`, `act_fn`,
  `down_proj`; per step `embedding`, `final_layernorm`; per sequence `lm_head`, `sampler`.
  Attention is interpolated on the measured grid (`AttentionGrid`).
- Vidur (A100, H100; `mlp.csv`): the non-attention layer operators are measured (both norms,
  QKV, rotary, O, up, activation, down; the residual `add` counted twice per layer; `emb` and
  one more norm per step). Attention, lm_head and the sampler were not profiled there: they come
  from the calibrated roofline step model (`engines/sim/cost/step_time.py`), and `modelled_groups`
  says so, so each composed row carries the share of its runtime that is modelled.

Interpolation: linear in the token count inside a series, proportional beyond its last point.
Host-side step overhead is in no profile and is left out: a composed runtime is GPU kernel time.
The decode-affine fast path cannot be used (measured attention is not affine in context), so the
replica must run with `fast_forward=False`.
"""

from __future__ import annotations

import bisect
import csv
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from maserve_prefect.engines.catalog.devices import get_gpu
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec, get_model
from maserve_prefect.engines.sim.cost.profiles import load_vidur
from maserve_prefect.engines.sim.cost.step_cost import DecodeAffine, ScheduledChunk, StepCost
from maserve_prefect.engines.sim.cost.step_time import RooflineStepModel, make_step_model
from maserve_prefect.errors import ConfigError, UnsupportedError

FloatArray = np.ndarray


@dataclass(frozen=True, slots=True)
class Series:
    """Seconds of one operator over a sorted count axis (tokens or sequences)."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __call__(self, v: float) -> float:
        x, y = self.x, self.y
        if v >= x[-1]:
            return y[-1] * v / x[-1]
        if v <= x[0]:
            return y[0]
        i = bisect.bisect_right(x, v)
        w = (v - x[i - 1]) / (x[i] - x[i - 1])
        return y[i - 1] + w * (y[i] - y[i - 1])

    @classmethod
    def of(cls, x: Sequence[float] | FloatArray, y: Sequence[float] | FloatArray) -> Series:
        order = np.argsort(np.asarray(x, dtype=np.float64), kind="stable")
        xs = [float(x[i]) for i in order]
        ys = [float(y[i]) for i in order]
        return cls(tuple(xs), tuple(ys))


def _tok(x: float) -> float:
    """Token-count axis coordinate: ~log2 for large counts, 0 at 0 (grids start at 0 or 16)."""
    return math.log2(1.0 + x / 16.0)


@dataclass(slots=True)
class Grid:
    """Multilinear interpolation of log-seconds on a complete grid (coordinates pre-mapped)."""

    axes: list[list[float]]
    log_t: FloatArray

    def __call__(self, coords: Sequence[float]) -> float:
        lo_idx, weights = [], []
        for axis, c in zip(self.axes, coords, strict=True):
            c = min(max(c, axis[0]), axis[-1])  # clamp inside the measured range
            i = min(max(bisect.bisect_right(axis, c) - 1, 0), len(axis) - 2)
            lo_idx.append(i)
            weights.append((c - axis[i]) / (axis[i + 1] - axis[i]))
        total = 0.0
        for corner in itertools.product((0, 1), repeat=len(self.axes)):
            w = 1.0
            for bit, wt in zip(corner, weights, strict=True):
                w *= wt if bit else 1.0 - wt
            if w:
                idx = tuple(i + b for i, b in zip(lo_idx, corner, strict=True))
                total += w * float(self.log_t[idx])
        return math.exp(total)


def complete_grid(points: FloatArray, seconds: FloatArray) -> tuple[list[list[float]], FloatArray]:
    """The largest complete product grid inside scattered `points` (greedy: drop the axis value
    missing most often until nothing is missing). Returns raw axis values and a value array.

    Examples:
        >>> pts = np.array([[1, 1], [1, 2], [2, 1], [2, 2], [3, 1]], dtype=float)
        >>> axes, vals = complete_grid(pts, np.arange(5.0) + 1)
        >>> axes, vals.tolist()
        ([[1.0, 2.0], [1.0, 2.0]], [[1.0, 2.0], [3.0, 4.0]])
    """
    axes = [sorted(set(points[:, k].tolist())) for k in range(points.shape[1])]
    while True:
        shape = tuple(len(a) for a in axes)
        keep = np.ones(len(points), dtype=bool)
        idx = []
        for k, a in enumerate(axes):
            pos = np.searchsorted(a, points[:, k])
            pos = np.minimum(pos, len(a) - 1)
            keep &= np.asarray(a)[pos] == points[:, k]
            idx.append(pos)
        present = np.zeros(shape, dtype=bool)
        vals = np.full(shape, np.nan)
        where = tuple(i[keep] for i in idx)
        present[where] = True
        vals[where] = seconds[keep]  # a repeated point keeps its last value
        if present.all():
            return axes, vals
        worst: tuple[float, int, int] | None = None  # (missing fraction, axis, value index)
        for k, a in enumerate(axes):
            if len(a) <= 2:
                continue
            other = tuple(j for j in range(len(axes)) if j != k)
            missing = (~present).mean(axis=other)
            j = int(np.argmax(missing))
            if worst is None or float(missing[j]) > worst[0]:
                worst = (float(missing[j]), k, j)
        if worst is None:
            raise ConfigError("attention profile holds no complete grid of at least 2 per axis")
        del axes[worst[1]][worst[2]]


def _on_main_grid(points: FloatArray) -> np.ndarray:
    """Rows on the profiler's main grid: every value 0 or a power of two (token counts from 16).
    The skew-profile rows (decodes of unequal context, 1.5x-spaced values) are left out: the
    batches composed here are identical-shape."""
    pos = np.where(points > 0, points, 1.0)
    power = np.abs(np.log2(pos) - np.round(np.log2(pos))) < 1e-9
    ok: np.ndarray = np.all(power | (points == 0), axis=1)
    return ok


class AttentionGrid:
    """One layer's measured attention kernel over LLMServingSim's grid
    `(prefill_chunk, kv_prefill, n_decode, kv_decode)`, split into its three complete sub-grids
    (main grid only, see `_on_main_grid`): decode-only `(n, kv)`, prefill-only
    `(chunk, prior)` and mixed (all four).

    A step's cost (identical-shape batches): the largest prefill chunk with every decode is one
    grid point; each further prefill sequence in the same varlen call adds its own prefill-only
    time above the smallest measured call (the launch floor). Decode counts past the grid scale
    proportionally; token counts are clamped to the measured range.
    """

    def __init__(self, table: FloatArray) -> None:
        table = table[_on_main_grid(table[:, :4])]
        pc, nd, t = table[:, 0], table[:, 2], table[:, 4] * 1e-6  # microseconds
        dec = (pc == 0) & (nd > 0)
        pre = (pc > 0) & (nd == 0)
        mix = (pc > 0) & (nd > 0)
        self.decode = self._grid(table[dec][:, [2, 3]], t[dec], (math.log2, _tok))
        self.prefill = self._grid(table[pre][:, [0, 1]], t[pre], (_tok, _tok))
        self.mixed = self._grid(table[mix][:, :4], t[mix], (_tok, _tok, math.log2, _tok))
        self.max_decode = float(nd[dec].max())
        self.max_mixed_decode = 2.0 ** self.mixed.axes[2][-1]
        self.floor = self.prefill((self.prefill.axes[0][0], self.prefill.axes[1][0]))

    @staticmethod
    def _grid(
        points: FloatArray, seconds: FloatArray, maps: tuple[Callable[[float], float], ...]
    ) -> Grid:
        axes, vals = complete_grid(points, seconds)
        mapped = [[f(v) for v in a] for f, a in zip(maps, axes, strict=True)]
        return Grid(mapped, np.log(vals))

    def step_s(self, chunks: Sequence[ScheduledChunk]) -> float:
        """One layer's attention seconds for a step."""
        prefills = sorted(
            ((c.num_new_tokens, c.num_context_tokens) for c in chunks if c.num_new_tokens > 1),
            reverse=True,
        )
        ctx = [c.num_context_tokens for c in chunks if c.num_new_tokens == 1]
        n = float(len(ctx))
        kd = _tok(sum(ctx) / n) if ctx else 0.0
        if not prefills:
            scale = max(1.0, n / self.max_decode)
            return scale * self.decode((math.log2(n / scale), kd))
        new, prior = prefills[0]
        if ctx:
            scale = max(1.0, n / self.max_mixed_decode)
            t = scale * self.mixed((_tok(new), _tok(prior), math.log2(n / scale), kd))
        else:
            t = self.prefill((_tok(new), _tok(prior)))
        for new, prior in prefills[1:]:
            t += max(self.prefill((_tok(new), _tok(prior))) - self.floor, 0.0)
        return t


@dataclass(slots=True)
class MeasuredStepModel:
    """A `StepCostModel` from measured operator series (module docstring).

    Attributes:
        layer_linear / layer_elementwise: per-layer series over tokens (each counted once;
            list a series twice to count it twice).
        step_elementwise: once-per-step series over tokens (embedding, final norm).
        per_sequence: series over scheduled sequences (lm_head, sampler); empty: modelled.
        attention: the measured grid, or None: modelled.
        fallback: the roofline step model for what was not measured.
    """

    model: ModelSpec
    device: str
    source: str
    layer_linear: list[Series]
    layer_elementwise: list[Series]
    step_elementwise: list[Series]
    per_sequence: list[Series] = field(default_factory=list)
    attention: AttentionGrid | None = None
    fallback: RooflineStepModel | None = None

    @property
    def modelled_groups(self) -> frozenset[str]:
        """`StepCost` fields that come from the roofline model, not from measurements."""
        groups = set()
        if self.attention is None:
            groups.add("attention_s")
        if not self.per_sequence:
            groups.add("lm_head_s")
        return frozenset(groups)

    def step_cost(self, chunks: Sequence[ScheduledChunk]) -> StepCost:
        m = float(sum(c.num_new_tokens for c in chunks))
        s = float(len(chunks))
        layers = self.model.num_layers
        linear = layers * sum(f(m) for f in self.layer_linear)
        elem = layers * sum(f(m) for f in self.layer_elementwise)
        elem += sum(f(m) for f in self.step_elementwise)
        modelled = self.fallback.step_cost(chunks) if self.fallback is not None else None
        if self.attention is not None:
            attn = layers * self.attention.step_s(chunks)
        else:
            assert modelled is not None, "no attention measurements and no fallback model"
            attn = modelled.attention_s
        if self.per_sequence:
            head = sum(f(s) for f in self.per_sequence)
        else:
            assert modelled is not None, "no lm_head measurements and no fallback model"
            head = modelled.lm_head_s
        return StepCost(linear, attn, head, elem)

    def decode_affine(self, num_seqs: int) -> DecodeAffine:
        raise UnsupportedError(
            f"measured step model of {self.model.name} on {self.device} is not affine in "
            "context; run its replica with SchedulerConfig(fast_forward=False)"
        )


# --- builders -----------------------------------------------------------------------------------


def _catalog_gpu(name: str) -> GpuSpec | None:
    """A built-in or user-added device, or None."""
    try:
        return get_gpu(name)
    except ConfigError:
        return None


_VIDUR_LINEAR = ("qkv", "o", "gate_up", "down")


def vidur_step_model(path: Path, device: str) -> MeasuredStepModel:
    """Build from one Vidur `mlp.csv` (tp=1 rows); attention and lm_head are modelled.

    Raises:
        ConfigError: the model is not in the catalog (Vidur shapes alone lack the layer count).
    """
    sets = [s for s in load_vidur(path, device) if s.tp == 1]
    model = get_model(path.parent.name)
    linear = [Series.of(s.x, s.seconds) for s in sets if s.op in _VIDUR_LINEAR]
    elem_sets = [s for s in sets if s.op not in _VIDUR_LINEAR and s.op != "embedding"]
    elem = [Series.of(s.x, s.seconds) for s in elem_sets]
    elem += [Series.of(s.x, s.seconds) for s in elem_sets if s.op == "add"]  # two residual adds
    emb = [Series.of(s.x, s.seconds) for s in sets if s.op == "embedding"]
    final_norm = [Series.of(s.x, s.seconds) for s in sets if s.op == "norm"][:1]
    return MeasuredStepModel(
        model,
        device,
        str(path),
        linear,
        elem,
        emb + final_norm,
        fallback=make_step_model(model.name, device),
    )


def _read_counts(path: Path) -> dict[str, Series]:
    by_op: dict[str, tuple[list[float], list[float]]] = {}
    with path.open(newline="") as fh:
        for line_no, row in enumerate(csv.reader(fh), start=1):
            if line_no == 1:
                continue
            try:
                xs, ys = by_op.setdefault(row[0], ([], []))
                xs.append(float(row[1]))
                ys.append(float(row[2]) * 1e-6)
            except (IndexError, ValueError) as exc:
                raise ConfigError(f"{path}:{line_no}: expected op,count,time_us ({exc})") from exc
    return {op: Series.of(x, y) for op, (x, y) in by_op.items()}


def llmservingsim_step_model(folder: Path) -> MeasuredStepModel:
    """Build from one LLMServingSim tp1 folder (`meta.yaml` + the three CSVs); all measured.

    Raises:
        ConfigError: a file or an operator is missing, or the model / GPU is not in the catalog.
    """
    meta = yaml.safe_load((folder / "meta.yaml").read_text()) or {}
    model = get_model(str(meta.get("model", "")))
    gpu = _catalog_gpu(str(meta.get("hardware", "")))
    if gpu is None:
        raise ConfigError(
            f"{folder / 'meta.yaml'}: hardware {meta.get('hardware')!r} not in the catalog; "
            "add it with `maserve sim device add DATASHEET.yaml`"
        )
    dense = _read_counts(folder / "dense.csv")
    seq = _read_counts(folder / "per_sequence.csv")
    need = ["layernorm", "qkv_proj", "rotary_emb", "o_proj", "gate_up_proj", "act_fn"]
    need += ["down_proj", "embedding", "final_layernorm"] + (["qk_norm"] if model.qk_norm else [])
    missing = [op for op in need if op not in dense] + [
        op for op in ("lm_head", "sampler") if op not in seq
    ]
    if missing:
        raise ConfigError(
            f"{folder}: operators {missing} missing from dense.csv / per_sequence.csv"
        )
    table = np.loadtxt(folder / "attention.csv", delimiter=",", skiprows=1, ndmin=2)
    if table.shape[1] != 5:
        raise ConfigError(f"{folder / 'attention.csv'}:1: expected 5 columns")
    elem = [dense["layernorm"], dense["layernorm"], dense["rotary_emb"], dense["act_fn"]]
    if model.qk_norm:
        elem.append(dense["qk_norm"])
    return MeasuredStepModel(
        model,
        gpu.name,
        str(folder),
        [dense[op] for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")],
        elem,
        [dense["embedding"], dense["final_layernorm"]],
        [seq["lm_head"], seq["sampler"]],
        AttentionGrid(table),
    )


def measured_step_models(root: Path) -> tuple[list[MeasuredStepModel], list[str]]:
    """Every composable profile under `root`; the notes say what was skipped and why.

    Raises:
        ConfigError: `root` is not a directory.
    """
    if not root.is_dir():
        raise ConfigError(f"profile directory {root} does not exist")
    out: list[MeasuredStepModel] = []
    notes: list[str] = []
    for path in sorted(root.rglob("mlp.csv")):
        device_dir = path.parent.parent.name
        gpu = _catalog_gpu(device_dir)
        if gpu is None:
            notes.append(
                f"{path}: device {device_dir!r} not in the catalog (add it with `maserve sim "
                "device add DATASHEET.yaml`); skipped"
            )
            continue
        try:
            out.append(vidur_step_model(path, gpu.name))
        except ConfigError as exc:
            notes.append(f"{path}: skipped ({exc})")
    for meta in sorted(root.rglob("meta.yaml")):
        try:
            out.append(llmservingsim_step_model(meta.parent))
        except ConfigError as exc:
            notes.append(f"{meta.parent}: skipped ({exc})")
    return out, notes
