"""`maserve trace ...` commands: import a Mooncake trace into a bundle, print a bundle's stats,
export a run (or as AIPerf inputs), import AIPerf's per-request records into the ledger.

The one idea: commands are thin — parse options, call the library (`trace.mooncake`,
`trace.bundle`, `metrics.graph`), render with rich. Every `MaserveError` becomes a one-line red
message on stderr and exit code 1, never a traceback.

`import-mooncake` writes its bundle to `--out`, by default `$MASERVE_HOME/traces/<file stem>`
(`MASERVE_HOME` defaults to `~/.maserve`, see `maserve_prefect.settings`), so imported traces sit
beside the ledger and CAS of the same installation.

`export --aiperf DIR` and `import-aiperf` are thin over `interop.aiperf_export` and
`interop.aiperf_import` (their docstrings say what maps and what does not).

Examples:
    maserve trace import-mooncake ../shared/data/traces/mooncake_synthetic_trace.jsonl --out out/mc
    maserve trace stats out/mc
    maserve trace export --bundle out/mc --aiperf out/mc-aiperf
    maserve trace import-aiperf artifacts/run1/profile_export.jsonl --schedule out/mc-aiperf --slo 2
    maserve trace export --run TRACE_ID --otel out/trace.otlp.json   # OpenTelemetry GenAI spans
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from maserve_prefect.cli.checks import check_bundle_dir, check_out_dir
from maserve_prefect.errors import ConfigError, MaserveError
from maserve_prefect.trace.model import Trace

if TYPE_CHECKING:
    from maserve_prefect.interop.aiperf_import import AiperfImport
    from maserve_prefect.metrics.graph import GraphStats
    from maserve_prefect.metrics.path import RootPath
    from maserve_prefect.metrics.slo import ClassAttainment
    from maserve_prefect.metrics.task import RootLatency
    from maserve_prefect.trace.ledger import Ledger
    from maserve_prefect.trace.mooncake import RejectedRow

app = typer.Typer(no_args_is_help=True)

# Traces with at most this many roots get a per-root table in `stats`; larger ones a summary.
PER_ROOT_TABLE_MAX = 20
# How many line numbers to show per rejection reason.
SHOWN_LINES = 5


def _fail(message: str) -> NoReturn:
    from maserve_prefect.cli.run_cmd import fail

    fail(message)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}"


def _totals_table(trace: Trace) -> Table:
    kinds = Counter(str(op.kind) for op in trace.op_index().values())
    table = Table(title="Totals", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("roots", str(len(trace.roots)))
    table.add_row("ops", str(sum(kinds.values())))
    for kind, count in sorted(kinds.items()):
        table.add_row(f"  {kind} ops", str(count))
    table.add_row("input tokens", str(sum(op.num_input_tokens for op in trace.ops)))
    table.add_row("output tokens", str(sum(op.num_output_tokens for op in trace.ops)))
    if trace.roots:
        arrivals = [r.arrival_s for r in trace.roots]
        table.add_row("arrival span (s)", f"{min(arrivals):.3f} – {max(arrivals):.3f}")
    return table


@app.command("import-mooncake")
def import_mooncake_cmd(
    file: Annotated[Path, typer.Argument(help="Mooncake (FAST'25) JSONL request trace.")],
    out: Annotated[
        Path | None,
        typer.Option(help="Bundle directory [default: $MASERVE_HOME/traces/<file stem>]."),
    ] = None,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Fail at the first bad row or warning (zero length, out-of-order timestamp, "
            "duplicate row) instead of skipping / noting it.",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            help="Catalog model whose context window bounds prompt + output (default: no "
            "model's window is larger than 16,777,216 tokens)."
        ),
    ] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per hash_ids block.")] = 512,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing bundle at the destination.")
    ] = False,
) -> None:
    """Import a Mooncake JSONL trace as a bundle of single-call roots."""
    from maserve_prefect.engines.catalog.models import get_model
    from maserve_prefect.settings import get_settings, private_dir
    from maserve_prefect.trace.bundle import export_bundle
    from maserve_prefect.trace.cas import MemoryStore
    from maserve_prefect.trace.mooncake import MAX_CONTEXT_TOKENS, import_mooncake

    try:
        if block_size < 1:
            raise ConfigError(f"--block-size {block_size}: give a positive number of tokens")
        max_context = (
            get_model(model).max_position_embeddings if model is not None else MAX_CONTEXT_TOKENS
        )
        dest = out if out is not None else get_settings().home / "traces" / file.stem
        check_out_dir(dest, "--out")
        result = import_mooncake(
            file, strict=strict, block_size=block_size, max_context_tokens=max_context
        )
        if out is None:
            private_dir(get_settings().home)
        written = export_bundle(result.trace, MemoryStore(), dest, overwrite=force)
    except MaserveError as exc:
        _fail(str(exc))
    console = Console()
    console.print(f"imported {file}", highlight=False, soft_wrap=True)
    summary = Table(title="Rows", show_header=False)
    summary.add_column("quantity")
    summary.add_column("value", justify="right")
    summary.add_row("rows read", str(result.num_rows))
    summary.add_row("rows accepted", str(result.num_accepted))
    summary.add_row("rows rejected", str(len(result.rejected)))
    summary.add_row("warnings", str(len(result.warnings)))
    console.print(summary)
    if result.rejected:
        console.print(_rows_table("Rejected rows", result.rejected))
    if result.warnings:
        console.print(_rows_table("Warnings (rows imported; --strict refuses them)",
                                  result.warnings))  # fmt: skip
    console.print(_totals_table(result.trace))
    console.print(f"bundle written to {written}", highlight=False, soft_wrap=True)


def _rows_table(title: str, rows: list[RejectedRow]) -> Table:
    """Rows grouped by reason: count, first line numbers and one example."""
    table = Table(title=title)
    table.add_column("reason")
    table.add_column("rows", justify="right")
    table.add_column("first lines")
    table.add_column("example")
    lines_by: dict[str, list[int]] = {}
    details: dict[str, str] = {}
    for row in rows:
        lines_by.setdefault(row.reason, []).append(row.line)
        details.setdefault(row.reason, row.detail)
    for reason, lines in lines_by.items():
        shown = ", ".join(map(str, lines[:SHOWN_LINES])) + (
            " …" if len(lines) > SHOWN_LINES else ""
        )
        table.add_row(reason, str(len(lines)), shown, details[reason])
    return table


def _per_root_table(stats: tuple[GraphStats, ...]) -> Table:
    table = Table(title="LLM-call graph per root")
    for name in ("root", "ops", "calls", "depth", "level widths", "antichain", "peak in-flight"):
        table.add_column(name, justify="left" if name == "root" else "right")
    for s in stats:
        table.add_row(
            s.root_id,
            str(s.num_ops),
            str(s.num_calls),
            str(s.depth),
            " ".join(map(str, s.level_widths)),
            str(s.antichain_width),
            "-" if s.peak_in_flight is None else str(s.peak_in_flight),
        )
    return table


@app.command("stats")
def stats_cmd(
    bundle: Annotated[Path, typer.Argument(help="Trace bundle directory.")],
    per_root: Annotated[
        bool | None,
        typer.Option(
            "--per-root/--summary",
            help=f"Per-root table or distribution summary [default: per-root up to "
            f"{PER_ROOT_TABLE_MAX} roots].",
        ),
    ] = None,
) -> None:
    """Print a bundle's totals and LLM-call graph metrics."""
    from maserve_prefect.metrics.graph import trace_graph_summary
    from maserve_prefect.trace.bundle import import_bundle

    try:
        if bundle.name != "trace.jsonl":
            check_bundle_dir(bundle)
        trace = import_bundle(bundle).trace
        summary = trace_graph_summary(trace)
    except MaserveError as exc:
        _fail(str(exc))
    console = Console()
    console.print(
        f"trace {trace.manifest.trace_id} (source {trace.manifest.source})", highlight=False
    )
    console.print(_totals_table(trace))
    if per_root if per_root is not None else summary.num_roots <= PER_ROOT_TABLE_MAX:
        console.print(_per_root_table(summary.per_root))
        return
    table = Table(title=f"LLM-call graph over {summary.num_roots} roots")
    for name in ("metric", "mean", "p50", "max"):
        table.add_column(name, justify="left" if name == "metric" else "right")
    rows = [
        ("calls", summary.num_calls),
        ("depth", summary.depth),
        ("antichain width", summary.antichain_width),
        ("peak in-flight", summary.peak_in_flight),
    ]
    for name, dist in rows:
        if dist is None:
            table.add_row(name, "-", "-", "-")
        else:
            table.add_row(name, f"{dist.mean:.2f}", _fmt(dist.p50), _fmt(dist.max))
    console.print(table)


