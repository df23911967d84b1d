"""The simulator's scheduler (`engines/sim/step/scheduler.py`) driven one step at a time:
`schedule()` then `update_from_output(...)`, as the replica loop drives it.

Tiny exact cases assert every step's scheduled `(request, computed before, new tokens)`, its
preemptions, why admission stopped and which requests finished (block size 4, so block counts are
easy to follow); a property test checks the step invariants on random workloads. Also: vLLM's
per-device batch defaults and config validation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from sim_factories import make_scheduler, make_sim_request

from maserve_prefect.engines.sim.request import RequestStatus, SimRequest
from maserve_prefect.engines.sim.step.scheduler import (
    GIB_BYTES,
    AdmitStop,
    Policy,
    Scheduler,
    SchedulerConfig,
    default_batch_limits,
)
from maserve_prefect.errors import ConfigError

BS = 4  # tokens per KV block in the exact cases
EMPTY, BUDGET, MAX_SEQS, KV, PREEMPTED = (
    AdmitStop.EMPTY,
    AdmitStop.BUDGET,
    AdmitStop.MAX_SEQS,
    AdmitStop.KV,
    AdmitStop.PREEMPTED,
)


class Step(NamedTuple):
    """One step as the tests read it."""

    scheduled: list[tuple[str, int, int]]  # (request id, computed before, new tokens)
    preempted: list[str]
    stop: AdmitStop
    finished: list[str]


def run_steps(
    sched: Scheduler, arrivals: Mapping[int, Sequence[SimRequest]], max_steps: int = 100
) -> list[Step]:
    """Add each step's arrivals, then step until nothing is left; invariants after every step."""
    steps: list[Step] = []
    while len(steps) < max_steps:
        for r in arrivals.get(len(steps), ()):
            sched.add_request(r)
        if not sched.has_work() and max(arrivals, default=0) <= len(steps):
            return steps
        out = sched.schedule()
        done = sched.update_from_output(out)
        sched.check_invariants()
        items = [(it.request_id, it.num_computed_before, it.num_new_tokens) for it in out.scheduled]
        steps.append(
            Step(items, out.preempted, out.admit_stop, [r.request_id for r in done.finished])
        )
    raise AssertionError(f"not done after {max_steps} steps")


def sreq(rid: str, prompt: int = 0, out: int = 1, *, seq: int, **kw: Any) -> SimRequest:
    return make_sim_request(rid, prompt, out, seq=seq, block_size=BS, **kw)


@pytest.mark.parametrize(
    ("memory_gib", "name", "expected"),
    [
        (80, "NVIDIA H100 80GB HBM3", (8192, 1024)),
        (141, "NVIDIA H200", (8192, 1024)),
        (80, "NVIDIA A100-SXM4-80GB", (2048, 256)),
        (48, "NVIDIA L40S", (2048, 256)),
        (24, "NVIDIA A10G", (2048, 256)),
    ],
)
def test_batch_defaults_follow_vllm_device_classes(
    memory_gib: int, name: str, expected: tuple[int, int]
) -> None:
    assert default_batch_limits(memory_gib * GIB_BYTES, name) == expected


def test_config_defaults_and_for_device() -> None:
    cfg = SchedulerConfig()
    assert (cfg.block_size, cfg.enable_prefix_caching, cfg.long_prefill_token_threshold) == (
        16,
        True,
        0,
    )
    assert cfg.policy is Policy.FCFS
    big = SchedulerConfig.for_device(80 * GIB_BYTES, "H100", policy=Policy.PRIORITY)
    assert (big.max_num_batched_tokens, big.max_num_seqs, big.policy) == (
        8192,
        1024,
        Policy.PRIORITY,
    )
    assert SchedulerConfig.for_device(80 * GIB_BYTES, "H100", max_num_seqs=8).max_num_seqs == 8


@pytest.mark.parametrize(
    "kwargs", [{"block_size": 0}, {"max_num_seqs": 0}, {"long_prefill_token_threshold": -1}]
)
def test_bad_config_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        SchedulerConfig(**kwargs)  # type: ignore[arg-type]


