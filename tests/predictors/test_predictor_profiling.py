"""Profiling rows: a batch on a replica measured from its outcomes and step records, simulator
and measured sweeps, CSV round trip, and the measured step model against the raw profiles."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from maserve_prefect.predictors import Shape, read_rows, write_rows
from maserve_prefect.predictors.measured import (
    AttentionGrid,
    complete_grid,
    llmservingsim_step_model,
    vidur_step_model,
)
from maserve_prefect.predictors.profiling import (
    measured_rows,
    run_batch,
    shape_grid,
    simulator_rows,
)

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.lifecycle import load_plan
from maserve_prefect.engines.sim.cost.step_cost import DecodeAffine, ScheduledChunk, StepCost
from maserve_prefect.engines.sim.replica import SimReplica
from maserve_prefect.errors import ConfigError, UnsupportedError


class Flat:
    """1 ms per step, whatever it computes."""

    def step_cost(self, chunks: Sequence[ScheduledChunk]) -> StepCost:
        return StepCost(0.001, 0.0, 0.0, 0.0)

    def decode_affine(self, num_seqs: int) -> DecodeAffine:
        return DecodeAffine(num_seqs, 0.001, 0.0, 0.0, 0.0)


def test_run_batch_reads_runtime_and_peak_blocks() -> None:
    clock = Kernel()
    replica = SimReplica(clock, Flat(), num_gpu_blocks=64, name="r")
    run = run_batch(replica, clock, "", Shape(2, 32, 4))
    # one prefill step for both prompts (64 tokens), then 3 decode steps
    assert run.runtime_s == pytest.approx(0.004)
    # each request ends holding 32 + 4 - 1 = 35 tokens -> 3 blocks of 16
    assert run.peak_kv_blocks == 6
    assert (run.max_step_tokens, run.max_step_seqs) == (64, 2)
    again = run_batch(replica, clock, "", Shape(1, 32, 2))  # same replica, later batch
    assert again.runtime_s == pytest.approx(0.002) and again.peak_kv_blocks == 3


def test_simulator_rows_carry_all_three_targets(tmp_path: Path) -> None:
    sweep = simulator_rows(["Qwen3-0.6B", "Qwen3-32B"], ["L40S"], [Shape(4, 128, 16)])
    assert [r.model for r in sweep.rows] == ["Qwen3-0.6B"]
    assert "Qwen3-32B on L40S: not loaded" in sweep.notes[0]
    r = sweep.rows[0]
    spec = get_model("Qwen3-0.6B")
    assert r.source == "simulator" and r.runtime_s > 0
    assert r.load_s == pytest.approx(load_plan(spec, get_gpu("L40S"), 0).total_s)
    kv = 4 * math.ceil((128 + 16 - 1) / 16) * 16 * spec.kv_bytes_per_token
    assert r.peak_mem_bytes > spec.weight_bytes + kv
    back = read_rows(write_rows(sweep.rows, tmp_path / "rows.csv"))
    assert back == sweep.rows


def test_csv_keeps_nan_and_reports_bad_lines(tmp_path: Path, shared_data: Path) -> None:
    rows = measured_rows(shared_data / "profiles", [Shape(1, 128, 8)]).rows
    back = read_rows(write_rows(rows, tmp_path / "m.csv"))
    assert [r.runtime_s for r in back] == [r.runtime_s for r in rows]
    assert all(math.isnan(r.peak_mem_bytes) and math.isnan(r.load_s) for r in back)
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "device"])
    with pytest.raises(ConfigError, match="missing columns"):
        read_rows(bad)


def test_measured_rows_cover_every_profiled_pair(shared_data: Path) -> None:
    sweep = measured_rows(shared_data / "profiles", [Shape(2, 256, 8)])
    pairs = {(r.device, r.model) for r in sweep.rows}
    assert len(pairs) == 11 and not sweep.notes
    for r in sweep.rows:
        assert r.source == "measured" and r.runtime_s > 0
        if r.device == "RTX PRO 6000":
            assert r.modelled_share == 0.0  # attention and lm_head measured there
        else:
            assert 0.0 < r.modelled_share < 0.5  # Vidur: attention + lm_head modelled


def test_vidur_step_model_sums_the_measured_operators(shared_data: Path) -> None:
    path = shared_data / "profiles" / "vidur" / "h100" / "Llama-2-7b-hf" / "mlp.csv"
    model = vidur_step_model(path, "H100")
    with path.open() as fh:
        rec = next(r for r in csv.DictReader(fh) if r["num_tokens"] == "512"
                   and r["num_tensor_parallel_workers"] == "1")  # fmt: skip
    ms = {op: float(rec[f"time_stats.{op}.median"]) * 1e-3 for op in
          ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")}  # fmt: skip
    cost = model.step_cost([ScheduledChunk(512, 0)])
    assert cost.linear_s == pytest.approx(32 * sum(ms.values()), rel=0.05)  # rows are averaged
    assert model.modelled_groups == frozenset({"attention_s", "lm_head_s"})
    with pytest.raises(UnsupportedError, match="fast_forward=False"):
        model.decode_affine(4)


def test_attention_grid_hits_measured_points(shared_data: Path) -> None:
    folder = shared_data / "profiles" / "llmservingsim" / "RTXPRO6000" / "Llama-3.1-8B"
    table = np.loadtxt(folder / "attention.csv", delimiter=",", skiprows=1, ndmin=2)
    grid = AttentionGrid(table)

    def measured(pc: int, kp: int, nd: int, kd: int) -> float:
        hit = table[(table[:, 0] == pc) & (table[:, 1] == kp) & (table[:, 2] == nd)
                    & (table[:, 3] == kd)]  # fmt: skip
        return float(hit[0, 4]) * 1e-6

    assert grid.step_s([ScheduledChunk(1, 1024)] * 8) == pytest.approx(measured(0, 0, 8, 1024))
    assert grid.step_s([ScheduledChunk(512, 256)]) == pytest.approx(measured(512, 256, 0, 0))
    mixed = [ScheduledChunk(256, 0)] + [ScheduledChunk(1, 2048)] * 4
    assert grid.step_s(mixed) == pytest.approx(measured(256, 0, 4, 2048))
    # longer contexts cost more; between grid points the value lies between its neighbours
    between = grid.step_s([ScheduledChunk(1, 1500)] * 8)
    assert measured(0, 0, 8, 1024) < between < measured(0, 0, 8, 2048)
    model = llmservingsim_step_model(folder)
    assert model.modelled_groups == frozenset()


def test_complete_grid_drops_sparse_values() -> None:
    pts = np.array([[1, 1], [1, 2], [2, 1], [2, 2], [3, 1], [1, 3]], dtype=float)
    axes, vals = complete_grid(pts, np.arange(6.0) + 1)
    assert axes == [[1.0, 2.0], [1.0, 2.0]]
    assert vals.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_the_sweep_skips_shapes_beyond_a_models_context_window() -> None:
    # Phi-2's window is 2,048 tokens: a server refuses a 4,096-token prompt, so a profiler
    # records no row for it (and says so) instead of failing the sweep
    sweep = simulator_rows(["Phi-2"], ["A100-80GB"], shape_grid((1,), (1024, 4096), (16,)))
    assert [(r.input_len, r.output_len) for r in sweep.rows] == [(1024, 16)]
    assert any("exceeds its context window (2048 tokens)" in n for n in sweep.notes)
