"""Loaders that turn measured kernel profiles into one row form the step model is scored on.

One idea: whatever the source, a measurement is (device, model, tensor-parallel degree, operator)
plus a batch shape and seconds; `ProfileSet` holds one such (device, model, tp, op) series as
numpy arrays, so a fit evaluates a whole series in one vectorised call.

Two formats are read, found anywhere under the given directory:

- Vidur (`microsoft/vidur`, `<device>/<model>/mlp.csv`): per-layer operator times in
  milliseconds, columns `time_stats.<op>.median` plus `num_tokens`,
  `num_tensor_parallel_workers` and the model shape (`n_head`, `n_kv_head`, `n_embd`,
  `n_expanded_embd`, `use_gated_mlp`). Rows with the same (tp, tokens) are averaged.
- LLMServingSim (`casys-kaist/LLMServingSim`, a folder with `meta.yaml`, `dense.csv`,
  `attention.csv`, `per_sequence.csv`): microseconds; `meta.yaml` names the GPU and model.

Devices and models are resolved through the catalog's aliases; a Vidur model missing from the
catalog gets a spec built from its shape columns, so any Vidur directory can be scored.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import yaml

from maserve_prefect.engines.catalog.devices import get_gpu
from maserve_prefect.engines.catalog.models import ModelSpec, get_model
from maserve_prefect.errors import ConfigError

FloatArray = npt.NDArray[np.float64]

GROUP_OF_OP = {
    "qkv": "linear",
    "o": "linear",
    "gate_up": "linear",
    "down": "linear",
    "norm": "elementwise",
    "add_norm": "elementwise",
    "add": "elementwise",
    "act": "elementwise",
    "rope": "elementwise",
    "qk_norm": "elementwise",
    "embedding": "elementwise",
    # Vidur's (Sarathi-Serve's) own unfused kernels, distinct from vLLM's fused ones above
    "emb": "elementwise",
    "mlp_act": "elementwise",
    "attn_rope": "elementwise",
    "attention": "attention",
    "lm_head": "lm_head",
    "sampler": "sampler",
}
GROUPS = ("linear", "elementwise", "attention", "lm_head", "sampler")

# Vidur's elementwise operators keep their own names: they are other kernels than vLLM's
# (measured efficiencies differ 2-7x on the same op), so they get their own efficiency factors.
VIDUR_OPS = {
    "emb": "emb",
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_pre_proj": "qkv",
    "attn_rope": "attn_rope",
    "attn_post_proj": "o",
    "mlp_up_proj": "gate_up",
    "mlp_act": "mlp_act",
    "mlp_down_proj": "down",
    "add": "add",
}
LSS_OPS = {
    "qkv_proj": "qkv",
    "o_proj": "o",
    "gate_up_proj": "gate_up",
    "down_proj": "down",
    "layernorm": "add_norm",
    "final_layernorm": "add_norm",
    "act_fn": "act",
    "rotary_emb": "rope",
    "qk_norm": "qk_norm",
    "embedding": "embedding",
    "lm_head": "lm_head",
    "sampler": "sampler",
}


@dataclass(slots=True)
class ProfileSet:
    """One measured series: `x` is tokens (linear / elementwise), sequences (lm_head, sampler)
    or an (n, 4) array of (prefill_chunk, kv_prefill, n_decode, kv_decode) for attention."""

    device: str
    model: ModelSpec
    tp: int
    op: str
    x: FloatArray
    seconds: FloatArray
    source: str

    @property
    def group(self) -> str:
        return GROUP_OF_OP[self.op]


@dataclass(slots=True)
class ProfileCollection:
    sets: list[ProfileSet] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "file: column/op" not modelled

    def devices(self) -> list[str]:
        return sorted({s.device for s in self.sets})

    def models(self, device: str | None = None) -> list[str]:
        return sorted({s.model.name for s in self.sets if device is None or s.device == device})


def _device_name(label: str) -> str:
    """The catalog's name for a profile's device label (built-in or user entry), else the label
    itself (scoring it then fails with the catalog's unknown-device error)."""
    try:
        return get_gpu(label).name
    except ConfigError:
        return label


def _vidur_model(name: str, row: dict[str, str], path: Path) -> ModelSpec:
    try:
        heads, kv, hidden = int(row["n_head"]), int(row["n_kv_head"]), int(row["n_embd"])
        inter, vocab = int(row["n_expanded_embd"]), int(row["vocab_size"])
        gated = row["use_gated_mlp"].strip().lower() == "true"
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{path}:2: missing or bad model-shape column ({exc})") from exc
    try:
        spec = get_model(name)
    except ConfigError:
        return ModelSpec(
            name, hidden, 1, heads, kv, hidden // heads, inter, vocab, False, 0, gated_mlp=gated
        )
    shape = (
        spec.hidden_size,
        spec.num_attention_heads,
        spec.num_kv_heads,
        spec.intermediate_size,
        spec.gated_mlp,
    )
    if shape != (hidden, heads, kv, inter, gated):
        raise ConfigError(
            f"{path}:2: shape columns {(hidden, heads, kv, inter, gated)} disagree with the "
            f"catalog's {spec.name} {shape}; rename the folder or fix the catalog entry"
        )
    return spec


def load_vidur(path: Path, device: str) -> list[ProfileSet]:
    """Read one Vidur `mlp.csv` (times in ms) into per-(tp, op) series in seconds."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ConfigError(f"{path}: no data rows")
    model = _vidur_model(path.parent.name, rows[0], path)
    ops = sorted({k.split(".")[1] for k in rows[0] if k.startswith("time_stats.")})
    series: dict[tuple[int, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line_no, row in enumerate(rows, start=2):
        try:
            tp = int(row["num_tensor_parallel_workers"])
            tokens = int(row["num_tokens"])
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"{path}:{line_no}: bad num_tokens / tp column ({exc})") from exc
        for op in ops:
            raw = row.get(f"time_stats.{op}.median", "")
            if op in VIDUR_OPS and raw:
                series[(tp, op)][tokens].append(float(raw) * 1e-3)
    out = []
    for (tp, op), by_tokens in sorted(series.items()):
        x = np.array(sorted(by_tokens), dtype=np.float64)
        y = np.array([np.mean(by_tokens[int(t)]) for t in x], dtype=np.float64)
        out.append(ProfileSet(device, model, tp, VIDUR_OPS[op], x, y, str(path)))
    return out


def load_llmservingsim(folder: Path) -> tuple[list[ProfileSet], list[str]]:
    """Read one LLMServingSim tp1 profile folder (times in us) into series in seconds."""
    meta_path = folder / "meta.yaml"
    meta = yaml.safe_load(meta_path.read_text()) or {}
    if "hardware" not in meta or "model" not in meta:
        raise ConfigError(f"{meta_path}: needs 'hardware' and 'model' fields")
    device = _device_name(str(meta["hardware"]))
    model = get_model(str(meta["model"]))
    out: list[ProfileSet] = []
    skipped: list[str] = []
    for name in ("dense.csv", "per_sequence.csv"):
        path = folder / name
        if not path.exists():
            continue
        by_op: dict[str, list[tuple[float, float]]] = defaultdict(list)
        with path.open(newline="") as fh:
            for line_no, row in enumerate(csv.reader(fh), start=1):
                if line_no == 1:
                    continue
                try:
                    by_op[row[0]].append((float(row[1]), float(row[2]) * 1e-6))
                except (IndexError, ValueError) as exc:
                    raise ConfigError(
                        f"{path}:{line_no}: expected layer,count,time_us ({exc})"
                    ) from exc
        for op, pairs in sorted(by_op.items()):
            if op not in LSS_OPS:
                skipped.append(f"{path}: {op}")
                continue
            arr = np.array(sorted(pairs), dtype=np.float64)
            out.append(ProfileSet(device, model, 1, LSS_OPS[op], arr[:, 0], arr[:, 1], str(path)))
    attn_path = folder / "attention.csv"
    if attn_path.exists():
        try:
            table = np.loadtxt(attn_path, delimiter=",", skiprows=1, ndmin=2)
        except ValueError as exc:
            raise ConfigError(f"{attn_path}: expected 5 numeric columns ({exc})") from exc
        if table.shape[1] != 5:
            raise ConfigError(
                f"{attn_path}:1: expected prefill_chunk,kv_prefill,n_decode,kv_decode,time_us"
            )
        out.append(
            ProfileSet(
                device, model, 1, "attention", table[:, :4], table[:, 4] * 1e-6, str(attn_path)
            )
        )
    return out, skipped


def load_profiles(*roots: Path) -> ProfileCollection:
    """Find and load every Vidur and LLMServingSim profile under `roots`.

    Raises:
        ConfigError: a root does not exist, holds no profiles, or a file is malformed.

    Examples:
        >>> from pathlib import Path
        >>> load_profiles(Path("../shared/data/profiles")).devices()  # doctest: +SKIP
        ['A100-80GB', 'H100', 'RTX PRO 6000']
    """
    coll = ProfileCollection()
    for root in roots:
        if not root.is_dir():
            raise ConfigError(f"profile directory {root} does not exist")
        for path in sorted(root.rglob("mlp.csv")):
            with path.open() as fh:
                if "time_stats." not in fh.readline():
                    coll.skipped.append(f"{path}: not a Vidur profile")
                    continue
            coll.sets.extend(load_vidur(path, _device_name(path.parent.parent.name)))
        for meta in sorted(root.rglob("meta.yaml")):
            sets, skipped = load_llmservingsim(meta.parent)
            coll.sets.extend(sets)
            coll.skipped.extend(skipped)
    if not coll.sets:
        raise ConfigError(
            f"no profiles found under {', '.join(map(str, roots))}; expected Vidur "
            "<device>/<model>/mlp.csv or LLMServingSim folders with meta.yaml + dense.csv"
        )
    return coll
