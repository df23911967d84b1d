"""The pool suite's recorded work: native simulator traces of each workflow, recorded once.

One idea: the *work* a pool suite schedules is recorded by native runs (Prefect flows on the
simulator, through `taskrunner.native.run_native`) and kept on disk keyed by everything that
could change it, so every arm and every later suite run schedules exactly the same work.
`pool.recorded` turns the traces into units and arrivals.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from maserve_prefect import prefect_server
from maserve_prefect.errors import ConfigError
from maserve_prefect.settings import Settings
from maserve_prefect.trace.model import SCHEMA_VERSION, Trace


def trace_cache_dir() -> Path:
    """`$MASERVE_HOME/pool_traces` (where recorded native traces are kept)."""
    return Settings.from_env().home / "pool_traces"


def record_traces(
    workflows: Sequence[str],
    users: int,
    seed: int,
    *,
    cache_dir: Path | None = None,
) -> dict[str, Trace]:
    """Native simulator traces of `users` roots per workflow for `seed`, recorded once.

    A trace is realized with `run_native(workflow, users=users, seed=seed)` on the default pool
    and kept as JSON under `cache_dir` (default `trace_cache_dir()`), keyed by workflow, seed,
    users and a hash of the workflow's spec, the default pool file and the trace schema version;
    later calls read the file (delete the folder after changing the simulator itself). Recording
    needs a Prefect API: the configured one (`PREFECT_API_URL`, a test harness), else the
    managed local server is started (`prefect_server.ensure_server`), so `maserve bench run
    --no-prefect` records too; reading the cache needs none.

    Raises:
        ConfigError: a root of the native run failed (the work would be incomplete).
    """
    from maserve_prefect.engines.poolfile import default_pool_file
    from maserve_prefect.spec.io import spec_to_data
    from maserve_prefect.taskrunner.native import get_workflow, run_native

    folder = cache_dir or trace_cache_dir()
    pool = default_pool_file().model_dump_json(exclude={"source"})
    out = {}
    for name in workflows:
        spec = json.dumps(spec_to_data(get_workflow(name).spec), sort_keys=True, default=str)
        key = f"{SCHEMA_VERSION}\n{pool}\n{spec}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        path = folder / f"{name}-s{seed}-u{users}-{digest}.json"
        if path.is_file():
            out[name] = Trace.model_validate_json(path.read_text())
            continue
        with prefect_server.recording_api():
            run = run_native(name, users=users, seed=seed)
        failed = [r for r in run.roots if r.error is not None]
        if failed or len(run.roots) != users:
            first = failed[0].error if failed else "missing roots"
            raise ConfigError(
                f"native run of {name} (seed {seed}, {users} users): {len(failed)} roots "
                f"failed ({first}); fix the workflow (or, for a Prefect API error, the server "
                f"at PREFECT_API_URL / `maserve server status`) before using it as pool work"
            )
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(run.trace.model_dump_json())
        tmp.replace(path)
        out[name] = run.trace
    return out
