"""Predictor adapters: a fitted cost predictor served to pool plans as a `CostModel`.

This module is the `predictors` entry of the `maserve_prefect.cost_models` plugin group: the
library reaches it through `maserve_prefect.pool.costs.cost_model_source()`, calling `KINDS`,
`training_rows`, `training_scores` and `suite_cost_model`.

One idea: a plan never runs a predictor. `predictor_cost_model(kind, ...)` asks the formula
(roofline), scalar-GBDT, learned operator-graph (LightGBM) or message-passing (`gnn`) predictor once for every bucket point of the
pool's models and GPU kinds and returns the `BucketTable` (`predictors.tables`), which already
answers the `CostModel` protocol by dict lookup. Buckets round a request up, so a looked-up
runtime is that of a request at least as large; `bucket_grid` spaces them geometrically up to
the workload's largest request.

Training data (`TrainingSpec` → `training_rows`) is what `benchmarks/predictor_eval.py` uses:
the shared measured operator profiles composed into request runtimes (runtime only), plus the
simulator's profiling sweep (runtime, peak memory, load time) — here swept on the pool's own GPU
kinds next to a few others, as an operator would profile the devices they own. The held-out
quality of each predictor (never fitted on the group it is scored on) is `predictor_scores`.

Caching, so a suite does not refit every run: a fitted learned predictor is saved under
`$MASERVE_HOME/predictors/<kind>-<hash>/`, the hash covering the training rows, the predictor's
feature list and its hyper-parameters; a built table is saved under `.../tables/`, keyed by that
hash, the models, the GPU kinds and the buckets; held-out scores under `.../scores/`. Any change
of rows or settings gives a new key (old entries are never reused by mistake).

Examples:
    >>> b = Buckets((1, 4), (128, 1024), (16, 256))
    >>> t = predictor_cost_model("formula", models=["Qwen3-0.6B"], devices=["A100-40GB"],
    ...                          buckets=b, cache=False)
    >>> t.runtime_s("Qwen3-0.6B", "A100-40GB", 1, 100, 10) < t.runtime_s(
    ...     "Qwen3-0.6B", "A100-40GB", 1, 900, 200)
    True
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from maserve_prefect.predictors import (
    Buckets,
    BucketTable,
    FormulaPredictor,
    GBDTPredictor,
    GraphPredictor,
    Predictor,
    Row,
)
from maserve_prefect.predictors.evaluate import SPLIT_KINDS, Factory, evaluate
from maserve_prefect.predictors.gnn import GNNPredictor
from maserve_prefect.predictors.learned import LightGBMPredictor
from maserve_prefect.predictors.profiling import measured_rows, shape_grid, simulator_rows

from maserve_prefect.engines.catalog import get_gpu
from maserve_prefect.errors import ConfigError
from maserve_prefect.pool.costs import TrainingSpec
from maserve_prefect.pool.recorded import POOL_MODELS
from maserve_prefect.settings import Settings

KINDS = ("formula", "gbdt", "graph", "gnn")
"""Predictor kinds a pool arm can use: roofline formula, scalar GBDT, learned graph (LightGBM
over operator features), message passing over the operator graph."""

Learned: TypeAlias = LightGBMPredictor | GNNPredictor
_LEARNED: dict[str, type[LightGBMPredictor] | type[GNNPredictor]] = {
    "gbdt": GBDTPredictor,
    "graph": GraphPredictor,
    "gnn": GNNPredictor,
}


def new_learned(kind: str, num_trees: int) -> Learned:
    """A fresh, unfitted learned predictor of `kind` (`num_trees` is LightGBM's; the message-
    passing network keeps its own defaults).

    Raises:
        ConfigError: `kind` is not a learned predictor.
    """
    cls = _LEARNED.get(kind)
    if cls is None:
        raise ConfigError(f"predictor {kind!r} is not learned; fit one of {sorted(_LEARNED)}")
    if issubclass(cls, LightGBMPredictor):
        return cls(num_trees=num_trees)
    return cls()


@dataclass(slots=True)
class TrainingRows:
    """The measured and simulator rows of a `TrainingSpec`."""

    measured: list[Row] = field(default_factory=list)
    simulator: list[Row] = field(default_factory=list)

    @property
    def all(self) -> list[Row]:
        return self.measured + self.simulator


def training_rows(spec: TrainingSpec) -> TrainingRows:
    """Build the rows (measured compositions, then the simulator sweep).

    Raises:
        ConfigError: the profile folder does not exist.
    """
    if not spec.profiles.is_dir():
        raise ConfigError(
            f"measured profiles {spec.profiles} not found; point `profiles` at the shared "
            "data checkout (../shared/data/profiles)"
        )
    measured = measured_rows(spec.profiles.resolve(), shape_grid(*spec.measured_shapes))
    sim = simulator_rows(spec.sim_models, spec.sim_devices, shape_grid(*spec.sim_shapes))
    return TrainingRows(measured.rows, sim.rows)


def rows_digest(rows: Sequence[Row], *extra: object) -> str:
    """A short SHA-256 of the rows (every field, floats by `repr`) and `extra` settings.

    Examples:
        >>> from maserve_prefect.predictors.rows import NAN
        >>> r = Row("Qwen3-8B", "H100", 1, 8, 8, 1.0, NAN, NAN, "x")
        >>> rows_digest([r]) == rows_digest([r]) != rows_digest([r], "trees=5")
        True
    """
    h = hashlib.sha256()
    for part in extra:
        h.update(repr(part).encode())
    for r in rows:
        shape = (r.model, r.device, r.batch, r.input_len, r.output_len, r.source)
        values = (r.runtime_s, r.peak_mem_bytes, r.load_s, r.modelled_share)
        h.update(repr((shape, tuple(float(v) for v in values))).encode())
    return h.hexdigest()[:16]


def predictor_cache_dir() -> Path:
    """`$MASERVE_HOME/predictors`."""
    return Settings.from_env().home / "predictors"


@dataclass(frozen=True, slots=True)
class CachedFit:
    """A learned predictor, where it is saved, and whether this call fitted it."""

    predictor: Learned
    path: Path
    fitted: bool
    key: str


def fit_cached(
    kind: str, rows: Sequence[Row], num_trees: int, cache_dir: Path | None = None
) -> CachedFit:
    """The `kind` predictor fitted on `rows`: loaded from the cache, else fitted and saved.

    Raises:
        ConfigError: `kind` is not a learned predictor, or no row observes any target.
    """
    probe = new_learned(kind, num_trees)
    key = _fit_key(kind, rows, num_trees)
    folder = (cache_dir or predictor_cache_dir()) / f"{kind}-{key}"
    if (folder / "meta.json").is_file():
        return CachedFit(_LEARNED[kind].load(folder), folder, False, key)
    probe.fit(rows)
    _save_atomically(folder, probe.save)
    return CachedFit(probe, folder, True, key)


def _save_atomically(folder: Path, save: Any) -> None:
    """Save into a temp folder beside `folder`, then rename (a cache entry is whole or absent)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        save(tmp)
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "meta.json").is_file():  # not a lost race with another writer
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bucket_grid(
    max_input: int, max_output: int, *, steps_per_doubling: int = 3, max_batch: int = 512
) -> Buckets:
    """Geometric buckets: `steps_per_doubling` points per doubling of input (from 16) and output
    (from 1) lengths up to the given maxima; batches are powers of two up to `max_batch`.

    Examples:
        >>> b = bucket_grid(100, 10, steps_per_doubling=1, max_batch=4)
        >>> b.batch, b.input, b.output
        ((1, 2, 4), (16, 32, 64, 128), (1, 2, 4, 8, 16))
    """
    if steps_per_doubling < 1 or max_batch < 1:
        raise ConfigError("bucket_grid: steps_per_doubling and max_batch must be >= 1")

    def axis(start: int, top: int) -> tuple[int, ...]:
        out: list[int] = []
        k = 0
        while not out or out[-1] < top:
            v = math.ceil(start * 2 ** (k / steps_per_doubling) - 1e-9)
            if not out or v > out[-1]:
                out.append(v)
            k += 1
        return tuple(out)

    batches = axis(1, max_batch) if steps_per_doubling == 1 else None
    return Buckets(
        batches or tuple(2**i for i in range(math.ceil(math.log2(max_batch)) + 1)),
        axis(16, max(max_input, 1)),
        axis(1, max(max_output, 1)),
    )