@app.command("export")
def export_cmd(
    flow_run: Annotated[
        str | None, typer.Option("--flow-run", help="Prefect flow-run id (one root's run).")
    ] = None,
    run: Annotated[
        str | None, typer.Option("--run", help="Ledger trace id (every flow run of the run).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Bundle directory (default: $MASERVE_HOME/traces/<trace id>-prefect)."),
    ] = None,
    ledger_url: Annotated[
        str | None, typer.Option("--ledger", help="Ledger database URL (default: configured).")
    ] = None,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for Prefect to record every task run.")
    ] = 30.0,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing bundle at the destination.")
    ] = False,
    ledger_only: Annotated[
        bool,
        typer.Option(
            "--ledger-only",
            help="With --run: write the ledger's record alone, without Prefect (the default "
            "for a cancelled or crashed run).",
        ),
    ] = False,
    aiperf: Annotated[
        Path | None,
        typer.Option(
            "--aiperf",
            help="Write the trace as AIPerf inputs (mooncake_trace JSONL, sessions, map, "
            "README.txt with the aiperf command) into this folder instead of a bundle; reads "
            "the ledger (or --bundle), not Prefect.",
        ),
    ] = None,
    otel: Annotated[
        Path | None,
        typer.Option(
            "--otel",
            help="Write OpenTelemetry GenAI spans as an OTLP/JSON file (one trace per root) "
            "instead of a bundle; from --run (the ledger's record) or --bundle.",
        ),
    ] = None,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            help="Send OpenTelemetry GenAI spans over OTLP/HTTP to this URL (a collector's "
            "http://HOST:4318; /v1/traces is added to a bare URL).",
        ),
    ] = None,
    bundle: Annotated[
        Path | None,
        typer.Option(
            "--bundle",
            help="With --aiperf / --otel / --otlp-endpoint: read the trace from this bundle.",
        ),
    ] = None,
    epoch: Annotated[
        str | None,
        typer.Option(
            help="With --otel / --otlp-endpoint: the Unix time the trace's t = 0 is placed at: "
            "Unix seconds, an ISO 8601 time or 'now' [default: the run's created_at from the "
            "ledger, else 1970-01-01T00:00:00Z].",
        ),
    ] = None,
    otlp_timeout: Annotated[
        float, typer.Option(help="Seconds the OTLP endpoint has to take each request.")
    ] = 10.0,
) -> None:
    """Assemble a trace from Prefect's run history plus the ledger; check they agree; write it.

    A run that was cancelled or crashed is exported from the ledger alone: its finished ops,
    the manifest noting it is partial (Prefect never finished those flow runs). With
    `--aiperf DIR` the trace is written as AIPerf inputs instead (see `interop.aiperf_export`).

    With --otel FILE and / or --otlp-endpoint URL the trace (the ledger's record of --run, with
    its Prefect run ids, or a --bundle) is exported as OpenTelemetry GenAI spans instead."""
    if otel is not None or otlp_endpoint is not None:
        if aiperf is not None:
            _fail("--aiperf and --otel / --otlp-endpoint are separate exports: give one")
        _export_otel(
            run=run, bundle=bundle, flow_run=flow_run, out=out, ledger_url=ledger_url,
            otel=otel, otlp_endpoint=otlp_endpoint, epoch=epoch, timeout_s=otlp_timeout,
            force=force,
        )  # fmt: skip
        return
    if epoch is not None:
        _fail("--epoch goes with --otel FILE or --otlp-endpoint URL")
    if aiperf is not None or bundle is not None:
        if out is not None:
            _fail(
                "--out names a bundle folder; with --aiperf the folder is --aiperf's, so drop --out"
            )
        _export_aiperf(aiperf, bundle, run, flow_run, ledger_url, force)
        return
    from maserve_prefect import prefect_server
    from maserve_prefect.cli.run_cmd import open_ledger
    from maserve_prefect.settings import get_settings, private_dir
    from maserve_prefect.trace.bundle import export_bundle
    from maserve_prefect.trace.prefect_export import export_from_prefect, wait_for_prefect
    from maserve_prefect.trace.runs import RunStatus

    console = Console()
    try:
        if (flow_run is None) == (run is None):
            raise ConfigError("give exactly one of --flow-run ID or --run TRACE_ID")
        if out is not None:
            check_out_dir(out, "--out")
        if run is not None:
            with open_ledger(ledger_url) as ledger:
                status = {r.trace_id: r.status for r in ledger.list_runs()}.get(run)
                if ledger_only or status in (RunStatus.CANCELLED, RunStatus.CRASHED):
                    _export_ledger_only(console, ledger, run, out, force)
                    return
        elif ledger_only:
            raise ConfigError("--ledger-only exports a whole run: give --run TRACE_ID")
        server = prefect_server.ensure_server()
        with open_ledger(ledger_url) as ledger, prefect_server.connected(server):
            trace_ids = [run] if run is not None else ledger.runs_of_flow_run(str(flow_run))
            with console.status("waiting for Prefect to record the run…"):
                for tid in trace_ids:
                    wait_for_prefect(ledger, tid, timeout_s=wait)
            result = export_from_prefect(ledger, flow_run_id=flow_run, trace_id=run)
            result.check()
            tid = result.trace.manifest.trace_id
            suffix = f"-{str(flow_run)[:8]}" if flow_run is not None else ""
            if out is None:
                private_dir(get_settings().home)
            dest = out or get_settings().home / "traces" / f"{tid}{suffix}-prefect"
            check_out_dir(dest, "--out")
            written = export_bundle(result.trace, ledger.cas, dest, overwrite=force)
    except MaserveError as exc:
        _fail(str(exc))
    agreement = result.agreement
    console.print(
        f"trace {tid}: {agreement.num_task_runs} Prefect task runs in "
        f"{len(result.flow_run_ids)} flow run(s) = {agreement.num_ops} ledger ops; "
        f"{agreement.num_edges} data/control edges agree",
        highlight=False,
    )
    if result.num_dropped_deps:
        console.print(
            f"{result.num_dropped_deps} dependencies on ops outside this flow run left out",
            highlight=False,
        )
    console.print(_totals_table(result.trace))
    console.print(f"bundle written to {written}", highlight=False, soft_wrap=True)


