"""AIPerf and `maserve replay` side by side: one Mooncake file on its timestamps, one server.

The one idea: the same 60-request Mooncake-format file (`deployments/suites/scenarios/
mooncake_60.jsonl`) is replayed on its timestamps against one CPU vLLM server of the tiny
random-weight Llama (pinned to `--server-cpus`) by AIPerf 0.13.0 (`--custom-dataset-type
mooncake_trace --fixed-schedule`) and by `maserve replay --mooncake` (each pinned to
`--client-cpu` with `taskset`), `--runs` times each in alternating order, the prefix cache reset
before every run. Per run it reads each tool's own per-request records (AIPerf's
`profile_export.jsonl`, maserve's replay bundle) and computes the same figures from them: TTFT,
TPOT / ITL (per request: (e2e − TTFT) / (output tokens − 1), output tokens as the server counted
them) and e2e latency, p50 / p90 / p99 with numpy's linear percentiles; the schedule lag p99
(send time − the row's timestamp, relative to the least-late request, since AIPerf's records do
not carry the schedule's origin; maserve's audit also reports its exact lag); and the server's
own TTFT over each run (`vllm:time_to_first_token_seconds`, two scrapes of `/metrics`) with the
client's overhead (client TTFT mean − server TTFT mean). The table gives the median (min–max) of
each figure across runs per tool and, per request-level percentile, whether maserve's median lies
inside AIPerf's run-to-run range.

AIPerf runs from its own cached virtualenv (`<cache>/aiperf-0.13.0`, built once with `pip install
aiperf==0.13.0`; the cache is `$MASERVE_VLLM_CACHE`, else `~/.cache/maserve`, as for the vLLM
one). It reads the tiny model's tokenizer from a one-snapshot Hugging Face cache written beside
the model: AIPerf 0.13.0 loads tokenizers in its worker processes in offline mode by repo id,
which a plain local path does not resolve to. It runs without a readiness probe (its default:
no canned inference request reaches the server) and with the server's token counts
(`--use-server-token-count`).

Opt-in, never in the tests (it takes minutes). Needs the vLLM venv (`make vllm-env` prints its
python; pass --vllm-python or set MASERVE_VLLM_PYTHON) and PyPI for the first AIPerf install:

    .venv/bin/python benchmarks/peer_aiperf.py --runs 3 --out out/peer_aiperf
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from maserve_prefect.engines.openai.server_latency import TTFT, ServerWindow, scrape_histograms
from maserve_prefect.engines.openai.wall import drain_server
from maserve_prefect.engines.vllm.server import VLLMServer
from maserve_prefect.engines.vllm.server_config import VLLMServerConfig
from maserve_prefect.engines.vllm.venv import build_tiny_model, cache_root
from maserve_prefect.metrics.request import LatencyStats, request_samples_ms
from maserve_prefect.trace.bundle import import_bundle

AIPERF_VERSION = "0.13.0"
ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "deployments/suites/scenarios/mooncake_60.jsonl"
TOKENIZER_REPO = "maserve/tiny-llama"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
)
FIGURES = ("ttft", "tpot", "e2e")
QUANTILES = ("p50", "p90", "p99")


# -- setting up -------------------------------------------------------------------------------


def ensure_aiperf(cache: Path) -> list[str]:
    """The command that runs AIPerf from its cached virtualenv (`python -m aiperf`: console
    scripts name their interpreter by absolute path, which the rename below would break), built
    on first use in a temporary folder and renamed into place once installed and smoke-run."""
    final = cache / f"aiperf-{AIPERF_VERSION}"
    cmd = [str(final / "bin" / "python"), "-m", "aiperf"]
    if (final / ".ready").is_file():
        return cmd
    tmp = cache / f"aiperf-{AIPERF_VERSION}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"building the AIPerf {AIPERF_VERSION} venv in {final} (once)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True)
    subprocess.run(
        [str(tmp / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         f"aiperf=={AIPERF_VERSION}"],
        check=True,
    )  # fmt: skip
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    subprocess.run([*cmd, "--version"], check=True, capture_output=True)
    (final / ".ready").write_text(AIPERF_VERSION + "\n")
    return cmd


def tokenizer_cache(model: Path, folder: Path) -> Path:
    """A Hugging Face hub cache holding the model's tokenizer as `TOKENIZER_REPO`."""
    repo = folder / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    rev = "0" * 40
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    for name in TOKENIZER_FILES:
        if (model / name).is_file():
            shutil.copy2(model / name, snap / name)
    return folder


