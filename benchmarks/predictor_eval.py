"""How well the cost predictors predict on devices and models they never saw.

Usage:
    python benchmarks/predictor_eval.py [--profiles DIR] [--out FIGURES.json] [--rows-dir DIR]
                                        [--full] [--trees N]

Builds two row sets (`maserve_prefect.predictors.profiling`):

- measured: the real per-operator GPU profiles in `../shared/data/profiles` (Vidur A100 / H100,
  LLMServingSim RTX PRO 6000) composed into request-batch runtimes; runtime only (memory and
  load time were not measured). On the Vidur devices attention and lm_head are filled in by the
  calibrated roofline; the table caption gives that modelled share;
- simulator: the discrete-event simulator's profiling sweep (runtime, peak memory, load time).

and scores the formula (roofline), scalar GBDT, learned operator-graph LightGBM and the
message-passing network over the operator graph (`GNNPredictor`, numpy) with three splits:
held-out device, held-out model (architecture), and the paper's random held-out configurations
(`config`, 5 folds): WAPE of runtime / peak memory / load time, pairwise runtime-ordering
accuracy, and window-fit agreement at the median runtime (§4.4 of the paper; see
`predictors/evaluate.py`). The headline table is measured rows only; simulator rows have their
own table and are never the headline. Prints rich tables and writes every figure (pooled and per
fold) to `--out` as JSON. Default run: small sweeps (about 3 minutes on 2 shared cores, most of
it the network's 28 held-out fits);
`--full` sweeps more shapes, models and devices. The paper's Table 1 is printed beside ours.
"""

from __future__ import annotations

import os

# The network's matrices are small (nodes × 16): a multi-threaded BLAS gains nothing on them and
# spins badly on a busy machine (a fit went from ~5 s to minutes on 2 shared cores). Set before
# numpy loads; an explicit setting in the environment wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from maserve_prefect.predictors import (
    FormulaPredictor,
    GBDTPredictor,
    GNNPredictor,
    GraphPredictor,
)
from maserve_prefect.predictors.evaluate import ALL_SPLIT_KINDS, Factory, evaluate
from maserve_prefect.predictors.profiling import (
    finite_share,
    measured_rows,
    shape_grid,
    simulator_rows,
    write_rows,
)
from maserve_prefect.predictors.rows import Row
from rich.console import Console
from rich.table import Table

from maserve_prefect.errors import ConfigError, MaserveError

DEFAULT_PROFILES = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "profiles"

MEASURED_SHAPES = {
    False: ((1, 4, 16, 64), (128, 512, 2048), (16, 128, 512)),
    True: ((1, 2, 4, 8, 16, 32, 64, 128), (64, 128, 256, 512, 1024, 2048, 4096), (8, 32, 128, 512)),
}
SIM_SHAPES = {
    False: ((1, 8, 32), (128, 1024, 4096), (16, 128, 512)),
    True: ((1, 4, 16, 64, 128), (128, 512, 1024, 2048, 4096, 8192), (16, 64, 256, 1024)),
}
SIM_MODELS = {
    False: ("Qwen3-0.6B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Llama-3.1-8B", "Phi-2"),
    True: (
        "Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B",
        "Llama-3.1-8B", "Llama-2-7B", "Phi-2", "InternLM-20B",
    ),
}  # fmt: skip
SIM_DEVICES = {
    False: ("A100-80GB", "H100", "L40S", "RTX PRO 6000"),
    True: ("A100-40GB", "A100-80GB", "H100", "H200", "L40S", "RTX PRO 6000", "RTX PRO 5000"),
}
TARGET_LABELS = {"runtime_s": "runtime", "peak_mem_bytes": "peak mem", "load_s": "load"}
# The paper's Table 1 (§4.4): WAPE (%) of loading time, runtime, peak VRAM; decision accuracy (%)
# of runtime ordering and window fit (window: the median measured runtime, 48.85 s), on 2,798
# held-out measured Qwen3 deployment configurations.
PAPER_TABLE_1 = (
    ("Predictor (GNN)", "8.05", "7.25", "14.08", "97.94", "97.82"),
    ("Formula", "27.21", "15.29", "11.98", "96.37", "96.82"),
    ("GBDT", "24.35", "11.05", "15.70", "96.53", "97.18"),
)


def _factories(trees: int) -> dict[str, Factory]:
    return {
        "formula (roofline)": FormulaPredictor,
        "scalar GBDT": lambda: GBDTPredictor(num_trees=trees),
        "learned graph (LightGBM)": lambda: GraphPredictor(num_trees=trees),
        "message passing (GNN)": GNNPredictor,
    }


def _fit_seconds(factories: dict[str, Factory], rows: list[Row]) -> dict[str, float]:
    """Wall seconds of one fit of each learned predictor on `rows`."""
    out = {}
    for name, factory in factories.items():
        fit = getattr(factory(), "fit", None)
        if callable(fit):
            t0 = time.perf_counter()
            fit(rows)
            out[name] = time.perf_counter() - t0
    return out


def _paper_table() -> Table:
    table = Table(title="The paper's Table 1 (§4.4; its own measured test set, not ours)")
    for col in ("predictor", "load WAPE", "runtime WAPE", "peak VRAM WAPE", "ordering acc.",
                "window fit"):  # fmt: skip
        table.add_column(col, justify="left" if col == "predictor" else "right")
    for row in PAPER_TABLE_1:
        table.add_row(row[0], *(f"{v}%" for v in row[1:]))
    return table


def _pct(entry: dict[str, Any], key: str) -> str:
    value = entry.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{100 * value:.1f}%"