def _export_ledger_only(
    console: Console, ledger: Ledger, trace_id: str, out: Path | None, force: bool
) -> None:
    """Write the ledger's record of `trace_id` (whatever its status) as a bundle."""
    from maserve_prefect.settings import get_settings
    from maserve_prefect.trace.bundle import export_bundle
    from maserve_prefect.trace.model import OpStatus

    trace = ledger.load_trace(trace_id)
    status = {r.trace_id: r.status for r in ledger.list_runs()}[trace_id]
    dest = out or get_settings().home / "traces" / f"{trace_id}-ledger"
    written = export_bundle(trace, ledger.cas, dest, overwrite=force)
    done = sum(1 for op in trace.ops if op.status is OpStatus.COMPLETED)
    console.print(
        f"trace {trace_id} ({status.value}) from the ledger alone: {done} completed op(s), "
        f"{len(trace.ops) - done} failed/skipped/incomplete",
        highlight=False,
    )
    console.print(_totals_table(trace))
    console.print(f"bundle written to {written}", highlight=False, soft_wrap=True)


def _export_otel(
    *,
    run: str | None,
    bundle: Path | None,
    flow_run: str | None,
    out: Path | None,
    ledger_url: str | None,
    otel: Path | None,
    otlp_endpoint: str | None,
    epoch: str | None,
    timeout_s: float,
    force: bool,
) -> None:
    """`trace export --otel / --otlp-endpoint`: the trace as OpenTelemetry GenAI spans."""
    import time

    from maserve_prefect.cli.run_cmd import open_ledger
    from maserve_prefect.interop.otel_export import (
        build_spans,
        otlp_traces_url,
        send_otlp,
        write_otlp_json,
    )
    from maserve_prefect.interop.otel_plan import resolve_epoch_ns
    from maserve_prefect.trace.bundle import import_bundle
    from maserve_prefect.trace.runs import PrefectLink

    console = Console()
    try:
        if flow_run is not None:
            raise ConfigError("--otel / --otlp-endpoint export a whole run: give --run TRACE_ID")
        if (run is None) == (bundle is None):
            raise ConfigError("give exactly one of --run TRACE_ID or --bundle DIR to export")
        if out is not None:
            raise ConfigError(
                "--out names a bundle folder; with --otel / --otlp-endpoint no bundle is written"
            )
        url = otlp_traces_url(otlp_endpoint) if otlp_endpoint is not None else None
        links: list[PrefectLink] = []
        if bundle is not None:
            check_bundle_dir(bundle, "--bundle")
            trace = import_bundle(bundle).trace
        else:
            with open_ledger(ledger_url) as ledger:
                trace = ledger.load_trace(str(run))
                links = ledger.prefect_links(str(run))
        epoch_ns = resolve_epoch_ns(epoch, trace.manifest.created_at, time.time_ns())
        tid = trace.manifest.trace_id
        num_roots = len({op.root_id for op in trace.ops} | {r.root_id for r in trace.roots})
        if otel is not None:
            num = write_otlp_json(trace, otel, epoch_ns=epoch_ns, prefect_links=links,
                                  overwrite=force)  # fmt: skip
            console.print(
                f"trace {tid}: {num} spans in {num_roots} OTel trace(s) written to {otel} "
                "(OTLP/JSON)",
                highlight=False,
                soft_wrap=True,
            )
        if url is not None:
            spans = build_spans(trace, epoch_ns=epoch_ns, prefect_links=links)
            requests = send_otlp(spans, url, timeout_s=timeout_s)
            console.print(
                f"trace {tid}: {len(spans)} spans in {num_roots} OTel trace(s) sent to {url} "
                f"({requests} OTLP/HTTP request(s))",
                highlight=False,
                soft_wrap=True,
            )
    except MaserveError as exc:
        _fail(str(exc))