def start_server(vllm_python: Path, model: Path, cpus: str, log: Path) -> VLLMServer:
    """The tiny model on a CPU vLLM with the integration tests' settings, pinned to `cpus`."""
    config = VLLMServerConfig(
        model_path=model,
        served_model_name="tiny",
        max_model_len=32768,
        kv_cache_memory_bytes="80M",
        max_num_seqs=8,
        dev_endpoints=True,  # /reset_prefix_cache before every run
        cpus=cpus,
    )
    server = VLLMServer(config, vllm_python, log, name="tiny@cpu" + cpus)
    server.start()
    server.wait_healthy(timeout_s=600)
    return server


# -- one run of each tool ---------------------------------------------------------------------


def _stats(samples: dict[str, list[float]], lag_ms: list[float]) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": len(samples["e2e"])}
    for fig in FIGURES:
        st = LatencyStats.of(samples[fig])
        out[fig] = None if st is None else {
            "mean": st.mean_ms, "p50": st.p50_ms, "p90": st.p90_ms, "p99": st.p99_ms,
        }  # fmt: skip
    out["lag_p99"] = float(np.percentile(lag_ms, 99)) if lag_ms else None
    return out


def _relative_lag_ms(sent_ns: list[int], due_ms: list[float]) -> list[float]:
    """Send − timestamp per request, shifted so the least-late request has lag 0."""
    raw = [s / 1e6 - d for s, d in zip(sent_ns, due_ms, strict=True)]
    base = min(raw)
    return [r - base for r in raw]


def run_aiperf(
    exe: list[str], url: str, trace: Path, cpu: int, out: Path, hf: Path
) -> dict[str, Any]:
    """One AIPerf run; the figures from its per-request records."""
    argv = [
        "taskset", "-c", str(cpu), *exe, "profile", "--model", "tiny", "--url", url,
        "--endpoint-type", "completions", "--streaming", "--input-file", str(trace),
        "--custom-dataset-type", "mooncake_trace", "--fixed-schedule",
        "--tokenizer", TOKENIZER_REPO, "--extra-inputs", "ignore_eos:true",
        "--use-server-token-count", "--no-auto-plot",
        "--random-seed", "0", "--output-artifact-dir", str(out),
    ]  # fmt: skip
    env = os.environ | {"HF_HUB_CACHE": str(hf), "HF_HUB_OFFLINE": "1"}
    log = out.with_suffix(".log")
    with log.open("w") as fh:
        proc = subprocess.run(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"aiperf exited {proc.returncode}; see {log}")
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    recs = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    samples: dict[str, list[float]] = {k: [] for k in FIGURES}
    sent, due = [], []
    for r in recs:
        m, meta = r["metrics"], r["metadata"]
        samples["ttft"].append(m["time_to_first_token"]["value"])
        samples["e2e"].append(m["request_latency"]["value"])
        if "inter_token_latency" in m:
            samples["tpot"].append(m["inter_token_latency"]["value"])
        sent.append(int(meta["request_start_ns"]))
        due.append(float(rows[int(meta["conversation_id"].rsplit("_", 1)[1])]["timestamp"]))
    return _stats(samples, _relative_lag_ms(sent, due))


def run_maserve(url: str, trace: Path, cpu: int, out: Path) -> dict[str, Any]:
    """One `maserve replay --mooncake` run; the figures from its replay bundle, its audit and
    its own server window (which its probes precede)."""
    maserve = Path(sys.executable).with_name("maserve")
    argv = ["taskset", "-c", str(cpu), str(maserve), "replay", "--mooncake", str(trace),
            "--engine", f"openai:{url}", "--no-prefect", "--allow-failures", "--out", str(out)]  # fmt: skip
    log = out.with_suffix(".log")
    with log.open("w") as fh:
        proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"maserve replay exited {proc.returncode}; see {log}")
    trace_out = import_bundle(out / "schedule-b0").trace
    rows = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    due = {f"mc-{i + 1:06d}": float(r["timestamp"]) for i, r in enumerate(rows)}
    sent = [(op.times.submitted_s, due[op.root_id]) for op in trace_out.ops
            if op.times.submitted_s is not None]  # fmt: skip
    lag = _relative_lag_ms([int(s * 1e9) for s, _ in sent], [d for _, d in sent])
    res = _stats(request_samples_ms(trace_out), lag)
    summary = json.loads((out / "summary.json").read_text())
    res["audit_lag_p99"] = summary["conformance"][0]["schedule_lag_p99_ms"]
    server = [r for r in summary["tables"]["request latency"]
              if r["source"] == "server /metrics" and r["metric"] == "ttft"]  # fmt: skip
    res["server_ttft_mean"] = server[0]["mean_ms"] if server else None
    res["server_requests"] = server[0]["requests"] if server else None
    return res


# -- the comparison ---------------------------------------------------------------------------


def _spread(values: list[float | None]) -> tuple[float, float, float] | None:
    v = [x for x in values if x is not None]
    return (float(np.median(v)), min(v), max(v)) if v else None


