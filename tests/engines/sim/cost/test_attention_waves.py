"""The attention CTA-wave model: 64-row tiles on RTX PRO 6000, prefill waves, held-out WAPE."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from maserve_prefect.engines.catalog import get_efficiency, get_gpu, get_model
from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.sim.cost.calibrate import leave_one_model_out
from maserve_prefect.engines.sim.cost.profiles import load_profiles
from maserve_prefect.engines.sim.cost.roofline import (
    attention_tile_m,
    prefill_attention_time,
    prefill_attention_time_scalar,
)

PROFILES = Path(__file__).resolve().parents[4] / ".." / "shared" / "data" / "profiles"


def test_tile_rows_follow_the_gpu_family() -> None:
    assert attention_tile_m(get_gpu("RTX PRO 6000")) == 64
    assert attention_tile_m(get_gpu("A100-80GB")) == 128


def test_prefill_time_steps_with_waves_of_64_row_tiles() -> None:
    model, gpu = get_model("Llama-3.1-8B"), get_gpu("RTX PRO 6000")
    eff = get_efficiency("RTX PRO 6000")
    # 32 heads x ceil(chunk / 64) CTAs over 188 SMs: 273 -> 160 CTAs (1 wave), 410 -> 224 (2)
    one, same, two = (
        float(prefill_attention_time(c, 16384.0, model, 1, gpu, eff)) for c in (16.0, 273.0, 410.0)
    )
    assert same == pytest.approx(one, rel=0.02)
    assert two == pytest.approx(2 * one, rel=0.03)


def test_prefill_scalar_matches_vector_on_a_64_row_device() -> None:
    model, gpu = get_model("Qwen3-32B"), get_gpu("RTX PRO 6000")
    eff = get_efficiency("RTX PRO 6000")
    for new, prior in [(2.0, 0.0), (63.0, 5.0), (65.0, 0.0), (410.0, 16384.0), (2048.0, 77.0)]:
        vec = prefill_attention_time(np.array([new]), np.array([prior]), model, 1, gpu, eff)
        assert prefill_attention_time_scalar(new, prior, model, 1, gpu, eff) == float(vec[0])


def test_retired_efficiency_keys_are_ignored_but_unknown_keys_raise() -> None:
    eff = DeviceEfficiency.from_dict({"attn_prefill_mem": 0.1, "linear_mem": 0.7}, "x.yaml")
    assert eff.linear_mem == 0.7
    with pytest.raises(Exception, match="unknown efficiency keys"):
        DeviceEfficiency.from_dict({"attn_prefil_mem": 0.1}, "x.yaml")


@pytest.mark.skipif(not PROFILES.is_dir(), reason="shared profiles not present")
def test_rtx_pro_6000_held_out_model_wape_meets_the_goal() -> None:
    sets = [s for s in load_profiles(PROFILES).sets if s.device == "RTX PRO 6000"]
    table = leave_one_model_out(sets, get_gpu)
    held = table.wape("RTX PRO 6000")
    # measured 5.7 % for both with the prefill-desync term (6.8 % without it)
    assert held is not None and held <= 0.065
    attention = table.wape("RTX PRO 6000", "attention")
    assert attention is not None and attention <= 0.065
