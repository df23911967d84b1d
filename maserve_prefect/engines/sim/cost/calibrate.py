"""Fit a device's efficiency factors to measured kernel profiles, and score fits honestly.

One idea: the parameters split by operator group (linear, elementwise, attention, sampler), and
each group's few parameters are fitted by bounded least squares in log space on *relative*
residuals (every profile series weighted equally), so a 2 us layernorm and a 2 ms GEMM both
count and the factors stay physical (positive, near fractions of peak). A group with no rows in
the fit data keeps the base values it started from.

Scoring is WAPE = sum|pred - meas| / sum(meas), per device and operator group, always on rows
the fit did not see:

- leave-one-model-out (LOMO): fit a device on its other models, score the held-out model;
- leave-one-device-out (LODO): fit shared factors on the other devices, score the held-out one
  (the "uncalibrated device" case). Series whose factors no other device's rows constrain
  (attention and the sampler exist only for RTX PRO 6000; vLLM's fused elementwise kernels only
  in its profiles, Vidur's unfused ones only in Vidur's) are not scored.

DRAM efficiencies (`*_mem`) are bounded by the datasheet bandwidth; bytes served faster come
from the L2 terms of the roofline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.optimize import least_squares

from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.sim.cost.profiles import FloatArray, ProfileSet
from maserve_prefect.engines.sim.cost.roofline import (
    ELEMENTWISE_EFF_FIELD,
    attention_m_blocks,
    attention_tile_m,
    elementwise_bytes_per_token,
    elementwise_time,
    linear_time,
    mixed_attention_time,
    prefill_attention_time,
    sampler_time,
)
from maserve_prefect.errors import ConfigError

# parameter group -> (data groups it is fitted on, parameters)
PARAM_GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "linear": (("linear", "lm_head"), ("linear_mem", "linear_comp", "linear_op_s")),
    "elementwise": (
        ("elementwise",),
        (
            "elem_norm_mem",
            "elem_act_mem",
            "elem_rope_mem",
            "elem_embed_mem",
            "elem_vidur_norm_mem",
            "elem_add_mem",
            "elem_vidur_act_mem",
            "elem_vidur_rope_mem",
            "elem_vidur_embed_mem",
            "elem_op_s",
            "elem_vidur_norm_op_s",
            "elem_add_op_s",
            "elem_vidur_act_op_s",
            "elem_vidur_rope_op_s",
            "elem_vidur_embed_op_s",
            "elem_l2_gain",
        ),
    ),
    "attention": (
        ("attention",),
        (
            "attn_call_s",
            "attn_decode_mem",
            "attn_decode_req_s",
            "attn_mixed_decode_mem",
            "attn_cta_s",
            "attn_tile_comp",
            "attn_empty_cta_s",
            "attn_l2_reuse",
            "attn_kv_reach_bytes",
            "attn_l2_frac",
            "attn_desync_bytes",
            "attn_prefill_comp",
            "attn_prefill_req_s",
        ),
    ),
    "sampler": (("sampler",), ("sampler_mem", "sampler_s")),
}
_BOUNDS_EFF = (0.005, 4.0)
_BOUNDS_S = (1e-9, 5e-3)
# Parameters with their own physical range: a hit fraction cannot pass 1; a KV footprint is
# somewhere between 100 MB and 1 TB; a desync lag between 10 MB and 100 GB.
_BOUNDS_NAMED = {
    "attn_l2_reuse": (0.005, 1.0),
    "attn_l2_frac": (0.05, 1.0),
    "attn_kv_reach_bytes": (1e8, 1e12),
    "attn_desync_bytes": (1e7, 1e11),
    "elem_l2_gain": (1.0, 20.0),
}


# A DRAM efficiency cannot pass the datasheet bandwidth: what looks faster is L2 (its own term).
_BOUNDS_MEM = (0.005, 1.0)


def _bounds(name: str) -> tuple[float, float]:
    if name in _BOUNDS_NAMED:
        return _BOUNDS_NAMED[name]
    if name.endswith("_mem"):
        return _BOUNDS_MEM
    return _BOUNDS_S if name.endswith("_s") else _BOUNDS_EFF


GpuLookup = Callable[[str], GpuSpec]


def predict(ps: ProfileSet, gpu: GpuSpec, eff: DeviceEfficiency) -> FloatArray:
    """Model seconds for every row of one measured series."""
    model, tp, x = ps.model, ps.tp, ps.x
    if ps.group == "linear":
        gemm = next(g for g in model.layer_gemms(tp) if g.name == ps.op)
        return linear_time(gemm.in_dim, gemm.out_dim, x, model.dtype_bytes, gpu, eff)
    if ps.group == "lm_head":
        head = model.lm_head_gemm(tp)
        return linear_time(head.in_dim, head.out_dim, x, model.dtype_bytes, gpu, eff)
    if ps.group == "elementwise":
        return elementwise_time(ps.op, elementwise_bytes_per_token(model, ps.op, tp), x, gpu, eff)
    if ps.group == "sampler":
        return sampler_time(x, model, gpu, eff)
    chunk, prior, n_dec, ctx = x[:, 0], x[:, 1], x[:, 2], x[:, 3]
    kv_tok = model.kv_bytes_per_token_per_layer(tp)
    decode = n_dec * (
        eff.attn_decode_req_s + ctx * kv_tok / (gpu.mem_bw_bytes_s * eff.attn_decode_mem)
    )
    prefill = prefill_attention_time(chunk, prior, model, tp, gpu, eff)
    # with a prefill chunk, every decode's m-blocks past its first are empty CTAs
    blocks = attention_m_blocks(chunk, attention_tile_m(gpu))
    empty = n_dec * model.num_attention_heads / tp * np.maximum(blocks - 1, 0)
    # the prefill's CTAs shift the decode waves by the keys its longest CTA streams
    pf_ctas = blocks * model.num_attention_heads / tp
    mixed = mixed_attention_time(
        n_dec, n_dec * ctx, prefill, empty, model, tp, gpu, eff, pf_ctas, prior + chunk
    )
    return eff.attn_call_s + np.where(chunk > 0, mixed, decode)


def _constrained(
    sets: list[ProfileSet], gpus: GpuLookup, base: DeviceEfficiency, names: tuple[str, ...]
) -> tuple[str, ...]:
    """The parameters the rows actually depend on; others must keep their base value."""
    ref = np.concatenate([predict(s, gpus(s.device), base) for s in sets])
    kept = []
    for name in names:
        bumped = base.updated({name: getattr(base, name) * 1.5})
        alt = np.concatenate([predict(s, gpus(s.device), bumped) for s in sets])
        if not np.allclose(alt, ref, rtol=1e-9, atol=0.0):
            kept.append(name)
    return tuple(kept)


def _fit_group(
    sets: list[ProfileSet], gpus: GpuLookup, base: DeviceEfficiency, names: tuple[str, ...]
) -> DeviceEfficiency:
    names = _constrained(sets, gpus, base, names)
    if not names:
        return base
    x0 = np.log([getattr(base, n) for n in names])
    lo = np.log([_bounds(n)[0] for n in names])
    hi = np.log([_bounds(n)[1] for n in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    devs = [gpus(s.device) for s in sets]
    weights = [1.0 / np.sqrt(len(s.seconds)) for s in sets]

    def residuals(logp: FloatArray) -> FloatArray:
        eff = base.updated(dict(zip(names, np.exp(logp).tolist(), strict=True)))
        parts = [
            w * (predict(s, g, eff) - s.seconds) / np.sqrt(s.seconds * s.seconds.mean())
            for s, g, w in zip(sets, devs, weights, strict=True)
        ]
        return np.concatenate(parts)

    sol = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, max_nfev=200)
    return base.updated(dict(zip(names, np.exp(sol.x).tolist(), strict=True)))


def fit_efficiency(
    sets: Iterable[ProfileSet], gpus: GpuLookup, base: DeviceEfficiency | None = None
) -> DeviceEfficiency:
    """Fit efficiency factors to `sets` (one device or pooled over several).

    Args:
        sets: measured series; each names its device, resolved to peaks by `gpus`.
        gpus: device name -> `GpuSpec` (datasheet peaks the factors are relative to).
        base: starting values, kept for groups without rows (default: `DeviceEfficiency()`).

    Examples:
        >>> from maserve_prefect.engines.catalog import get_gpu  # doctest: +SKIP
        >>> eff = fit_efficiency(load_profiles(root).sets, get_gpu)  # doctest: +SKIP
    """
    eff = base or DeviceEfficiency()
    pool = [s for s in sets if s.seconds.size and np.all(s.seconds > 0)]
    if not pool:
        raise ConfigError("no profile rows with positive times to fit")
    for data_groups, names in PARAM_GROUPS.values():
        chosen = [s for s in pool if s.group in data_groups]
        if chosen:
            eff = _fit_group(chosen, gpus, eff, names)
    return eff


@dataclass(slots=True)
class WapeTable:
    """Accumulated |error| and measured seconds per (device, group); groups include "all"."""

    abs_err: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    meas: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))

    def add(self, ps: ProfileSet, pred: FloatArray) -> None:
        err = np.abs(pred - ps.seconds)
        for group in (ps.group, "all"):
            self.abs_err[(ps.device, group)] += float(err.sum())
            self.meas[(ps.device, group)] += float(ps.seconds.sum())
        for label, rows in operator_rows(ps):
            self.abs_err[(ps.device, f"op:{label}")] += float(err[rows].sum())
            self.meas[(ps.device, f"op:{label}")] += float(ps.seconds[rows].sum())

    def operators(self, device: str) -> list[str]:
        """Operator labels (see `operator_rows`) with rows for `device`."""
        return sorted(g[3:] for d, g in self.meas if d == device and g.startswith("op:"))

    def wape(self, device: str, group: str = "all") -> float | None:
        tot = self.meas.get((device, group), 0.0)
        return self.abs_err[(device, group)] / tot if tot > 0 else None

    def keys(self) -> list[tuple[str, str]]:
        return sorted(self.meas)


def operator_rows(ps: ProfileSet) -> list[tuple[str, npt.NDArray[np.bool_]]]:
    """A series' rows by operator label: its op, and for attention its regime (decode-only,
    prefill-only, mixed prefill + decode steps)."""
    if ps.op != "attention":
        return [(ps.op, np.ones(ps.seconds.shape, dtype=bool))]
    chunk, n_dec = ps.x[:, 0], ps.x[:, 2]
    return [
        ("attention decode", chunk == 0),
        ("attention prefill", (chunk > 0) & (n_dec == 0)),
        ("attention mixed", (chunk > 0) & (n_dec > 0)),
    ]


def score(
    sets: Iterable[ProfileSet], gpus: GpuLookup, eff_for: Callable[[str], DeviceEfficiency]
) -> WapeTable:
    """WAPE of the model with `eff_for(device)` on every row of `sets`."""
    table = WapeTable()
    for ps in sets:
        table.add(ps, predict(ps, gpus(ps.device), eff_for(ps.device)))
    return table


def in_sample(sets: list[ProfileSet], gpus: GpuLookup) -> WapeTable:
    """Per-device fit scored on its own rows (not a fidelity figure)."""
    fits = {d: fit_efficiency([s for s in sets if s.device == d], gpus) for d in _devices(sets)}
    return score(sets, gpus, fits.__getitem__)


def leave_one_model_out(
    sets: list[ProfileSet], gpus: GpuLookup, base: DeviceEfficiency | None = None
) -> WapeTable:
    """Per device, fit on all but one model and score the held-out model; every model in turn.

    Devices with a single model are skipped (nothing to hold out against)."""
    table = WapeTable()
    for device in _devices(sets):
        mine = [s for s in sets if s.device == device]
        models = sorted({s.model.name for s in mine})
        if len(models) < 2:
            continue
        for held in models:
            train = [s for s in mine if s.model.name != held]
            eff = fit_efficiency(train, gpus, base)
            for ps in mine:
                if ps.model.name == held:
                    table.add(ps, predict(ps, gpus(device), eff))
    return table


def leave_one_device_out(
    sets: list[ProfileSet], gpus: GpuLookup, base: DeviceEfficiency | None = None
) -> WapeTable:
    """Fit shared factors on all other devices and score the held-out device; each in turn.

    Only series whose parameters the other devices' rows constrain are scored (no held-out
    figure is computed from parameters no data constrained): groups the others measured, and
    within elementwise only the kernels they measured (Vidur's unfused kernels and vLLM's fused
    ones have separate factors)."""
    table = WapeTable()
    devices = _devices(sets)
    if len(devices) < 2:
        return table
    for held in devices:
        train = [s for s in sets if s.device != held]
        eff = fit_efficiency(train, gpus, base)
        fitted = {_fit_kind(s) for s in train}
        for ps in sets:
            if ps.device == held and _fit_kind(ps) in fitted:
                table.add(ps, predict(ps, gpus(held), eff))
    return table


def _fit_kind(ps: ProfileSet) -> str:
    """What a series' own parameters are: its elementwise kernel's factor, else its parameter
    group (linear and lm_head share theirs)."""
    if ps.group == "elementwise":
        return ELEMENTWISE_EFF_FIELD[ps.op]
    return next(key for key, (groups, _names) in PARAM_GROUPS.items() if ps.group in groups)


def unfitted(sets: list[ProfileSet], gpus: GpuLookup) -> WapeTable:
    """The hand-set `DeviceEfficiency()` defaults, no fit at all (the baseline to beat)."""
    default = DeviceEfficiency()
    return score(sets, gpus, lambda _device: default)


def fit_all(
    sets: list[ProfileSet], gpus: GpuLookup
) -> tuple[DeviceEfficiency, dict[str, DeviceEfficiency]]:
    """The shipped fit: a pooled default over every device, then each device from that default."""
    pooled = fit_efficiency(sets, gpus)
    per_device = {
        d: fit_efficiency([s for s in sets if s.device == d], gpus, pooled) for d in _devices(sets)
    }
    return pooled, per_device


def _devices(sets: Iterable[ProfileSet]) -> list[str]:
    return sorted({s.device for s in sets})


def summarize(table: WapeTable) -> Mapping[str, dict[str, float]]:
    """`{device: {group: wape}}` for printing or JSON."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for device, group in table.keys():
        value = table.wape(device, group)
        if value is not None:
            out[device][group] = value
    return dict(out)