def _export_aiperf(
    folder: Path | None,
    bundle: Path | None,
    run: str | None,
    flow_run: str | None,
    ledger_url: str | None,
    force: bool,
) -> None:
    """`trace export --aiperf DIR`: one trace (bundle, ledger run or flow run) as AIPerf inputs."""
    from maserve_prefect.cli.run_cmd import open_ledger
    from maserve_prefect.interop.aiperf_export import (
        REQUESTS_FILE,
        plan_aiperf_export,
        write_aiperf_export,
    )
    from maserve_prefect.trace.bundle import import_bundle

    try:
        if folder is None:
            raise ConfigError("--bundle is read only with --aiperf DIR; give --aiperf too")
        if sum(x is not None for x in (bundle, run, flow_run)) != 1:
            raise ConfigError("give exactly one of --bundle PATH, --run TRACE_ID or --flow-run ID")
        check_out_dir(folder, "--aiperf")
        if bundle is not None:
            if bundle.name != "trace.jsonl":
                check_bundle_dir(bundle)
            trace = import_bundle(bundle).trace
        else:
            with open_ledger(ledger_url) as ledger:
                tids = [run] if run is not None else ledger.runs_of_flow_run(str(flow_run))
                if len(tids) != 1:
                    raise ConfigError(
                        f"flow run {flow_run} recorded {len(tids)} runs "
                        f"({', '.join(tids) or 'none'}); export one with --run TRACE_ID"
                    )
                trace = ledger.load_trace(str(tids[0]))
        plan = plan_aiperf_export(trace)
        if not plan.requests:
            raise ConfigError(
                f"trace {trace.manifest.trace_id}: no submitted model op to send "
                f"({plan.num_not_model} non-model ops, {plan.num_unsent} never submitted)"
            )
        written = write_aiperf_export(plan, folder, overwrite=force)
    except MaserveError as exc:
        _fail(str(exc))
    console = Console()
    console.print(
        f"trace {plan.trace_id}: {len(plan.requests)} requests "
        f"({plan.num_multi_call_roots} multi-call roots as sessions); left out "
        f"{plan.num_not_model} non-model ops, {plan.num_unsent} never submitted",
        highlight=False,
    )
    console.print(f"AIPerf inputs written to {written}", highlight=False, soft_wrap=True)
    console.print(
        f"run: aiperf profile --model MODEL --tokenizer TOKENIZER --url URL --endpoint-type chat "
        f"--streaming --input-file {written / REQUESTS_FILE} --custom-dataset-type "
        "mooncake_trace --fixed-schedule   (see README.txt there)",
        highlight=False,
        soft_wrap=True,
    )