def _table(title: str, report: dict[str, Any], targets: tuple[str, ...]) -> Table:
    table = Table(title=title)
    table.add_column("held out")
    table.add_column("predictor")
    for t in targets:
        table.add_column(f"{TARGET_LABELS[t]} WAPE", justify="right")
    table.add_column("ordering acc.", justify="right")
    table.add_column("window fit @median", justify="right")
    table.add_column("rows", justify="right")
    for kind in ALL_SPLIT_KINDS:
        for name, scores in report[kind].items():
            pooled = scores["pooled"]
            runtime = pooled["runtime_s"]
            table.add_row(
                kind,
                name,
                *(_pct(pooled[t], "wape") for t in targets),
                _pct(runtime, "ordering_accuracy"),
                _pct(runtime, "window_fit_median"),
                str(runtime["num_rows"]),
            )
        table.add_section()
    return table


def _fold_table(title: str, report: dict[str, Any]) -> Table:
    table = Table(title=title)
    table.add_column("held out")
    table.add_column("group")
    names = list(next(iter(report.values())).keys())
    for name in names:
        table.add_column(f"{name} runtime WAPE", justify="right")
    for kind in ALL_SPLIT_KINDS:
        groups = next(iter(report[kind].values()))["folds"]
        for group in groups:
            cells = [_pct(report[kind][n]["folds"][group]["runtime_s"], "wape") for n in names]
            table.add_row(kind, group, *cells)
        table.add_section()
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    parser.add_argument("--out", type=Path, default=Path("out/predictor_eval.json"))
    parser.add_argument("--rows-dir", type=Path, default=None, help="also write the rows as CSV")
    parser.add_argument("--full", action="store_true", help="larger sweeps")
    parser.add_argument("--trees", type=int, default=300, help="LightGBM rounds per target")
    args = parser.parse_args()
    try:
        run(args)
    except MaserveError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise SystemExit(1) from None


def run(args: argparse.Namespace) -> None:
    """Build the rows, score every predictor, print the tables and write `--out`.

    Raises:
        MaserveError: a missing profile folder or a malformed profile (one line).
    """
    console = Console(width=160)
    t0 = time.perf_counter()

    measured = measured_rows(args.profiles.resolve(), shape_grid(*MEASURED_SHAPES[args.full]))
    t_measured = time.perf_counter() - t0
    if not measured.rows:
        first = measured.notes[0] if measured.notes else "no profiles found"
        raise ConfigError(
            f"no measured rows under {args.profiles} ({len(measured.notes)} skipped; first: {first})"
        )
    sim = simulator_rows(
        SIM_MODELS[args.full], SIM_DEVICES[args.full], shape_grid(*SIM_SHAPES[args.full])
    )
    t_sim = time.perf_counter() - t0 - t_measured
    if args.rows_dir is not None:
        write_rows(measured.rows, args.rows_dir / "measured_rows.csv")
        write_rows(sim.rows, args.rows_dir / "simulator_rows.csv")

    factories = _factories(args.trees)
    measured_report = evaluate(factories, measured.rows, ALL_SPLIT_KINDS)
    sim_report = evaluate(factories, sim.rows, ALL_SPLIT_KINDS)
    t_eval = time.perf_counter() - t0 - t_measured - t_sim
    fit_s = _fit_seconds(factories, measured.rows + sim.rows)

    share = finite_share(measured.rows)
    fully = [r for r in measured.rows if r.modelled_share == 0.0]
    console.print(
        _table(
            "HEADLINE — measured rows (real operator profiles composed into request runtimes; "
            f"{len(measured.rows)} rows, {100 * share:.1f}% of runtime modelled)",
            measured_report,
            ("runtime_s",),
        )
    )
    console.print(_paper_table())
    console.print(_fold_table("Measured rows, runtime WAPE per held-out group", measured_report))
    console.print(
        _table(
            "Simulator rows (NOT a fidelity figure: targets are the simulator's own model; "
            f"{len(sim.rows)} rows)",
            sim_report,
            ("runtime_s", "peak_mem_bytes", "load_s"),
        )
    )
    console.print(
        f"measured sources: {sorted({(r.device, r.model) for r in measured.rows})}; "
        f"{len(fully)} rows fully measured (RTX PRO 6000). "
        f"Skipped: {len(measured.notes)} measured shapes, {len(sim.notes)} simulator combos."
    )
    uncatalogued = sorted({n for n in measured.notes if "not in the catalog" in n})
    uncatalogued += sorted({n for n in measured.notes if "unknown model" in n})
    for note in uncatalogued:
        console.print(f"[yellow]skipped:[/] {note}", highlight=False, soft_wrap=True)
    console.print(
        f"time: measured rows {t_measured:.1f}s, simulator rows {t_sim:.1f}s, "
        f"fits + scoring {t_eval:.1f}s; one fit on all {len(measured.rows) + len(sim.rows)} "
        "rows: " + ", ".join(f"{n} {v:.1f}s" for n, v in fit_s.items())
    )
    doc = {
        "written_by": "benchmarks/predictor_eval.py" + (" --full" if args.full else ""),
        "trees": args.trees,
        "measured": {
            "num_rows": len(measured.rows),
            "modelled_runtime_share": share,
            "num_fully_measured_rows": len(fully),
            "notes": measured.notes,
            "scores": measured_report,
        },
        "simulator": {
            "num_rows": len(sim.rows),
            "notes": sim.notes,
            "scores": sim_report,
        },
        "seconds": {"measured_rows": t_measured, "simulator_rows": t_sim, "evaluate": t_eval},
        "fit_seconds_all_rows": fit_s,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