def _cell(s: tuple[float, float, float] | None) -> str:
    return "-" if s is None else f"{s[0]:.1f} ({s[1]:.1f}–{s[2]:.1f})"


def figure_rows(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per figure: each tool's median and range across runs, and the verdict."""

    def pick(tool: str, fn: Any) -> tuple[float, float, float] | None:
        return _spread([fn(r) for r in runs[tool]])

    rows = []
    for fig in FIGURES:
        for q in QUANTILES:
            a = pick("aiperf", lambda r, f=fig, q=q: (r[f] or {}).get(q))
            m = pick("maserve", lambda r, f=fig, q=q: (r[f] or {}).get(q))
            inside = None if a is None or m is None else a[1] <= m[0] <= a[2]
            verdict = "-" if inside is None else ("inside" if inside else "OUTSIDE")
            rows.append({"figure": f"{fig} {q} ms", "aiperf": a, "maserve": m, "verdict": verdict})
    extra = (
        ("schedule lag p99 ms (relative)", "lag_p99"),
        ("server TTFT mean ms", "server_ttft_mean"),
        ("client TTFT overhead ms", "overhead"),
        ("requests at the server", "server_requests"),
    )
    for name, key in extra:
        rows.append({"figure": name, "aiperf": pick("aiperf", lambda r, k=key: r.get(k)),
                     "maserve": pick("maserve", lambda r, k=key: r.get(k)), "verdict": ""})  # fmt: skip
    rows.append({"figure": "maserve audit schedule lag p99 ms (exact)", "aiperf": None,
                 "maserve": pick("maserve", lambda r: r.get("audit_lag_p99")), "verdict": ""})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--vllm-python", default=os.environ.get("MASERVE_VLLM_PYTHON"))
    ap.add_argument("--server-cpus", default="0", help="taskset list for the server")
    ap.add_argument("--client-cpu", type=int, default=1, help="core both clients are pinned to")
    ap.add_argument("--cache-dir", type=Path, default=None, help="where the AIPerf venv lives")
    ap.add_argument("--out", type=Path, default=Path("out/peer_aiperf"))
    args = ap.parse_args(argv)
    if not args.vllm_python:
        ap.error("pass --vllm-python or set MASERVE_VLLM_PYTHON (`make vllm-env` prints it)")
    console = Console(width=130)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    exe = ensure_aiperf(cache_root(args.cache_dir))
    model = build_tiny_model(out / "models" / "tiny-llama", args.vllm_python)
    hf = tokenizer_cache(model, out / "hf")
    server = start_server(Path(args.vllm_python), model, args.server_cpus, out / "server.log")
    runs: dict[str, list[dict[str, Any]]] = {"aiperf": [], "maserve": []}
    try:
        for i in range(args.runs):
            order = ("aiperf", "maserve") if i % 2 == 0 else ("maserve", "aiperf")
            for tool in order:
                drain = drain_server(server.url)
                before = scrape_histograms(server.url)
                t0 = time.monotonic()
                dest = out / f"{tool}-{i}"
                shutil.rmtree(dest, ignore_errors=True)
                if tool == "aiperf":
                    res = run_aiperf(exe, server.url, args.trace, args.client_cpu, dest, hf)
                    window = ServerWindow.between(before, scrape_histograms(server.url))
                    h = window.get(TTFT) if window is not None else None
                    res["server_ttft_mean"] = (
                        None if h is None or h.mean_s is None else h.mean_s * 1e3
                    )
                    res["server_requests"] = None if h is None else h.count
                else:
                    res = run_maserve(server.url, args.trace, args.client_cpu, dest)
                ttft = res["ttft"]
                if ttft is not None and res["server_ttft_mean"] is not None:
                    res["overhead"] = ttft["mean"] - res["server_ttft_mean"]
                res["drain"] = drain.describe()
                res["wall_s"] = time.monotonic() - t0
                runs[tool].append(res)
                console.print(f"run {i} {tool}: {res['requests']} requests, {res['drain']}, "
                              f"{res['wall_s']:.0f} s")  # fmt: skip
    finally:
        server.stop()
    rows = figure_rows(runs)
    table = Table(title=f"{args.trace.name} on its timestamps, {args.runs} runs each: "
                  "median (min–max) across runs")  # fmt: skip
    for col in (
        "figure",
        f"AIPerf {AIPERF_VERSION}",
        "maserve replay",
        "maserve inside AIPerf's range",
    ):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for r in rows:
        table.add_row(r["figure"], _cell(r["aiperf"]), _cell(r["maserve"]), r["verdict"])
    console.print(table)
    (out / "result.json").write_text(json.dumps({"runs": runs, "rows": rows}, indent=2) + "\n")
    console.print(f"wrote {out / 'result.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