def _fit_key(kind: str, rows: Sequence[Row], num_trees: int) -> str:
    probe = new_learned(kind, num_trees)
    return rows_digest(rows, kind, probe.feature_names, sorted(probe.hyper.items()))


def predictor_cost_model(
    kind: str,
    *,
    models: Sequence[str] = POOL_MODELS,
    devices: Sequence[str] = ("V100-32GB", "A100-40GB"),
    buckets: Buckets | None = None,
    training: TrainingSpec | TrainingRows | None = None,
    num_trees: int | None = None,
    cache_dir: Path | None = None,
    cache: bool = True,
) -> BucketTable:
    """A `BucketTable` (a `CostModel`) of predictor `kind` for `models` on GPU kinds `devices`.

    Args:
        kind: one of `KINDS`.
        devices: GPU catalog names or device names ("V100-32GB:3" counts as V100-32GB).
        buckets: the grid (default `bucket_grid(8192, 2048)`).
        training: rows (or how to build them) for the learned kinds; ignored by the formula.
        num_trees: LightGBM rounds (default: the `TrainingSpec`'s, else 300).
        cache_dir: where fits and tables are kept (default `$MASERVE_HOME/predictors`).
        cache: False builds (and fits) afresh and writes nothing.

    Raises:
        ConfigError: unknown kind or names, a learned kind without training data.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown predictor {kind!r}; use one of {', '.join(KINDS)}")
    grid = buckets or bucket_grid(8192, 2048)
    gpus = sorted({get_gpu(d.split(":", 1)[0]).name for d in devices})
    rows: list[Row] = []
    if num_trees is None:
        num_trees = training.num_trees if isinstance(training, TrainingSpec) else 300
    if kind != "formula":
        if training is None:
            raise ConfigError(f"predictor {kind!r} needs training rows; pass `training`")
        rows = (training_rows(training) if isinstance(training, TrainingSpec) else training).all
    folder = cache_dir or predictor_cache_dir()
    if not cache:
        predictor: Predictor = (
            FormulaPredictor() if kind == "formula" else new_learned(kind, num_trees).fit(rows)
        )
        return BucketTable.build(predictor, list(models), gpus, grid)
    source = "formula" if kind == "formula" else f"{kind}-{_fit_key(kind, rows, num_trees)}"
    table_key = hashlib.sha256(
        repr((source, list(models), gpus, grid.batch, grid.input, grid.output)).encode()
    ).hexdigest()[:16]
    path = folder / "tables" / f"{kind}-{table_key}.json"
    if path.is_file():
        return BucketTable.load(path)
    if kind == "formula":
        predictor = FormulaPredictor()
    else:
        predictor = fit_cached(kind, rows, num_trees, folder).predictor
    table = BucketTable.build(predictor, list(models), gpus, grid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    table.save(tmp)
    os.replace(tmp, path)
    return table


# -- held-out quality ------------------------------------------------------------------------

PREDICTOR_LABELS = {
    "formula": "formula (roofline)",
    "gbdt": "scalar GBDT",
    "graph": "learned graph",
    "gnn": "message passing (GNN)",
}


def _factories(num_trees: int) -> dict[str, Factory]:
    return {
        PREDICTOR_LABELS["formula"]: FormulaPredictor,
        PREDICTOR_LABELS["gbdt"]: lambda: GBDTPredictor(num_trees=num_trees),
        PREDICTOR_LABELS["graph"]: lambda: GraphPredictor(num_trees=num_trees),
        PREDICTOR_LABELS["gnn"]: GNNPredictor,
    }


def predictor_scores(
    rows: Sequence[Row], num_trees: int, cache_dir: Path | None = None
) -> list[dict[str, Any]]:
    """Held-out runtime scores of the four predictors on `rows` (`predictors.evaluate`, the
    functions behind `benchmarks/predictor_eval.py`): one row per split kind and predictor with
    WAPE, pairwise ordering accuracy and window fit at the median. Cached like fits.
    """
    factories = _factories(num_trees)
    key = rows_digest(rows, "scores", num_trees, SPLIT_KINDS, sorted(factories))
    path = (cache_dir or predictor_cache_dir()) / "scores" / f"{key}.json"
    if path.is_file():
        out: list[dict[str, Any]] = json.loads(path.read_text())
        return out
    report = evaluate(factories, list(rows))
    out = []
    for split in SPLIT_KINDS:
        for name, scores in report[split].items():
            rt = scores["pooled"]["runtime_s"]
            out.append(
                {
                    "held_out": split,
                    "predictor": name,
                    "runtime_wape": rt.get("wape", math.nan),
                    "ordering_accuracy": rt.get("ordering_accuracy", math.nan),
                    "window_fit_median": rt.get("window_fit_median", math.nan),
                    "num_rows": rt["num_rows"],
                    "num_folds": len(scores["folds"]),
                }
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, path)
    return out


def training_scores(rows: TrainingRows, num_trees: int) -> list[dict[str, Any]]:
    """Held-out runtime scores on the measured rows of `rows` (`predictor_scores`)."""
    return predictor_scores(rows.measured, num_trees)


def suite_cost_model(
    kind: str,
    *,
    models: Sequence[str],
    devices: Sequence[str],
    max_input_len: int,
    max_output_len: int,
    steps_per_doubling: int,
    training: TrainingRows,
    num_trees: int,
) -> BucketTable:
    """The `kind` predictor's table for a suite: buckets up to its largest request
    (`bucket_grid`), the suite's models and devices, fitted on `training`."""
    grid = bucket_grid(max_input_len, max_output_len, steps_per_doubling=steps_per_doubling)
    return predictor_cost_model(
        kind, models=models, devices=devices, buckets=grid, training=training, num_trees=num_trees
    )
