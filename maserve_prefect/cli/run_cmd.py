"""`maserve run WORKFLOW`: realize N roots natively, write the trace bundle, print a summary.

The one idea: **a run is done when the ledger has it and Prefect has caught up.** The command
connects to a Prefect API (`PREFECT_API_URL` if set, else the managed local server, started on
demand — see `maserve_prefect.prefect_server`), opens the ledger, calls
`taskrunner.native.run_native`, marks the ledger run finished, exports the bundle, prints the summary,
and then waits (bounded, with a spinner) until Prefect holds every task run the ledger linked, in
a final state, and checks ops ↔ task runs one to one. Prefect records task runs asynchronously,
so a command that exited at once would leave its history incomplete.

Exit codes: 0 success; 1 bad input or a failed step (one red line); 2 an engine that is not
supported yet; 3 Prefect's history does not match the ledger (timeout or missing task runs —
the bundle and the ledger are still complete); 4 a root failed (the bundle and summary are
written first, and one line names the first failure; `--allow-failures` exits 0 instead); 130
interrupted (Ctrl-C). A Prefect/ledger *edge* difference is printed as a warning (see
`trace.prefect_export`: Prefect also links parameters by object identity).

The engine's credentials are never stored or printed: URL user info shows as `***`, an API key
comes from the environment variable `--api-key-env NAME` names (see `engines.target`).

Ctrl-C: during the run the first one cancels it (`cli.interrupt`, `cli.run_cancel`: the run and
its Prefect flow runs are marked cancelled, the bundle of what finished is written, one line says
what was kept) and a second one exits at once; at any other moment one line says what the
interruption left behind. A run with failed ops still writes its bundle (marked partial) and
names the first failed op and its error.

Trace ids: `<workflow>-<binding>-s<seed>-u<users>`, with `-2`, `-3`, … appended when the ledger
already holds that id, unless `--trace-id` is given.

Examples:
    maserve run fork_join --users 4 --seed 1 --out out/fj
    maserve run code_repair --binding code --pool my_pool.yaml
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from maserve_prefect.cli.checks import EXIT_FAILED_WORK, check_out_dir, print_error
from maserve_prefect.cli.interrupt import EXIT_INTERRUPTED, exit_now, interruptible
from maserve_prefect.engines.target import EngineTarget
from maserve_prefect.engines.target import parse_engine as parse_target
from maserve_prefect.errors import ConfigError, MaserveError

if TYPE_CHECKING:
    from maserve_prefect.taskrunner.native import NativeRun
    from maserve_prefect.trace.ledger import Ledger
    from maserve_prefect.trace.model import OpRecord, Trace

# Seconds `maserve run` waits for Prefect to record every task run the ledger holds.
DEFAULT_WAIT_S = 120.0
EXIT_UNSUPPORTED = 2
EXIT_PREFECT_MISMATCH = 3
SHOWN_ERRORS = 3


ApiKeyEnv = Annotated[
    str | None,
    typer.Option(
        help="Environment variable holding the server's API key (sent as a bearer token; "
        "never stored)."
    ),
]
"""The `--api-key-env` option of the commands that talk to a real engine."""


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one red error line on stderr and exit with `code` (URL user info redacted)."""
    print_error(message)
    raise typer.Exit(code=code)


def open_ledger(url: str | None) -> Ledger:
    """The ledger at `url` (payloads in `$MASERVE_CAS_DIR`), else the configured one."""
    from maserve_prefect.settings import get_settings
    from maserve_prefect.trace.cas import ContentStore
    from maserve_prefect.trace.ledger import Ledger

    if url is None:
        return Ledger.from_settings()
    return Ledger(url, ContentStore(get_settings().cas_dir))


def parse_engine(engine: str) -> EngineTarget:
    """Validate `--engine` (`sim` or `openai:URL[#MODEL]`).

    Raises:
        ConfigError: anything else.
    """
    return parse_target(engine)


def unique_trace_id(ledger: Ledger, base: str) -> str:
    """`base`, or `base-2`, `base-3`, … — the first id the ledger does not hold."""
    taken = {r.trace_id for r in ledger.list_runs()}
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


@contextmanager
def _quiet_prefect(verbose: bool) -> Iterator[None]:
    """Prefect logs every flow and task run at INFO; keep the console for the summary."""
    logger = logging.getLogger("prefect")
    old = logger.level
    if not verbose:  # a failed op is reported once, by the summary, never as Prefect tracebacks
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(old)


