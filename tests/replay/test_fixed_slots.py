"""Fixed global arrival slots (seed paper App. G.1): targets first, the background by class,
round-robin (A) or concatenated (B), rotated per block; `kind: slots` arrivals time them."""

from __future__ import annotations

import pytest
from replay_factories import make_trace

from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.arms import run_scenario
from maserve_prefect.replay.scenario import parse_scenario
from maserve_prefect.replay.traceset import place_fixed_slots
from maserve_prefect.trace.cas import MemoryStore
from maserve_prefect.workloads.arrivals import SlotArrivals

BY_COHORT = {
    "t1": ["t1/r0", "t1/r1"],
    "t2": ["t2/r0"],
    "a1": ["a1/r0", "a1/r1"],
    "a2": ["a2/r0"],
    "b": ["b/r0", "b/r1", "b/r2"],
}
CLASS = {r: ("alpha" if r[0] == "a" else "beta") for rs in BY_COHORT.values() for r in rs}


def test_round_robin_deals_classes_in_lexicographic_order_after_the_targets() -> None:
    # targets alternate across target cohorts; classes alternate alpha, beta until one runs out;
    # within alpha its two cohorts alternate (a1 first in block 0)
    assert place_fixed_slots(BY_COHORT, ["t1", "t2"], CLASS, "round_robin") == [
        "t1/r0", "t2/r0", "t1/r1",
        "a1/r0", "b/r0", "a2/r0", "b/r1", "a1/r1", "b/r2",
    ]  # fmt: skip


def test_concatenated_puts_each_class_together_and_blocks_rotate_the_cohorts() -> None:
    b0 = place_fixed_slots(BY_COHORT, ["t1", "t2"], CLASS, "concatenated")
    b1 = place_fixed_slots(BY_COHORT, ["t1", "t2"], CLASS, "concatenated", rotation=1)
    assert b0[3:] == ["a1/r0", "a2/r0", "a1/r1", "b/r0", "b/r1", "b/r2"]
    assert b1[3:] == ["a2/r0", "a1/r0", "a1/r1", "b/r0", "b/r1", "b/r2"]
    assert sorted(b0) == sorted(b1) and b0[:3] == b1[:3]  # same roots, same target slots


def test_only_fixed_slot_placements_are_planned_here() -> None:
    with pytest.raises(ConfigError, match="'interleaved' is not a fixed-slot placement"):
        place_fixed_slots(BY_COHORT, ["t1"], CLASS, "interleaved")


def test_slot_arrivals_time_targets_then_background() -> None:
    assert SlotArrivals(3, 0.0, 0.02, 2.0, 2.0).offsets(6) == [0.0, 0.02, 0.04, 2.0, 4.0, 6.0]
    assert SlotArrivals(3, 0.0, 0.02, 2.0, 2.0).offsets(2) == [0.0, 0.02]


def _mix(**extra: object) -> dict[str, object]:
    return {
        "name": "mix",
        "cohorts": [
            {"name": "t", "bundle": "x"},
            {"name": "a1", "role": "background", "bundle": "x"},
            {"name": "a2", "role": "background", "bundle": "x"},
            {"name": "b", "role": "background", "bundle": "x"},
        ],
        "lock": "length",
        "placement": "round_robin",
        "arrivals": {"kind": "slots", "target_step_s": 0.5, "background_start_s": 10.0,
                     "background_step_s": 10.0},
        "blocks": 2,
        "arms": [{"name": "A"}, {"name": "B", "placement": "concatenated"}],
    } | extra  # fmt: skip


def test_slot_arrivals_need_a_fixed_slot_placement_on_every_arm() -> None:
    with pytest.raises(ConfigError, match=r"placement 'interleaved' \(arm 'B'\)"):
        parse_scenario(_mix(arms=[{"name": "A"}, {"name": "B", "placement": "interleaved"}]))


def test_arms_replay_the_same_work_with_only_the_background_slots_remapped() -> None:
    def tr(n: int, wf: str) -> tuple[object, MemoryStore]:
        return make_trace(n, workflow=wf, tool_s=(0.1, 0.1), model_tokens=(64, 8)), MemoryStore()

    loaded = {"t": tr(2, "toy"), "a1": tr(1, "alpha"), "a2": tr(1, "alpha"), "b": tr(2, "beta")}
    res = run_scenario(parse_scenario(_mix()), prefect=False, loaded=loaded)  # type: ignore[arg-type]

    def order(arm: str, block: int) -> list[str]:
        (r,) = [x for x in res.results if x.summary.arm == arm and x.summary.block == block]
        run = r.run
        offs = {root: round(t - run.start_s, 6) for root, t in run.root_arrival_s.items()}
        assert offs["t/r0"] == 0.0 and offs["t/r1"] == 0.5  # targets keep their arrivals
        bg = sorted((t, root) for root, t in offs.items() if not root.startswith("t/"))
        assert [t for t, _ in bg] == [10.0, 20.0, 30.0, 40.0]  # the same global slots
        tokens = sorted((o.op_id, o.num_input_tokens, o.num_output_tokens) for o in run.trace.ops)
        assert tokens == sorted(
            (o.op_id, o.num_input_tokens, o.num_output_tokens) for o in res.trace_set.trace.ops
        )
        return [root for _, root in bg]

    assert order("A", 0) == ["a1/r0", "b/r0", "a2/r0", "b/r1"]
    assert order("B", 0) == ["a1/r0", "a2/r0", "b/r0", "b/r1"]
    assert order("A", 1) == ["a2/r0", "b/r0", "a1/r0", "b/r1"]  # block 1 rotates alpha's cohorts
    assert order("B", 1) == ["a2/r0", "a1/r0", "b/r0", "b/r1"]