def _parse_slo(values: list[str]) -> tuple[dict[str, float], float | None]:
    """`--slo SECONDS` (every class) and `--slo CLASS=SECONDS` into (deadlines, default)."""
    deadlines: dict[str, float] = {}
    default: float | None = None
    for raw in values:
        name, sep, value = raw.rpartition("=")
        try:
            seconds = float(value)
        except ValueError:
            raise ConfigError(
                f"--slo {raw!r}: give SECONDS or CLASS=SECONDS (a number of seconds)"
            ) from None
        if not seconds > 0:
            raise ConfigError(f"--slo {raw!r}: a deadline must be > 0 s")
        if sep:
            deadlines[name] = seconds
        else:
            default = seconds
    return deadlines, default


@app.command("import-aiperf")
def import_aiperf_cmd(
    profile_export: Annotated[
        Path, typer.Argument(help="AIPerf's per-request records (profile_export.jsonl).")
    ],
    schedule: Annotated[
        Path | None,
        typer.Option(
            help="Folder written by `maserve trace export --aiperf` for this run's input: maps "
            "each request back to its op, root, class and dependencies."
        ),
    ] = None,
    trace_id: Annotated[
        str | None,
        typer.Option(
            "--trace-id", help="Ledger id of the new run [default: aiperf-<folder>-<sha>]."
        ),
    ] = None,
    slo: Annotated[
        list[str] | None,
        typer.Option(
            "--slo",
            help="Root-latency deadline: SECONDS for every class, or CLASS=SECONDS (repeat).",
        ),
    ] = None,
    ledger_url: Annotated[
        str | None, typer.Option("--ledger", help="Ledger database URL (default: configured).")
    ] = None,
) -> None:
    """Import AIPerf's per-request records into the ledger as a run; print task-level metrics.

    The whole file is checked first: a bad record is one error naming its line, and nothing is
    written. The run is then recorded in one transaction."""
    from maserve_prefect.cli.run_cmd import open_ledger, unique_trace_id
    from maserve_prefect.interop.aiperf_import import import_aiperf
    from maserve_prefect.metrics.path import path_ledger, path_shares
    from maserve_prefect.metrics.slo import attainment
    from maserve_prefect.metrics.task import root_latencies

    try:
        deadlines, default_s = _parse_slo(slo or [])
        result = import_aiperf(profile_export, schedule=schedule, trace_id=trace_id)
        trace = result.trace
        lats = root_latencies(trace)
        paths = path_ledger(trace)
        slo_table = (
            attainment(lats, deadlines, default_s=default_s) if deadlines or default_s else {}
        )
        with open_ledger(ledger_url) as ledger:
            tid = trace.manifest.trace_id
            if trace_id is None:
                tid = unique_trace_id(ledger, tid)
                manifest = trace.manifest.model_copy(update={"trace_id": tid})
                trace = trace.model_copy(update={"manifest": manifest})
            ledger.record_trace(trace)
    except MaserveError as exc:
        _fail(str(exc))
    _print_aiperf_import(result, tid, lats, paths, path_shares(paths), slo_table)


