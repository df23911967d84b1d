"""The joint pool plan drives real vLLM servers: it loads, reclaims and places on a process pool."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from conftest import server_config

from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.engines.vllm.pool import VLLMProcessPool
from maserve_prefect.pool.executor import run_pool
from maserve_prefect.pool.inputs import RootDag
from maserve_prefect.pool.wall import run_pool_vllm
from maserve_prefect.pool.window import WorkUnit

# Each pool deployment serves the tiny model under its own name and is *planned* as a catalog
# model on an A100-40GB: a replica reserves 90 % of the device, so one fits per device and the
# third deployment can only run after the plan reclaims one.
PLANNED = {"small": "Qwen3-0.6B", "mid": "Qwen3-4B", "big": "Qwen3-8B"}
DEVICES = {"cpu0": "A100-40GB", "cpu1": "A100-40GB"}


def _chain(root: str, deps: tuple[str, str], arrival_s: float) -> RootDag:
    a = WorkUnit(f"{root}/a", root, deps[0], 64, 12, succs=(f"{root}/b",))
    b = WorkUnit(f"{root}/b", root, deps[1], 64, 9, preds=(f"{root}/a",))
    return RootDag(root, arrival_s, (a, b))


WORKFLOWS = [_chain("r0", ("small", "mid"), 0.0), _chain("r1", ("big", "small"), 0.0)]


def test_joint_plan_loads_reclaims_and_places_on_vllm_servers(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    deployments = {n: Deployment(n, m) for n, m in PLANNED.items()}
    configs = {n: server_config(tiny_model, served_model_name=n) for n in PLANNED}
    with VLLMProcessPool(
        vllm_python, deployments=configs, devices=tuple(DEVICES), log_dir=tmp_path
    ) as pool:
        res = run_pool_vllm(
            WORKFLOWS, pool, DEVICES, deployments, "joint", engine_kwargs={"vocab_size": 512}
        )
        records = pool.lifecycle_log()
    # every op ran, length-locked, on a replica of its own deployment
    assert [(o.unit_id, o.num_output_tokens) for o in res.ops] == [
        ("r0/a", 12), ("r0/b", 9), ("r1/a", 12), ("r1/b", 9)
    ]  # fmt: skip
    assert all(o.replica.startswith(f"{o.deployment}@") for o in res.ops)
    assert all(o.ready_s <= o.submitted_s < o.completed_s for o in res.ops)
    # three deployments, two devices: the plan had to reclaim a replica to load the third
    loads = [e for e in res.lifecycle if e.action == "load"]
    unloads = [e for e in res.lifecycle if e.action == "unload"]
    assert {e.deployment for e in loads} == set(PLANNED) and unloads
    # the plan's actions are real process lifecycles: one spawned server per load ...
    spawned = {r.replica for r in records if r.action == "spawn"}
    assert spawned == {e.replica for e in loads}
    # ... and never two servers alive on one device (a server lives from spawn to stop)
    life: dict[str, list[float]] = {}
    for r in records:
        span = life.setdefault(r.replica, [r.start_s, res.end_s])
        if r.action == "stop":
            span[1] = r.end_s
    device_of = {e.replica: e.device for e in loads}
    for device in DEVICES:
        spans = sorted(tuple(s) for rep, s in life.items() if device_of[rep] == device)
        assert all(prev[1] <= nxt[0] for prev, nxt in pairwise(spans)), spans
    # the reclaimed replica was lease-free: its ops had all completed before its unload began
    for e in unloads:
        ran = [o for o in res.ops if o.replica == e.replica]
        assert all(o.completed_s <= e.start_s for o in ran)


def test_the_simulated_pool_needs_the_same_reclaim() -> None:
    """The same workload on the simulated pool: the plan's books agree on what must happen."""
    deployments = {n: Deployment(n, m) for n, m in PLANNED.items()}
    sim = run_pool(WORKFLOWS, ["A100-40GB:0", "A100-40GB:1"], "joint", deployments=deployments)
    assert {e.deployment for e in sim.lifecycle if e.action == "load"} == set(PLANNED)
    assert any(e.action == "unload" for e in sim.lifecycle)


def test_process_pool_refuses_a_warm_start(tmp_path: Path) -> None:
    from maserve_prefect.errors import ConfigError
    from maserve_prefect.pool.inputs import ExecOptions

    pool = VLLMProcessPool("python", deployments={"small": "/m"}, log_dir=tmp_path)
    with pytest.raises(ConfigError, match="unsupported on a process pool"):
        run_pool_vllm(WORKFLOWS, pool, DEVICES, {}, options=ExecOptions(warm=(("small", "cpu0"),)))