def run_cmd(
    workflow: Annotated[str, typer.Argument(help="Workflow name (see `maserve run --list`).")] = "",
    binding: Annotated[
        str | None, typer.Option(help="Task binding (default: the workflow's).")
    ] = None,
    users: Annotated[int, typer.Option(min=1, help="Roots (users) to realize.")] = 1,
    engine: Annotated[
        str,
        typer.Option(
            help="'sim', 'openai:URL[#MODEL]' (an OpenAI-compatible server), or 'fleet' (the "
            "endpoints the --pool file lists per deployment under `replicas:`)."
        ),
    ] = "sim",
    route: Annotated[
        str | None,
        typer.Option(
            help="Where each ready call goes among a deployment's replicas: "
            "least-outstanding (default), prefix or session."
        ),
    ] = None,
    content: Annotated[
        str,
        typer.Option(
            help="Real engines: 'binding' locks output lengths and decisions to the binding's "
            "seeded draws; 'engine' lets the model generate freely."
        ),
    ] = "binding",
    pool: Annotated[
        Path | None, typer.Option(help="Pool file (devices, deployments) (default: shipped).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Run seed (instances, arrivals, content).")] = 0,
    out: Annotated[
        Path | None, typer.Option(help="Bundle directory (default: ./out/<workflow>-s<seed>).")
    ] = None,
    ledger_url: Annotated[
        str | None, typer.Option("--ledger", help="Ledger database URL (default: configured).")
    ] = None,
    arrival_rate: Annotated[
        float | None, typer.Option(help="Poisson root arrivals per virtual second.")
    ] = None,
    trace_id: Annotated[str | None, typer.Option(help="Trace id (default: derived).")] = None,
    wait: Annotated[
        float, typer.Option(help="Seconds to wait for Prefect to record every task run.")
    ] = DEFAULT_WAIT_S,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing bundle.")] = False,
    api_key_env: ApiKeyEnv = None,
    allow_failures: Annotated[
        bool, typer.Option("--allow-failures", help="Exit 0 even when a root failed.")
    ] = False,
    list_: Annotated[bool, typer.Option("--list", help="List workflow names and exit.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show Prefect's run logs.")] = False,
) -> None:
    """Realize N roots of a workflow, write the trace bundle and print a summary."""
    from maserve_prefect import prefect_server
    from maserve_prefect.cli.run_cancel import record_cancelled
    from maserve_prefect.engines.poolfile import load_pool_file
    from maserve_prefect.spec.binding import get_binding
    from maserve_prefect.taskrunner.native import get_workflow, list_workflows, run_native
    from maserve_prefect.trace.bundle import export_bundle
    from maserve_prefect.trace.runs import RunStatus

    console = Console()
    stage = "before the run started; nothing was recorded"  # what a Ctrl-C now leaves behind
    try:
        if list_:
            for name in list_workflows():
                console.print(f"{name}  [dim](binding {get_workflow(name).default_binding})[/]")
            return
        if not workflow:
            raise ConfigError("give a WORKFLOW name (`maserve run --list` shows them)")
        if arrival_rate is not None and not 0 < arrival_rate < float("inf"):
            raise ConfigError(f"--arrival-rate {arrival_rate}: give a finite rate > 0 roots/s")
        if content not in ("binding", "engine"):
            raise ConfigError(f"--content {content!r}: use 'binding' or 'engine'")
        from maserve_prefect.dispatch.routes import ROUTES

        if route is not None and route not in ROUTES:
            raise ConfigError(f"--route {route!r}: use one of {', '.join(ROUTES)}")
        target = parse_engine(engine).with_api_key_env(api_key_env)
        if target.is_fleet and pool is None:
            raise ConfigError(
                "--engine fleet: give --pool FILE whose deployments list their endpoints "
                "(`replicas: [http://HOST:PORT, ...]`)"
            )
        if (
            target.kind == "openai"
        ):  # fail fast, before Prefect starts, when the server is not there
            from maserve_prefect.engines.openai.discovery import discover

            discover(target.base_url, model=target.model, probe=False, **target.client_auth())
        wf = get_workflow(workflow)
        b = get_binding(binding or wf.default_binding)
        pool_file = load_pool_file(pool) if pool is not None else None
        if target.is_fleet and pool_file is not None:  # fail fast, as for one server
            from maserve_prefect.engines.openai.fleet_open import check_endpoints

            check_endpoints(pool_file)
        dest = out if out is not None else Path("out") / f"{wf.name}-s{seed}"
        check_out_dir(dest, "--out")
        if dest.exists() and not force and (not dest.is_dir() or any(dest.iterdir())):
            raise ConfigError(f"--out {dest} exists and is not empty; pass --force to replace it")
        with console.status("connecting to Prefect…"):
            server = prefect_server.ensure_server(
                announce=lambda line: console.print(line, highlight=False, soft_wrap=True)
            )
        with open_ledger(ledger_url) as ledger, prefect_server.connected(server):
            tid = trace_id or unique_trace_id(ledger, f"{wf.name}-{b.binding_id}-s{seed}-u{users}")
            with (
                interruptible() as stop,
                console.status(f"running {users} root(s) of {wf.name}…"),
                _quiet_prefect(verbose),
            ):
                run = run_native(
                    wf, b, users=users, seed=seed, pool=pool_file, ledger=ledger,
                    arrival_rate=arrival_rate, trace_id=tid, engine=target,
                    content_source=content, cancel=stop, plan=route or "fcfs",
                )  # fmt: skip
                if run.cancelled:  # Ctrl-C: a second one still exits at once
                    report = record_cancelled(
                        ledger, tid, dest, force=force, flow_run_ids=run.flow_run_ids
                    )
                    Console(stderr=True).print(report.line(), highlight=False, soft_wrap=True)
                    exit_now(EXIT_INTERRUPTED)
            failed_op = first_failed_op(run.trace)
            failed = failed_op is not None or any(r.error for r in run.roots)
            ledger.finish_run(tid, RunStatus.FAILED if failed else RunStatus.COMPLETED)
            stage = (
                f"after run {tid} was recorded; write its bundle with "
                f"`maserve trace export --run {tid} --ledger-only`"
            )
            written = export_bundle(ledger.load_trace(tid), ledger.cas, dest, overwrite=force)
            stage = f"while waiting for Prefect; run {tid} and its bundle {written} are complete"
            partial = " (partial: ops failed)" if failed else ""
            console.print(
                f"trace {tid} → {written}{partial}  (Prefect API {server.url})", highlight=False
            )
            if server.ui_url is not None and run.parent_flow_run_id is not None:
                console.print(
                    f"Prefect UI: {server.ui_url}/runs/flow-run/{run.parent_flow_run_id}",
                    highlight=False,
                    soft_wrap=True,  # a URL is never broken across lines
                )
            print_summary(console, run)
            if failed_op is not None:
                print_failure(run.trace, failed_op, hint=not allow_failures)
            _await_prefect(console, ledger, tid, wait)
            if failed and not allow_failures:
                if failed_op is None:  # a root failed outside any op
                    bad = next(r for r in run.roots if r.error)
                    print_error(
                        f"root {bad.root_id} failed: {bad.error}; pass --allow-failures to exit 0"
                    )
                raise typer.Exit(code=EXIT_FAILED_WORK)  # the line above says why
    except MaserveError as exc:
        fail(str(exc))
    except KeyboardInterrupt:  # outside the run itself (there Ctrl-C cancels, see above)
        _interrupted(stage)
    except Exception as exc:
        if not caused_by_interrupt(exc):
            raise
        _interrupted(stage)


