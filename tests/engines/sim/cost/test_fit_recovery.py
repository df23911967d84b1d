"""The fit on small synthetic profiles: it recovers known factors, and the held-out splits never
score a row with a fit that saw it."""

from __future__ import annotations

import numpy as np
import pytest

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.sim.cost import calibrate
from maserve_prefect.engines.sim.cost.calibrate import (
    fit_efficiency,
    leave_one_device_out,
    leave_one_model_out,
    predict,
)
from maserve_prefect.engines.sim.cost.profiles import ProfileSet
from maserve_prefect.engines.sim.cost.roofline import (
    GEMM_TILE_M,
    elementwise_bytes_per_token,
    elementwise_time,
    gemm_rows,
    linear_time,
)

TOKENS = np.array([1, 2, 8, 32, 64, 100, 128, 200, 256, 512, 1024, 2048, 4096], dtype=np.float64)
MODELS = ("Llama-2-7B", "Phi-2", "CodeLlama-34B")
TRUE = DeviceEfficiency(
    linear_mem=0.83,
    linear_comp=0.64,
    linear_op_s=4.5e-6,
    elem_vidur_norm_mem=0.35,
    elem_add_mem=0.9,
    elem_norm_mem=0.7,
    elem_op_s=1.7e-6,
    elem_vidur_norm_op_s=6.5e-6,
    elem_add_op_s=2.2e-6,
    elem_l2_gain=2.4,
)


def _synthetic(
    device: str, ops: tuple[str, ...], eff: DeviceEfficiency = TRUE, tps: tuple[int, ...] = (1, 2)
) -> list[ProfileSet]:
    """Profiles whose seconds are exactly the model's with `eff` (no noise)."""
    gpu = get_gpu(device)
    out = []
    for name in MODELS:
        for tp in tps:
            for op in ops:
                ps = ProfileSet(device, get_model(name), tp, op, TOKENS, TOKENS * 0, "synthetic")
                ps.seconds = predict(ps, gpu, eff)
                out.append(ps)
    return out


def test_fit_recovers_known_linear_and_elementwise_factors() -> None:
    sets = _synthetic("A100-80GB", ("qkv", "o", "gate_up", "down", "norm", "add", "add_norm"))
    fitted = fit_efficiency(sets, get_gpu)
    for name in (
        "linear_mem",
        "linear_comp",
        "linear_op_s",
        "elem_vidur_norm_mem",
        "elem_add_mem",
        "elem_norm_mem",
        "elem_op_s",
        "elem_vidur_norm_op_s",
        "elem_add_op_s",
        "elem_l2_gain",
    ):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    # factors no row depends on keep their starting values
    assert fitted.attn_cta_s == DeviceEfficiency().attn_cta_s
    assert fitted.elem_vidur_embed_mem == DeviceEfficiency().elem_vidur_embed_mem
    assert fitted.elem_vidur_act_op_s == DeviceEfficiency().elem_vidur_act_op_s


def test_leave_one_model_out_never_scores_a_model_its_fit_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sets = _synthetic("A100-80GB", ("qkv", "norm"), tps=(1,))
    sets += _synthetic("H100", ("qkv",), tps=(1,))[:1]  # one model only: nothing to hold out
    seen: list[set[str]] = []
    real_fit = calibrate.fit_efficiency

    def spy(train: list[ProfileSet], gpus: calibrate.GpuLookup, base: object = None) -> object:
        train = list(train)
        seen.append({s.model.name for s in train})
        assert {s.device for s in train} == {"A100-80GB"}
        return real_fit(train, gpus)

    monkeypatch.setattr(calibrate, "fit_efficiency", spy)
    table = leave_one_model_out(sets, get_gpu)
    # one fit per held-out model, each on exactly the other models
    assert sorted(map(sorted, seen)) == sorted(sorted(set(MODELS) - {held}) for held in MODELS)
    # every A100 row scored exactly once; exact synthetic data scores ~0
    a100 = [s for s in sets if s.device == "A100-80GB"]
    assert table.meas[("A100-80GB", "all")] == pytest.approx(sum(s.seconds.sum() for s in a100))
    wape = table.wape("A100-80GB")
    assert wape is not None and wape < 0.01
    assert table.wape("H100") is None


def test_leave_one_device_out_scores_only_kernels_the_others_measured() -> None:
    vidur_like = _synthetic("A100-80GB", ("qkv", "norm"), tps=(1,))
    vllm_like = _synthetic("H100", ("qkv", "norm", "add_norm"), tps=(1,))
    table = leave_one_device_out(vidur_like + vllm_like, get_gpu)
    # H100's fused add_norm (its own factor) was never measured on A100: not scored
    assert table.meas.get(("H100", "op:add_norm"), 0.0) == 0.0
    assert table.meas[("H100", "op:norm")] > 0 and table.meas[("H100", "op:qkv")] > 0
    # same true factors on both devices: the transferred fit predicts the held-out device
    for device in ("A100-80GB", "H100"):
        wape = table.wape(device)
        assert wape is not None and wape < 0.02, device


def _gpu() -> GpuSpec:
    return get_gpu("H100")


def test_elementwise_bytes_come_from_l2_while_the_footprint_fits() -> None:
    gpu, eff = _gpu(), TRUE
    b = elementwise_bytes_per_token(get_model("Llama-2-7B"), "norm")
    small = 1.0  # 16 KB: all in L2
    big = 64.0 * gpu.l2_bytes / b  # 64x the L2: 1/128 of the bytes hit
    dram = gpu.mem_bw_bytes_s * eff.elem_vidur_norm_mem
    t_small = float(elementwise_time("norm", b, small, gpu, eff)) - eff.elem_vidur_norm_op_s
    t_big = float(elementwise_time("norm", b, big, gpu, eff)) - eff.elem_vidur_norm_op_s
    assert t_small == pytest.approx(b / (dram * eff.elem_l2_gain))
    assert t_big == pytest.approx(big * b / dram * (1 - (1 - 1 / eff.elem_l2_gain) / 128))


def test_gemm_compute_counts_whole_row_tiles() -> None:
    assert float(gemm_rows(1.0)) == GEMM_TILE_M
    assert float(gemm_rows(float(GEMM_TILE_M + 1))) == 2 * GEMM_TILE_M
    # 129 tokens cost about what 256 do, clearly more than 128 (a second tile of MMA work)
    gpu = _gpu()
    eff = TRUE.updated({"linear_op_s": 1e-9})
    t128, t129, t256 = (linear_time(8192, 8192, m, 2, gpu, eff) for m in (128.0, 129.0, 256.0))
    assert t129 == pytest.approx(t256, rel=0.05)
    assert t129 > 1.25 * t128
