"""Mixed-step attention: a prefill's CTAs shift the decode waves out of step and cost the GQA
sibling heads their shared reads; the two bounds meet in a smooth max; the fit recovers the
desync scale from exact synthetic profiles."""

from __future__ import annotations

import numpy as np
import pytest

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.sim.cost.calibrate import fit_efficiency, predict
from maserve_prefect.engines.sim.cost.profiles import ProfileSet
from maserve_prefect.engines.sim.cost.roofline import (
    MIXED_MAX_POWER,
    mixed_attention_time,
    smooth_max,
)

RTX = get_gpu("RTX PRO 6000")
LLAMA = get_model("Llama-3.1-8B")
EFF = DeviceEfficiency(attn_desync_bytes=1.5e8)


def _layer(prior: float, chunk: float, ctas: float, n: float = 64.0, ctx: float = 16384.0) -> float:
    """One layer's mixed attention for `n` decodes of `ctx` with a chunk over `prior` keys
    (the prefill's own time left out, so only the decodes' part is compared)."""
    return float(
        mixed_attention_time(n, n * ctx, 0.0, 0.0, LLAMA, 1, RTX, EFF, ctas, prior + chunk)
    )


def test_a_prefill_as_long_as_the_decodes_shifts_nothing() -> None:
    unshifted = _layer(0.0, 0.0, 0.0)
    # prior + chunk = the decodes' context: every SM is a whole pass ahead, still in step
    assert _layer(16384.0 - 640.0, 640.0, 320.0) == pytest.approx(unshifted, rel=1e-6)
    # a short prefill (a few hundred keys of a 16 k pass) shifts too little to matter
    assert _layer(0.0, 256.0, 128.0) == pytest.approx(unshifted, rel=0.01)


def test_a_quarter_pass_shift_loses_the_sibling_reads_on_the_sms_it_touched() -> None:
    unshifted = _layer(0.0, 0.0, 0.0)
    one_tile = _layer(4000.0, 64.0, 32.0)  # 32 heads x 1 tile: 32 of 188 SMs shifted
    many_tiles = _layer(4000.0, 640.0, 320.0)  # every SM shifted
    assert unshifted < one_tile < many_tiles
    # all sharing lost: each of the 4 sibling query heads re-reads its KV head's bytes, so the
    # DRAM bound reaches (1 + 3 * (1 - 0)) / (1 + 3 * (1 - hit)) times the unshifted one
    assert many_tiles / unshifted == pytest.approx(1.7, abs=0.25)
    assert many_tiles / unshifted < 4.0


def test_smooth_max_takes_the_larger_bound_and_rounds_the_corner() -> None:
    assert float(smooth_max(1.0, 0.0)) == 1.0
    assert float(smooth_max(1.0, 0.2)) == pytest.approx(1.0, rel=1e-6)
    assert float(smooth_max(1.0, 1.0)) == pytest.approx(2.0 ** (1.0 / MIXED_MAX_POWER))
    # a prefill-only step costs exactly its prefill chunks
    only = mixed_attention_time(0.0, 0.0, 3e-4, 0.0, LLAMA, 1, RTX, EFF, 64.0, 2048.0)
    assert float(only) == pytest.approx(3e-4, rel=1e-12)


def _attention_rows() -> np.ndarray:
    """(chunk, prior, n_decode, ctx) rows over the shift's range, with decode-only rows."""
    rows = [
        (chunk, prior, n, ctx)
        for chunk in (16.0, 128.0, 640.0, 1384.0)
        for prior in (0.0, 1024.0, 2592.0, 3888.0, 5832.0, 8748.0, 16384.0)
        for n in (16.0, 64.0, 128.0)
        for ctx in (1024.0, 4096.0, 16384.0)
    ]
    rows += [(0.0, 0.0, n, ctx) for n in (1.0, 16.0, 64.0) for ctx in (512.0, 4096.0)]
    return np.array(rows, dtype=np.float64)


def test_fit_recovers_the_desync_scale_from_exact_profiles() -> None:
    truth = DeviceEfficiency(attn_desync_bytes=4e8)
    sets = []
    for name in ("Llama-3.1-8B", "Qwen3-32B"):
        x = _attention_rows()
        ps = ProfileSet("RTX PRO 6000", get_model(name), 1, "attention", x, x[:, 0], "synthetic")
        ps.seconds = predict(ps, RTX, truth)
        sets.append(ps)
    # start every other factor at the truth and the desync scale 2x off
    fitted = fit_efficiency(sets, get_gpu, base=truth.updated({"attn_desync_bytes": 2e8}))
    assert fitted.attn_desync_bytes == pytest.approx(4e8, rel=0.02)
    for ps in sets:
        np.testing.assert_allclose(predict(ps, RTX, fitted), ps.seconds, rtol=1e-3)