def _interrupted(stage: str) -> NoReturn:
    Console(stderr=True).print(f"interrupted {stage}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=EXIT_INTERRUPTED)


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether `exc` wraps a Ctrl-C (a library that catches every exception, e.g. pydantic's
    serializer, re-raises `KeyboardInterrupt` as its own error)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        # pydantic-core's serializer keeps only the text of what its callback raised
        if type(cur).__name__ == "PydanticSerializationError" and "KeyboardInterrupt" in str(cur):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def first_failed_op(trace: Trace) -> OpRecord | None:
    """The failed op that ended first (its last attempt), or None when none failed."""
    from maserve_prefect.trace.model import OpStatus

    latest = trace.op_index()
    failed = [op for op in latest.values() if op.status is OpStatus.FAILED]
    if not failed:
        return None
    return min(failed, key=lambda op: (op.times.completed_s or 0.0, op.op_id))


def print_failure(trace: Trace, op: OpRecord, *, hint: bool = False) -> None:
    """One red line: how many ops failed or never started, and the first failure's error (with
    `hint`, how to exit 0 anyway)."""
    from maserve_prefect.trace.model import OpStatus

    latest = trace.op_index().values()
    num_failed = sum(1 for o in latest if o.status is OpStatus.FAILED)
    num_skipped = sum(1 for o in latest if o.status is OpStatus.SKIPPED)
    Console(stderr=True).print(
        f"[bold red]error:[/] {num_failed} op(s) failed and {num_skipped} never started; the "
        f"first failure: op {op.op_id} (attempt {op.attempt}): {op.error or 'no error recorded'}"
        + ("; pass --allow-failures to exit 0" if hint else ""),
        highlight=False,
        soft_wrap=True,
    )


def _await_prefect(console: Console, ledger: Ledger, trace_id: str, wait_s: float) -> None:
    """Wait for Prefect to hold every linked task run, then check it against the ledger."""
    from maserve_prefect.trace.prefect_export import SyncProgress, export_from_prefect
    from maserve_prefect.trace.prefect_export import wait_for_prefect as wait_for

    with console.status("waiting for Prefect to record the run…") as spinner:

        def show(p: SyncProgress) -> None:
            spinner.update(
                f"waiting for Prefect to record the run… {p.num_final}/{p.num_expected} task "
                f"runs final ({p.waited_s:.0f} s)"
            )

        progress = wait_for(ledger, trace_id, timeout_s=wait_s, on_poll=show)
    if not progress.complete:
        fail(
            f"Prefect recorded {progress.num_recorded} of {progress.num_expected} task runs "
            f"({progress.num_final} final) within {wait_s:.0f} s; the ledger and bundle are "
            f"complete, Prefect's history is not — check the server log "
            f"(`maserve server status`) and retry `maserve trace export --run {trace_id}`",
            code=EXIT_PREFECT_MISMATCH,
        )
    agreement = export_from_prefect(ledger, trace_id=trace_id).agreement
    if agreement.missing or agreement.unlinked or agreement.unfinished:
        fail(
            f"Prefect and the ledger disagree on run {trace_id}:\n{agreement.describe()}",
            code=EXIT_PREFECT_MISMATCH,
        )
    console.print(
        f"Prefect ↔ ledger: {agreement.num_task_runs} task runs = {agreement.num_ops} ops, "
        f"one to one",
        highlight=False,
    )
    if agreement.only_prefect or agreement.only_ledger or agreement.state_mismatch:
        console.print(
            f"[yellow]warning:[/] Prefect's recorded edges/states differ from the ledger's "
            f"(the ledger is the source of truth):\n{agreement.describe()}",
            highlight=False,
            soft_wrap=True,
        )


def print_summary(console: Console, run: NativeRun) -> None:
    """Roots, ops by kind, tokens, root latency percentiles, graph shape and task quality."""
    from maserve_prefect.metrics.graph import trace_graph_summary
    from maserve_prefect.spec.binding import summarize_quality
    from maserve_prefect.trace.model import OpStatus

    trace = run.trace
    done = [r for r in run.roots if r.error is None]
    table = Table(title=f"Run {trace.manifest.trace_id}", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("roots completed", f"{len(done)} / {len(run.roots)}")
    table.add_row("roots failed", str(len(run.roots) - len(done)))
    kinds = Counter(str(op.kind) for op in trace.ops)
    table.add_row("ops", str(len(trace.ops)))
    for kind, count in sorted(kinds.items()):
        table.add_row(f"  {kind}", str(count))
    table.add_row("input tokens", str(sum(op.num_input_tokens for op in trace.ops)))
    table.add_row("output tokens", str(sum(op.num_output_tokens for op in trace.ops)))
    if done:
        latency = np.array([r.finish_s - r.arrival_s for r in done])
        p50, p90, p99 = np.percentile(latency, [50, 90, 99])
        table.add_row("root latency p50/p90/p99 (virtual s)", f"{p50:.2f} / {p90:.2f} / {p99:.2f}")
    if trace.ops:
        graph = trace_graph_summary(trace)
        for name, dist in (
            ("LLM calls per root", graph.num_calls),
            ("graph depth", graph.depth),
            ("antichain width", graph.antichain_width),
        ):
            table.add_row(f"{name} mean/p50/max", f"{dist.mean:.2f} / {dist.p50:g} / {dist.max:g}")
    quality = summarize_quality(r.quality for r in run.roots if r.quality is not None)
    table.add_row(
        "task quality (pass rate, mean score)",
        f"{quality.pass_rate:.2f}, {quality.mean_score:.2f} over {quality.num_instances}",
    )
    console.print(table)
    if not run.meaningful_quality:
        console.print(
            "[dim]note: simulator answers are synthetic text, so task quality is not "
            "meaningful here[/]"
        )
    latest = trace.op_index().values()
    for r in [r for r in run.roots if r.error][:SHOWN_ERRORS]:
        # The root's own failed op says why; Prefect's flow-level error only says "not ready".
        ops = [o for o in latest if o.root_id == r.root_id and o.status is OpStatus.FAILED]
        why = f"op {ops[0].op_id}: {ops[0].error}" if ops else r.error
        if not ops and r.raised_at:
            why = f"{why} (raised at {r.raised_at})"
        console.print(f"[red]root {r.root_id} failed:[/] {why}", highlight=False)