# -- one step at a time: exact cases -----------------------------------------------------------


def test_a_prefill_that_fits_the_budget_runs_in_one_step_then_decodes_one_token_a_step() -> None:
    a = sreq("a", 10, 3, seq=0)
    steps = run_steps(make_scheduler(16, block_size=BS, max_num_batched_tokens=16), {0: [a]})
    assert steps == [
        Step([("a", 0, 10)], [], EMPTY, []),  # the prefill samples the first token
        Step([("a", 10, 1)], [], EMPTY, []),
        Step([("a", 11, 1)], [], EMPTY, ["a"]),
    ]
    assert (a.num_output_tokens, a.status) == (3, RequestStatus.FINISHED)


def test_a_long_prefill_is_chunked_by_the_budget_and_a_short_one_fills_the_rest() -> None:
    sched = make_scheduler(16, block_size=BS, max_num_batched_tokens=8)
    steps = run_steps(sched, {0: [sreq("a", 20, 2, seq=0), sreq("b", 4, 2, seq=1)]})
    assert steps == [
        Step([("a", 0, 8)], [], BUDGET, []),
        Step([("a", 8, 8)], [], BUDGET, []),
        Step([("a", 16, 4), ("b", 0, 4)], [], EMPTY, []),  # a's last chunk; b's whole prompt
        Step([("a", 20, 1), ("b", 4, 1)], [], EMPTY, ["a", "b"]),
    ]


def test_the_long_prefill_threshold_caps_a_chunk_below_the_budget() -> None:
    sched = make_scheduler(16, block_size=BS, long_prefill_token_threshold=6)
    steps = run_steps(sched, {0: [sreq("a", 14, 1, seq=0), sreq("b", 3, 1, seq=1)]})
    assert [s.scheduled for s in steps] == [
        [("a", 0, 6), ("b", 0, 3)],
        [("a", 6, 6)],
        [("a", 12, 2)],
    ]


def test_running_requests_decode_together_in_running_order() -> None:
    reqs = [sreq(x, 4, 3, seq=i) for i, x in enumerate("abc")]
    steps = run_steps(make_scheduler(16, block_size=BS), {0: reqs})
    assert steps == [
        Step([("a", 0, 4), ("b", 0, 4), ("c", 0, 4)], [], EMPTY, []),
        Step([("a", 4, 1), ("b", 4, 1), ("c", 4, 1)], [], EMPTY, []),
        Step([("a", 5, 1), ("b", 5, 1), ("c", 5, 1)], [], EMPTY, ["a", "b", "c"]),
    ]


def test_max_num_seqs_holds_a_request_back_until_a_running_one_finishes() -> None:
    reqs = [sreq(x, 4, 2, seq=i) for i, x in enumerate("abc")]
    steps = run_steps(make_scheduler(16, block_size=BS, max_num_seqs=2), {0: reqs})
    assert steps == [
        Step([("a", 0, 4), ("b", 0, 4)], [], MAX_SEQS, []),
        Step([("a", 4, 1), ("b", 4, 1)], [], MAX_SEQS, ["a", "b"]),
        Step([("c", 0, 4)], [], EMPTY, []),
        Step([("c", 4, 1)], [], EMPTY, ["c"]),
    ]


def test_out_of_kv_blocks_the_last_running_request_is_preempted_and_recomputed() -> None:
    # 4 blocks of 4 tokens: a and b take two each; a's first decode needs a third block.
    a, b = sreq("a", 8, 4, seq=0), sreq("b", 8, 4, seq=1)
    sched = make_scheduler(4, block_size=BS, enable_prefix_caching=False)
    steps = run_steps(sched, {0: [a, b]})
    assert steps == [
        Step([("a", 0, 8), ("b", 0, 8)], [], EMPTY, []),
        Step([("a", 8, 1)], ["b"], PREEMPTED, []),  # no admission in a step that preempted
        Step([("a", 9, 1)], [], KV, []),  # b (9 tokens: 3 blocks) waits for room
        Step([("a", 10, 1)], [], KV, ["a"]),
        Step([("b", 0, 9)], [], EMPTY, []),  # prompt and its one sampled token, recomputed
        Step([("b", 9, 1)], [], EMPTY, []),
        Step([("b", 10, 1)], [], EMPTY, ["b"]),
    ]
    assert (a.num_output_tokens, b.num_output_tokens) == (4, 4)
    assert (a.num_preemptions, b.num_preemptions, sched.num_preemptions_total) == (0, 1, 1)