def _print_aiperf_import(
    result: AiperfImport,
    tid: str,
    lats: list[RootLatency],
    paths: list[RootPath],
    shares: dict[str, float],
    slo_table: dict[str, ClassAttainment],
) -> None:
    import numpy as np

    from maserve_prefect.metrics.report import render_table, slo_rows

    console = Console()
    rows = Table(title="AIPerf records", show_header=False)
    rows.add_column("quantity")
    rows.add_column("value", justify="right")
    rows.add_row("records read", str(result.num_records))
    rows.add_row("requests imported", str(len(result.trace.ops)))
    rows.add_row("  failed / cancelled", str(result.num_failed))
    rows.add_row("skipped (not profiling)", str(result.num_skipped_phase))
    rows.add_row("roots", str(len(result.trace.roots)))
    rows.add_row("ops named by", "schedule map" if result.mapped else "AIPerf sessions")
    if result.num_dropped_deps:
        rows.add_row("dependencies on unsent ops dropped", str(result.num_dropped_deps))
    console.print(rows)
    done = [r.latency_s for r in lats if r.latency_s is not None]
    table = Table(title="Task level (root latency, s)")
    for name in ("roots completed", "p50", "p90", "p99", "max"):
        table.add_column(name, justify="right")
    if done:
        p50, p90, p99 = np.percentile(done, [50, 90, 99])
        table.add_row(f"{len(done)}/{len(lats)}", f"{p50:.3f}", f"{p90:.3f}", f"{p99:.3f}",
                      f"{max(done):.3f}")  # fmt: skip
    else:
        table.add_row(f"0/{len(lats)}", "-", "-", "-", "-")
    console.print(table)
    if paths:
        console.print(render_table("Completion path: mean share of root latency",
                                   [{k: round(v, 3) for k, v in shares.items()}]))  # fmt: skip
    if slo_table:
        console.print(render_table("SLO attainment", slo_rows(slo_table)))
    console.print(f"recorded as run {tid} in the ledger", highlight=False, soft_wrap=True)
