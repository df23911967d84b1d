"""Metrics on hand-computed 4-row examples, leave-one-group-out splits that never leak the
held-out group, and the evaluation loop fitting only on training rows."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
from maserve_prefect.predictors import Prediction, Row, Shape
from maserve_prefect.predictors.evaluate import (
    evaluate,
    group_keys,
    ordering_accuracy,
    score,
    splits,
    wape,
    window_fit,
)
from maserve_prefect.predictors.rows import NAN

from maserve_prefect.errors import ConfigError

TRUE = [2.0, 4.0, 6.0, 8.0]
PRED = [3.0, 3.0, 7.0, 5.0]


def test_wape_by_hand() -> None:
    # |1| + |1| + |1| + |3| = 6 over 20
    assert wape(TRUE, PRED) == pytest.approx(0.3)
    assert wape(TRUE, TRUE) == 0.0
    with pytest.raises(ConfigError):
        wape([0.0, 0.0], [1.0, 1.0])


def test_ordering_accuracy_by_hand() -> None:
    # pairs (0,1) tie in pred -> wrong; (0,2) ok; (0,3) ok; (1,2) ok; (1,3) ok; (2,3) wrong
    assert ordering_accuracy(TRUE, PRED) == pytest.approx(4 / 6)
    # pairs with equal truth do not count: only (0,2), (1,2) are compared, both right
    assert ordering_accuracy([1.0, 1.0, 5.0], [9.0, 0.0, 10.0]) == 1.0
    assert math.isnan(ordering_accuracy([1.0, 1.0], [1.0, 2.0]))


def test_window_fit_by_hand() -> None:
    # median 5: truth <= 5 -> [T, T, F, F]; pred <= 5 -> [T, T, F, T]
    assert window_fit(TRUE, PRED) == pytest.approx(0.75)
    # explicit window 3.5: truth [T, F, F, F]; pred [T, T, F, F]
    assert window_fit(TRUE, PRED, window=3.5) == pytest.approx(0.75)
    assert window_fit(TRUE, [10.0, 10.0, 1.0, 1.0]) == 0.0


def row(model: str, device: str, runtime: float, mem: float = NAN) -> Row:
    return Row(model, device, 1, 16, 16, runtime, mem, NAN, "test")


ROWS = [
    row(m, d, 1.0 + i)
    for i, (m, d) in enumerate(
        (m, d)
        for m in ("Llama-3.1-8B", "Meta-Llama-3-8B", "Qwen3-8B", "Phi-2")
        for d in ("H100", "A100-80GB", "L40S")
    )
]


@pytest.mark.parametrize("kind", ["device", "model"])
def test_held_out_group_never_in_train(kind: str) -> None:
    folds = splits(ROWS, kind)
    assert len(folds) == 3  # 3 devices; 3 architectures (the two Llama-3 8Bs are one)
    for fold in folds:
        train_groups = set(group_keys(list(fold.train), kind))
        test_groups = set(group_keys(list(fold.test), kind))
        assert test_groups == {fold.held_out}
        assert fold.held_out not in train_groups
        assert len(fold.train) + len(fold.test) == len(ROWS)
    assert sorted(r.runtime_s for f in folds for r in f.test) == sorted(r.runtime_s for r in ROWS)


def test_architecture_twins_are_held_out_together() -> None:
    folds = {f.held_out: f for f in splits(ROWS, "model")}
    assert set(folds) == {"Llama-3.1-8B+Meta-Llama-3-8B", "Phi-2", "Qwen3-8B"}
    llama = folds["Llama-3.1-8B+Meta-Llama-3-8B"]
    assert {r.model for r in llama.test} == {"Llama-3.1-8B", "Meta-Llama-3-8B"}
    assert not {r.model for r in llama.train} & {"Llama-3.1-8B", "Meta-Llama-3-8B"}
    with pytest.raises(ConfigError, match="split kind"):
        splits(ROWS, "phase")


class MeanOfTrain:
    """Predicts the mean training runtime; remembers what it was fitted on."""

    name = "mean"
    seen: ClassVar[list[set[str]]] = []

    def fit(self, rows: list[Row]) -> None:
        self.value = sum(r.runtime_s for r in rows) / len(rows)
        MeanOfTrain.seen.append({r.device for r in rows})

    def predict(self, model: str, shape: Shape, device: str) -> Prediction:
        return Prediction(self.value, NAN, NAN)


def test_evaluate_fits_each_fold_on_its_train_rows_only() -> None:
    MeanOfTrain.seen = []
    report = evaluate({"mean": MeanOfTrain}, ROWS, kinds=("device",))
    assert MeanOfTrain.seen == [{"H100", "L40S"}, {"A100-80GB", "L40S"}, {"A100-80GB", "H100"}]
    folds = report["device"]["mean"]["folds"]
    # A100 rows are runtimes 2, 5, 8, 11; trained on the other 8 rows (mean 6.5)
    assert folds["A100-80GB"]["runtime_s"]["wape"] == pytest.approx((4.5 + 1.5 + 1.5 + 4.5) / 26)
    pooled = report["device"]["mean"]["pooled"]
    assert pooled["runtime_s"]["num_rows"] == 12
    assert pooled["peak_mem_bytes"]["num_rows"] == 0  # never observed: skipped, not scored


def test_score_skips_unobserved_targets_and_unpredicted_rows() -> None:
    rows = [row("Qwen3-8B", "H100", 2.0, mem=10.0), row("Qwen3-8B", "H100", 4.0)]
    preds = [Prediction(3.0, NAN, 1.0), Prediction(4.0, 5.0, 1.0)]
    s = score(rows, preds)
    assert s["runtime_s"]["wape"] == pytest.approx(1 / 6)
    assert s["peak_mem_bytes"] == {"num_rows": 0, "num_unpredicted": 1}
    assert s["load_s"]["num_rows"] == 0


def test_config_split_deals_every_row_into_one_of_five_seeded_folds() -> None:
    folds = splits(ROWS, "config")
    assert [f.held_out for f in folds] == [f"fold {k}" for k in range(5)]
    tested = [r for f in folds for r in f.test]
    assert sorted(tested, key=repr) == sorted(ROWS, key=repr)  # each row tested exactly once
    for f in folds:
        assert len(f.train) + len(f.test) == len(ROWS) and not set(f.train) & set(f.test)
    assert group_keys(ROWS, "config") == group_keys(list(ROWS), "config")