def test_a_recompute_after_preemption_reuses_its_own_blocks_still_cached() -> None:
    # As above with prefix caching: b's first block (freed, still cached) is a hit when b is
    # readmitted; its second was evicted when a took that block for its decode.
    sched = make_scheduler(4, block_size=BS)
    steps = run_steps(sched, {0: [sreq("a", 8, 4, seq=0), sreq("b", 8, 4, seq=1)]})
    assert [s.scheduled for s in steps][4:] == [[("b", 4, 5)], [("b", 9, 1)], [("b", 10, 1)]]


def test_the_priority_policy_preempts_the_lowest_priority_not_the_last_running() -> None:
    def steps(policy: Policy) -> list[Step]:
        b = sreq("b", 8, 4, seq=0, priority=1)  # runs first, lower priority
        a = sreq("a", 4, 4, seq=1, priority=0, arrival_s=1.0)
        sched = make_scheduler(4, block_size=BS, policy=policy, enable_prefix_caching=False)
        return run_steps(sched, {0: [b], 1: [a]})

    fcfs, prio = steps(Policy.FCFS), steps(Policy.PRIORITY)
    assert fcfs[1] == prio[1] == Step([("b", 8, 1), ("a", 0, 4)], [], EMPTY, [])
    # a's first decode needs a fourth block: FCFS preempts the last running (a itself) ...
    assert fcfs[2] == Step([("b", 9, 1)], ["a"], PREEMPTED, [])
    # ... priority preempts b (priority 1), undoing b's tokens already scheduled this step.
    assert prio[2] == Step([("a", 4, 1)], ["b"], PREEMPTED, [])
    assert [s.finished for s in prio if s.finished] == [["a"], ["b"]]


def test_prefix_cache_hits_reduce_the_tokens_scheduled() -> None:
    sched = make_scheduler(16, block_size=BS)
    a = sreq("a", token_ids=range(12), seq=0)
    b = sreq("b", token_ids=[*range(12), 99, 98], seq=1)  # a's three blocks, then two tokens
    c = sreq("c", token_ids=range(12), seq=2)  # a's prompt: at most 11 tokens may hit
    steps = run_steps(sched, {0: [a], 1: [b, c]})
    assert steps == [
        Step([("a", 0, 12)], [], EMPTY, ["a"]),
        Step([("b", 12, 2), ("c", 8, 4)], [], EMPTY, ["b", "c"]),
    ]
    assert (a.num_cached_tokens, b.num_cached_tokens, c.num_cached_tokens) == (0, 12, 8)
    assert (sched.kv.num_queried_tokens, sched.kv.num_hit_tokens) == (12 + 14 + 12, 20)


@pytest.mark.parametrize(
    ("policy", "order"), [(Policy.FCFS, ["a", "b", "c"]), (Policy.PRIORITY, ["b", "c", "a"])]
)
def test_admission_order_is_arrival_under_fcfs_and_priority_then_arrival(
    policy: Policy, order: list[str]
) -> None:
    reqs = [
        sreq(rid, 4, 1, seq=i, priority=p, arrival_s=0.1 * i)
        for i, (rid, p) in enumerate([("a", 2), ("b", 0), ("c", 1)])
    ]
    sched = make_scheduler(16, block_size=BS, max_num_seqs=1, policy=policy)
    steps = run_steps(sched, {0: reqs})
    assert [s.scheduled for s in steps] == [[(rid, 0, 4)] for rid in order]


