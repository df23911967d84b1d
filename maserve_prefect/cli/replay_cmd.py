"""`maserve replay SCENARIO`: run a fixed-work replay scenario and report it per arm and block.

The one idea: the scenario file fixes everything but the arms (`replay.scenario`); the command
runs it (`replay.arms.run_scenario`: deadlines locked first, then one Prefect flow run per arm)
and reports each arm run from its replay trace and step records
(`replay.report.report_scenario`): root-latency percentiles, measured roots, early
releases and deadline attainment per arm and block (non-causal arms flagged), the median and
range across blocks, the task-level metric tables (completion-path shares, stage time,
attempts, SLO attainment, goodput and goodput per accelerator) and, on the simulator, the
engine tables (KV memory-time, arithmetic intensity, decode batch, prefill factor, co-batching,
preemptions by class), then the conformance audit of every arm run (`replay.conformance`).

The engine is `--engine` when given, else the scenario file's `engine:` field (`sim` when the
file has none): `sim` replays on the simulator in virtual time, `openai:URL[#MODEL]` on an
OpenAI-compatible server in wall time. `--mooncake FILE` replaces the scenario file with "replay
this Mooncake JSONL on its timestamps" (`replay.scenario.mooncake_scenario`, the shipped
`deployments/suites/scenarios/mooncake_replay.yaml` with that file). On a real server the
capability probes run once, before the first drain; the `request latency` table gives TTFT,
TPOT / ITL and e2e percentiles per arm run as the client saw them, beside the server's own
histograms over the run and the client's TTFT overhead, and a line per arm run says it.

With Prefect (the default; `--no-prefect` runs bare) the whole replay is one `maserve-replay`
flow run on the managed or configured Prefect API, each arm run a nested `maserve-replay-arm`
flow run; a progress artifact (`maserve-replay-<scenario>-progress`) advances after each arm
run and every table is published as a table artifact plus one markdown report
(`maserve-replay-<scenario>-*`). `--out DIR` writes one replay bundle per arm and block
(`<arm>-b<block>/`) and `summary.json` (summaries, across-block figures and every table);
`--plots DIR` writes the PNG plots (root-latency CDF per arm, completion-path bars, KV
occupancy over time, the Gantt of one root).

The engine's credentials never reach a file or a message: URL user info is shown as `***`, and
an API key is read from the environment variable `--api-key-env NAME` (or the engine's
`?api_key_env=NAME`) names (see `engines.target`).

Exit codes: 0 success; 1 bad input or a failed step (one red line); 4 an arm run failed its
audit's work checks — an op failed or never completed, the work changed, or a causal arm released
early (the tables and `--out` files are written first; `--allow-failures` exits 0 instead).

Examples:
    maserve replay scenarios/fj_barrier.yaml --out out/fj_barrier --plots out/fj_barrier/plots
    maserve replay scenario.yaml --no-prefect --engine openai:http://127.0.0.1:8000
    maserve replay scenario.yaml --engine openai:https://gpu.example:8000 --api-key-env VLLM_KEY
    maserve replay --mooncake requests.jsonl --engine openai:http://127.0.0.1:8000 --no-prefect
"""

from __future__ import annotations

import itertools
import json
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from maserve_prefect.cli.checks import EXIT_FAILED_WORK, check_out_dir
from maserve_prefect.cli.run_cmd import ApiKeyEnv, fail
from maserve_prefect.engines.target import parse_single_engine
from maserve_prefect.errors import ConfigError, MaserveError
from maserve_prefect.replay.arms import ScenarioResult
from maserve_prefect.replay.conformance import failure_reason
from maserve_prefect.replay.report import ScenarioReport
from maserve_prefect.replay.scenario import Scenario


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
    cols = ("arm", "block", "rule", "measured", "done/failed/incompl.", "p50 s", "p95 s",
            "p99 s", "attain", "early")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col in ("arm", "rule") else "right")
    states: dict[str, str] = {}
    for arm, results in res.by_arm().items():
        for r in results:
            s = r.summary
            rule = f"{s.rule} (non-causal)" if s.non_causal else s.rule
            table.add_row(
                arm, str(s.block), rule, f"{s.num_measured}/{s.num_roots}",
                f"{s.num_completed}/{s.num_failed_roots}/{s.num_incomplete_roots}",
                _fmt(s.latency_p50_s), _fmt(s.latency_p95_s), _fmt(s.latency_p99_s),
                _fmt(s.attainment, pct=True), str(s.num_early_releases),
            )  # fmt: skip
            states[f"{arm} block {s.block}"] = s.initial_state
    console.print(table)
    if len(set(states.values())) == 1:
        console.print(f"every arm started from: {next(iter(states.values()))}")
    else:
        for where, state in states.items():
            console.print(f"{where} started from: {state}")
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


