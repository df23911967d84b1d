"""Scoring predictors the way a planner would feel them, on groups they never saw.

One idea: every figure comes from a held-out split — all rows of one device (or one model
architecture) are the test set, the learned predictors are fitted on the remaining rows only, and
each group takes its turn; the metrics pool every row's held-out prediction. A third kind,
`config`, is the paper's protocol (§4.4: a test set of held-out configurations): rows are dealt
at random (seed 0) into `NUM_CONFIG_FOLDS` folds, so the model and device of a test row have
usually been seen with other shapes. Metrics (the paper's, §4.4):

- WAPE = Σ|pred − true| / Σ|true| per target (runtime, peak memory, load time);
- ordering accuracy: over pairs of test rows with different true runtimes, the fraction the
  prediction orders the same way (a tie in the prediction counts as wrong) — what a scheduler
  choosing the shorter job needs;
- window fit at the median: with the window at the true median runtime, the fraction of rows
  where "predicted ≤ window" equals "true ≤ window" — what a deadline check needs.

As in the paper, the window is one number, the median measured runtime of all held-out rows
(pooled over folds), and ordering compares pairs drawn from all held-out rows. The paper does not
say how it treats ties; here equal truths are not a pair and a tied prediction is wrong.

A target a row did not observe (NaN) is skipped for that target, and so is a prediction a
predictor could not make (NaN: e.g. a learned target with no training rows in that fold).

Model groups are architectures: catalog models with identical layer shapes (Llama-3.1-8B and
Meta-Llama-3-8B differ only in context length) are held out together, so a "held-out model"
never has its twin in training.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from maserve_prefect.predictors.base import TARGETS, Prediction, Predictor
from maserve_prefect.predictors.rows import Row

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.errors import ConfigError

SPLIT_KINDS = ("device", "model")
"""The split kinds suites score (held-out groups)."""
ALL_SPLIT_KINDS = (*SPLIT_KINDS, "config")
"""Plus the paper's random held-out configurations (`benchmarks/predictor_eval.py`)."""
NUM_CONFIG_FOLDS = 5
_PAIR_BLOCK = 512