def test_the_output_is_a_copy_of_the_decisions() -> None:
    sched = make_scheduler(16, block_size=BS)
    a = sreq("a", 4, 2, seq=0)
    sched.add_request(a)
    out = sched.schedule()
    before = list(out.scheduled)
    sched.update_from_output(out)
    assert out.scheduled == before and a.num_computed_tokens == 4
    assert out.scheduled[0].num_computed_before == 0  # the decision, not the live count


# -- property: the step invariants on random workloads ----------------------------------------


class Workload(NamedTuple):
    config: dict[str, object]
    num_blocks: int
    arrivals: dict[int, list[tuple[str, int, int, int, tuple[int, ...] | None]]]


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    block_size = draw(st.sampled_from([1, 4, 16]))
    config: dict[str, object] = {
        "block_size": block_size,
        "max_num_batched_tokens": draw(st.integers(1, 64)),
        "max_num_seqs": draw(st.integers(1, 4)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 5, 17])),
        "enable_prefix_caching": draw(st.booleans()),
        "policy": draw(st.sampled_from(list(Policy))),
    }
    arrivals: dict[int, list[tuple[str, int, int, int, tuple[int, ...] | None]]] = {}
    most_blocks = 1
    for i in range(draw(st.integers(1, 8))):
        out = draw(st.integers(1, 8))
        if draw(st.booleans()):  # token ids: a shared prefix (family) and a unique tail
            family, shared = draw(st.integers(0, 1)), draw(st.integers(0, 40))
            tail = draw(st.integers(1, 20))
            ids = tuple(range(family * 1000, family * 1000 + shared)) + (10_000 + i,) * tail
            prompt = len(ids)
        else:
            ids, prompt = None, draw(st.integers(1, 60))
        most_blocks = max(most_blocks, -(-(prompt + out - 1) // block_size))
        step = draw(st.integers(0, 12))
        arrivals.setdefault(step, []).append((f"r{i}", prompt, out, draw(st.integers(0, 2)), ids))
    # room for the largest request alone, sometimes not much more: preemption happens
    num_blocks = most_blocks + draw(st.integers(0, 2 * most_blocks))
    return Workload(config, num_blocks, arrivals)


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_every_step_keeps_the_budget_and_the_blocks_and_every_request_finishes(
    w: Workload,
) -> None:
    sched = make_scheduler(w.num_blocks, **w.config)
    cfg, kv = sched.config, sched.kv
    everyone: list[SimRequest] = []
    step, preempted = 0, False
    while step < 5000:
        for rid, prompt, out, prio, ids in w.arrivals.get(step, []):
            r = make_sim_request(rid, prompt, out, seq=len(everyone), block_size=cfg.block_size,
                                 arrival_s=float(step), priority=prio, token_ids=ids)  # fmt: skip
            sched.add_request(r)
            everyone.append(r)
        if not sched.has_work() and step > max(w.arrivals):
            break
        out = sched.schedule()
        ids_scheduled = [it.request_id for it in out.scheduled]
        assert out.num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert len(ids_scheduled) == len(set(ids_scheduled))
        assert len(sched.running) <= cfg.max_num_seqs
        assert 0 <= kv.num_free_blocks <= w.num_blocks and (kv.ref_cnt >= 0).all()
        preempted = preempted or bool(out.preempted)
        for it in out.scheduled:
            r = sched.by_seq[it.seq]
            assert r.status is RequestStatus.RUNNING and it.num_new_tokens > 0
            if cfg.long_prefill_token_threshold:
                assert it.num_new_tokens <= cfg.long_prefill_token_threshold
            # its blocks hold every token computed after this step
            need = it.num_computed_before + it.num_new_tokens
            assert len(kv.blocks_of(r)) * cfg.block_size >= need
        sched.update_from_output(out)
        sched.check_invariants()  # KV ref counts and conservation, queue states
        step += 1
    event(f"some request was preempted: {preempted}")
    assert not sched.has_work(), "requests left after 5000 steps"
    assert len(everyone) == sum(len(v) for v in w.arrivals.values())
    for r in everyone:
        assert r.status is RequestStatus.FINISHED
        assert r.num_output_tokens == r.max_tokens
    assert kv.num_free_blocks == w.num_blocks and kv.usage == 0.0