def write_outputs(out: Path, rep: ScenarioReport) -> None:
    """One replay bundle per arm and block (`<arm>-b<block>/`) and `summary.json`."""
    from maserve_prefect.trace.bundle import export_bundle

    res = rep.result
    out.mkdir(parents=True, exist_ok=True)
    for r in res.results:
        dest = out / f"{r.summary.arm}-b{r.summary.block}"
        export_bundle(r.run.trace, res.trace_set.store, dest, overwrite=True)
    summary = {
        "scenario": res.scenario.name,
        "engine": res.scenario.engine,
        "deadlines_s": res.deadlines_s,
        "arms": [asdict(r.summary) | {"flow_run_id": r.flow_run_id} for r in res.results],
        "across_blocks": res.across_blocks(),
        "conformance": rep.conformance_rows(),
        "tables": rep.metric_tables,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def print_metrics(console: Console, rep: ScenarioReport) -> None:
    """Every metric table (`replay.report.metric_tables`), one per metric."""
    from maserve_prefect.metrics.report import render_table

    for name, rows in rep.metric_tables.items():
        if rows:
            console.print(render_table(name, rows))
        else:
            console.print(f"{name}: none in any arm run")


def print_overhead(console: Console, rep: ScenarioReport) -> None:
    """Per arm run on a server with latency histograms: the client's and the server's TTFT
    means, the requests each side counted, and the client's overhead (their difference)."""
    for m in rep.metrics:
        client = m.requests.get("ttft")
        srv = m.server.row() if m.server is not None else None
        if client is None or srv is None or srv["ttft_mean_ms"] is None:
            continue
        console.print(
            f"{m.arm} b{m.block}: TTFT mean {client.mean_ms:.1f} ms at the client "
            f"({client.n} requests), {srv['ttft_mean_ms']:.1f} ms at the server "
            f"(vllm:time_to_first_token_seconds, {srv['requests']:g} requests in the run): "
            f"client overhead {client.mean_ms - srv['ttft_mean_ms']:.1f} ms"
        )


# -- running, with or without a `maserve-replay` Prefect flow run ------------------------------


def _replay_flow(work: Callable[[], ScenarioReport]) -> Any:
    from prefect import flow

    @flow(name="maserve-replay", persist_result=False, log_prints=False, validate_parameters=False)
    def maserve_replay(scenario: str) -> dict[str, Any]:
        """Replay a scenario: every arm run as a nested flow run, then the report artifacts."""
        return {"scenario": scenario, "arm_runs": len(work().result.results)}

    return maserve_replay


def run_replay(sc: Scenario, *, prefect: bool) -> ScenarioReport:
    """Run the scenario and build its report; with `prefect`, inside one `maserve-replay` flow
    run that keeps a progress artifact and publishes every table and plot (needs a Prefect
    API)."""
    from maserve_prefect.metrics.report import Progress, publish_plots
    from maserve_prefect.replay.arms import ArmResult, run_scenario
    from maserve_prefect.replay.report import publish_replay, report_scenario, write_plots

    if not prefect:
        return report_scenario(run_scenario(sc, prefect=False))
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    box: list[ScenarioReport] = []

    def work() -> ScenarioReport:
        total = sc.blocks * len(sc.arms)
        bar = Progress(f"replay {sc.name}", key=f"maserve-replay-{sc.name}-progress")
        done = itertools.count(1)

        def on_arm(_: ArmResult) -> None:
            bar.update(100.0 * next(done) / total)

        rep = report_scenario(run_scenario(sc, prefect=True, on_arm=on_arm))
        publish_replay(rep)
        with tempfile.TemporaryDirectory(prefix="maserve-plots-") as tmp:  # the plots, in the UI
            publish_plots(write_plots(rep.result, rep.metrics, Path(tmp)),
                          prefix=f"maserve-replay-{sc.name}")  # fmt: skip
        box.append(rep)
        return rep

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        _replay_flow(work).with_options(flow_run_name=sc.name)(sc.name)
    return box[0]


def replay_cmd(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario YAML file (or give --mooncake).")
    ] = None,
    mooncake: Annotated[
        Path | None,
        typer.Option(
            help="Replay this Mooncake JSONL on its timestamps instead of a scenario file "
            "(`replay.scenario.mooncake_scenario`; needs --engine for a real server)."
        ),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="'sim' or 'openai:URL[#MODEL]'; default: the scenario's `engine:`."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write replay bundles and summary.json here.")
    ] = None,
    plots: Annotated[
        Path | None, typer.Option(help="Write the PNG plots (CDF, path bars, KV, Gantt) here.")
    ] = None,
    prefect: Annotated[
        bool, typer.Option("--prefect/--no-prefect", help="Record the replay as Prefect flow runs.")
    ] = True,
    timeout: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Wall-clock limit of one arm run on a real engine, seconds (default: the "
            "scenario's `timeout_s`); unfinished roots are reported as incomplete.",
        ),
    ] = None,
    api_key_env: ApiKeyEnv = None,
    allow_failures: Annotated[
        bool,
        typer.Option("--allow-failures", help="Exit 0 even when an arm run failed its audit."),
    ] = False,
) -> None:
    """Run a replay scenario's arms and print per-arm latency, metrics and the audit."""
    from maserve_prefect.replay.conformance import render
    from maserve_prefect.replay.scenario import load_scenario, mooncake_scenario

    console = Console(width=130)
    try:
        if engine is not None:
            parse_single_engine(engine, "maserve replay")
        for path, what in ((out, "--out"), (plots, "--plots")):
            if path is not None:
                check_out_dir(path, what)
        if (scenario is None) == (mooncake is None):
            raise ConfigError(
                "give a scenario file or --mooncake FILE (one of them), e.g. maserve replay "
                "--mooncake requests.jsonl --engine openai:http://127.0.0.1:8000"
            )
        if scenario is not None:
            sc = load_scenario(scenario)
        else:
            assert mooncake is not None
            sc = mooncake_scenario(mooncake)
        if engine is not None:
            sc = sc.model_copy(update={"engine": engine})
        if timeout is not None:
            sc = sc.model_copy(update={"timeout_s": timeout})
        # The file's engine fails here too, before any work; only its redacted form goes on.
        target = parse_single_engine(sc.engine, "maserve replay").with_api_key_env(api_key_env)
        if not target.is_sim:
            target.client_auth()  # an unset API key variable fails before any work
        sc = sc.model_copy(update={"engine": str(target)})
        with ExitStack() as stack:
            if prefect:
                from maserve_prefect import prefect_server

                server = prefect_server.ensure_server(  # an implicit start is announced
                    announce=lambda line: console.print(line, highlight=False, soft_wrap=True)
                )
                stack.enter_context(prefect_server.connected(server))
            if target.is_sim:
                with console.status(f"replaying {sc.name} on {sc.engine}"):
                    rep = run_replay(sc, prefect=prefect)
            else:
                # No spinner on the wall clock: its refresh thread would take the interpreter
                # lock from the replay's loop, and a send or a first token would wait for it.
                console.print(f"replaying {sc.name} on {sc.engine} (wall clock)")
                rep = run_replay(sc, prefect=prefect)
        print_result(console, rep.result)
        print_metrics(console, rep)
        print_overhead(console, rep)
        console.print(render(rep.conformance))
        if out is not None:
            write_outputs(out, rep)
            console.print(f"wrote {out}")
        if plots is not None:
            from maserve_prefect.replay.report import write_plots

            written = write_plots(rep.result, rep.metrics, plots)
            console.print(f"wrote {', '.join(str(p) for p in written)}")
    except MaserveError as exc:
        fail(str(exc))
    bad = [(r.summary, c) for r, c in zip(rep.result.results, rep.conformance, strict=True)
           if not c.work_ok]  # fmt: skip
    if bad and not allow_failures:
        s, c = bad[0]
        fail(
            f"{len(bad)} of {len(rep.conformance)} arm runs failed the audit (first: arm "
            f"{s.arm} block {s.block}: {failure_reason(c)}); see the conformance table; "
            "pass --allow-failures to exit 0",
            code=EXIT_FAILED_WORK,
        )