def wape(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Σ|pred − true| / Σ|true|.

    Examples:
        >>> wape([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 3.0, 2.0])
        0.3
    """
    t, p = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    den = float(np.abs(t).sum())
    if den == 0:
        raise ConfigError("WAPE of an all-zero truth is undefined")
    return float(np.abs(p - t).sum() / den)


def ordering_accuracy(y_true: Sequence[float], y_pred: Sequence[float]) -> float:
    """Fraction of pairs with different truth that the prediction orders the same way.

    Examples:
        >>> ordering_accuracy([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0])
        0.8333333333333334
    """
    t, p = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    num_pairs = num_right = 0
    for lo in range(0, len(t), _PAIR_BLOCK):  # blocks of rows keep memory O(block * n)
        hi = min(lo + _PAIR_BLOCK, len(t))
        dt = t[lo:hi, None] - t[None, :]
        dp = p[lo:hi, None] - p[None, :]
        cols = np.arange(len(t))[None, :]
        rows = np.arange(lo, hi)[:, None]
        counted = (cols > rows) & (dt != 0)
        num_pairs += int(counted.sum())
        num_right += int(((dt * dp) > 0)[counted].sum())
    return num_right / num_pairs if num_pairs else math.nan


def window_fit(
    y_true: Sequence[float], y_pred: Sequence[float], window: float | None = None
) -> float:
    """Fraction of rows where `pred <= window` agrees with `true <= window` (default window:
    the true median).

    Examples:
        >>> window_fit([1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0])  # median 2.5
        0.5
    """
    t, p = np.asarray(y_true, dtype=float), np.asarray(y_pred, dtype=float)
    w = float(np.median(t)) if window is None else window
    return float(np.mean((p <= w) == (t <= w)))


# --- splits -------------------------------------------------------------------------------------


def _arch(model: str) -> tuple[Any, ...]:
    s = get_model(model)
    return (s.hidden_size, s.num_layers, s.num_attention_heads, s.num_kv_heads, s.head_dim,
            s.intermediate_size, s.vocab_size, s.tie_word_embeddings, s.gated_mlp, s.qk_norm,
            s.attention_bias)  # fmt: skip


def group_keys(rows: Sequence[Row], kind: str) -> list[str]:
    """Each row's group under a split kind: its device, its model architecture's name (the
    names of every model in `rows` sharing that architecture, joined by '+'), or for `config`
    a random fold ("fold k": a seed-0 permutation of the rows dealt round-robin).

    Raises:
        ConfigError: an unknown split kind.

    Examples:
        >>> from maserve_prefect.predictors.rows import NAN
        >>> rows = [Row("Phi-2", "H100", b, 8, 8, 1.0, NAN, NAN, "x") for b in range(1, 11)]
        >>> sorted(group_keys(rows, "config")).count("fold 0")
        2
    """
    if kind == "config":
        order = np.random.default_rng(0).permutation(len(rows))
        keys = [""] * len(rows)
        for rank, i in enumerate(order):
            keys[int(i)] = f"fold {rank % NUM_CONFIG_FOLDS}"
        return keys
    if kind == "device":
        return [get_gpu(r.device).name for r in rows]
    if kind != "model":
        raise ConfigError(f"unknown split kind {kind!r}; expected one of {ALL_SPLIT_KINDS}")
    names: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    for r in rows:
        names[_arch(r.model)].add(get_model(r.model).name)
    label = {arch: "+".join(sorted(n)) for arch, n in names.items()}
    return [label[_arch(r.model)] for r in rows]


@dataclass(frozen=True, slots=True)
class Split:
    """One fold: `test` is every row of group `held_out`, `train` every other row."""

    kind: str
    held_out: str
    train: tuple[Row, ...]
    test: tuple[Row, ...]


def splits(rows: Sequence[Row], kind: str) -> list[Split]:
    """Leave-one-group-out folds (groups in sorted order); a single group yields no fold.

    Examples:
        >>> from maserve_prefect.predictors.rows import NAN
        >>> rows = [Row(m, d, 1, 8, 8, 1.0, NAN, NAN, "x")
        ...         for m in ("Qwen3-8B", "Phi-2") for d in ("H100", "L40S")]
        >>> [(s.held_out, len(s.train), len(s.test)) for s in splits(rows, "device")]
        [('H100', 2, 2), ('L40S', 2, 2)]
    """
    keys = group_keys(rows, kind)
    groups = sorted(set(keys))
    if len(groups) < 2:
        return []
    return [
        Split(
            kind,
            g,
            tuple(r for r, k in zip(rows, keys, strict=True) if k != g),
            tuple(r for r, k in zip(rows, keys, strict=True) if k == g),
        )
        for g in groups
    ]


# --- evaluation ---------------------------------------------------------------------------------

Factory = Callable[[], Predictor]


def predict_rows(predictor: Predictor, rows: Sequence[Row]) -> list[Prediction]:
    """Predictions for `rows` (batched when the predictor offers `predict_batch`)."""
    batch_fn = getattr(predictor, "predict_batch", None)
    items = [(r.model, r.shape, r.device) for r in rows]
    if callable(batch_fn):
        return list(batch_fn(items))
    return [predictor.predict(m, s, d) for m, s, d in items]


def score(rows: Sequence[Row], preds: Sequence[Prediction]) -> dict[str, Any]:
    """Every metric over rows that observed the target and got a finite prediction."""
    out: dict[str, Any] = {"num_rows": len(rows)}
    for target in TARGETS:
        pairs = [
            (r.target(target), p.get(target))
            for r, p in zip(rows, preds, strict=True)
            if r.has(target)
        ]
        usable = [(t, p) for t, p in pairs if math.isfinite(p)]
        entry: dict[str, Any] = {
            "num_rows": len(usable),
            "num_unpredicted": len(pairs) - len(usable),
        }
        if usable:
            t, p = [u[0] for u in usable], [u[1] for u in usable]
            entry["wape"] = wape(t, p)
            if target == "runtime_s":
                entry["ordering_accuracy"] = ordering_accuracy(t, p)
                entry["window_fit_median"] = window_fit(t, p)
        out[target] = entry
    return out


def evaluate(
    factories: dict[str, Factory], rows: Sequence[Row], kinds: Sequence[str] = SPLIT_KINDS
) -> dict[str, Any]:
    """Held-out scores of every predictor under every split kind.

    Each factory builds a fresh predictor per fold; one with a `fit` method is fitted on the
    fold's training rows only. Returns `{kind: {predictor: {"pooled": score, "folds":
    {group: score}}}}`.
    """
    report: dict[str, Any] = {}
    for kind in kinds:
        folds = splits(rows, kind)
        per_kind: dict[str, Any] = {}
        for name, factory in factories.items():
            all_rows: list[Row] = []
            all_preds: list[Prediction] = []
            per_fold: dict[str, Any] = {}
            for split in folds:
                predictor = factory()
                fit = getattr(predictor, "fit", None)
                if callable(fit):
                    fit(split.train)
                preds = predict_rows(predictor, split.test)
                per_fold[split.held_out] = score(split.test, preds)
                all_rows += split.test
                all_preds += preds
            per_kind[name] = {"pooled": score(all_rows, all_preds), "folds": per_fold}
        report[kind] = per_kind
    return report
