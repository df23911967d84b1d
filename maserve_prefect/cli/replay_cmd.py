"""`maserve replay SCENARIO`: run a fixed-work replay scenario and print one row per arm and block.

The one idea: the scenario file fixes everything but the arms (`replay.scenario`); the command
runs it (`replay.arms.run_scenario`: deadlines locked first, then one Prefect flow run per arm on
the managed or configured Prefect API, or none with `--no-prefect`), prints root-latency
percentiles, completed roots, early releases and deadline attainment per arm and block (non-causal
arms flagged), the median and range across blocks, the conformance audit of every arm run
(`replay.conformance`), and with `--out` writes one replay bundle per
arm and block plus `summary.json`.

Exit codes: 0 success; 1 bad input or a failed step (one red line); 2 an engine that is not
supported yet (`--engine openai:URL`).

Examples:
    maserve replay scenarios/fj_barrier.yaml --out out/fj_barrier
    maserve replay scenario.yaml --no-prefect
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from maserve_prefect.cli.run_cmd import fail, parse_engine
from maserve_prefect.errors import MaserveError
from maserve_prefect.replay.arms import ScenarioResult


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if pct else f"{v:.2f}"


def print_result(console: Console, res: ScenarioResult) -> None:
    """The per-arm table, the cross-block table and the locked deadlines."""
    sc = res.scenario
    if res.deadlines_s:
        locked = ", ".join(f"{k} {v:.2f} s" for k, v in sorted(res.deadlines_s.items()))
        console.print(f"deadlines (locked before the arms ran): {locked}")
    table = Table(title=f"scenario {sc.name}: {len(res.trace_set.slots)} roots per arm")
    for col in ("arm", "block", "rule", "measured", "p50 s", "p95 s", "p99 s", "attain", "early"):
        table.add_column(col, justify="left" if col in ("arm", "rule") else "right")
    for arm, results in res.by_arm().items():
        for r in results:
            s = r.summary
            rule = f"{s.rule} (non-causal)" if s.non_causal else s.rule
            table.add_row(
                arm, str(s.block), rule, f"{s.num_measured}/{s.num_roots}",
                _fmt(s.latency_p50_s), _fmt(s.latency_p95_s), _fmt(s.latency_p99_s),
                _fmt(s.attainment, pct=True), str(s.num_early_releases),
            )  # fmt: skip
    console.print(table)
    if sc.blocks > 1:
        across = Table(title=f"median (min-max) across {sc.blocks} paired blocks")
        for col in ("arm", "p50 s", "p95 s", "p99 s", "attain"):
            across.add_column(col, justify="left" if col == "arm" else "right")
        for arm, figs in res.across_blocks().items():
            cells = []
            for key in ("latency_p50_s", "latency_p95_s", "latency_p99_s", "attainment"):
                f = figs[key]
                pct = key == "attainment"
                cells.append(
                    "-" if f is None else f"{_fmt(f[0], pct)} ({_fmt(f[1], pct)}-{_fmt(f[2], pct)})"
                )
            across.add_row(arm, *cells)
        console.print(across)


def write_outputs(out: Path, res: ScenarioResult) -> None:
    """One replay bundle per arm and block (`<arm>-b<block>/`) and `summary.json`."""
    from maserve_prefect.trace.bundle import export_bundle

    out.mkdir(parents=True, exist_ok=True)
    for r in res.results:
        dest = out / f"{r.summary.arm}-b{r.summary.block}"
        export_bundle(r.run.trace, res.trace_set.store, dest, overwrite=True)
    summary = {
        "scenario": res.scenario.name,
        "deadlines_s": res.deadlines_s,
        "arms": [asdict(r.summary) | {"flow_run_id": r.flow_run_id} for r in res.results],
        "across_blocks": res.across_blocks(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def replay_cmd(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML file.")],
    engine: Annotated[str, typer.Option(help="'sim' or 'openai:URL'.")] = "sim",
    out: Annotated[
        Path | None, typer.Option(help="Write replay bundles and summary.json here.")
    ] = None,
    prefect: Annotated[
        bool, typer.Option("--prefect/--no-prefect", help="Record each arm as a Prefect flow run.")
    ] = True,
) -> None:
    """Run a replay scenario's arms and print per-arm root latency, attainment, early releases."""
    from maserve_prefect.replay.arms import run_scenario
    from maserve_prefect.replay.scenario import load_scenario

    console = Console(width=130)
    try:
        parse_engine(engine)
        sc = load_scenario(scenario).model_copy(update={"engine": engine})
        with ExitStack() as stack:
            if prefect:
                from maserve_prefect import prefect_server

                stack.enter_context(prefect_server.connected(prefect_server.ensure_server()))
            with console.status("replaying"):
                res = run_scenario(sc, prefect=prefect)
        print_result(console, res)
        from maserve_prefect.replay.conformance import audit, render

        native = res.trace_set.trace if res.trace_set.trace.manifest.source == "native" else None
        console.print(render([audit(r.run, native) for r in res.results]))
        if out is not None:
            write_outputs(out, res)
            console.print(f"wrote {out}")
    except MaserveError as exc:
        fail(str(exc))
