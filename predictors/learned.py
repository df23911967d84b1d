"""LightGBM mechanics shared by the learned predictors: fit, predict, save and load.

One idea: a learned predictor is a feature function plus one LightGBM regressor per target,
trained on the log of the target — or, with a `base` predictor, on the log of the ratio
`target / base` (the trees learn a correction to a physical estimate, which still means something
on a device or model they never saw). Subclasses define `feature_names` and `features(...)`.

Determinism: `deterministic=True`, `num_threads=1`, fixed seeds and column-wise histograms, so
two fits on the same rows give identical trees. A target with no observed rows in the training
set is left unfitted and predicts NaN (a `Prediction` never holds a guess).

Saved form (a folder): `<target>.txt` (LightGBM model text) per fitted target and `meta.json`
(predictor name, feature list, hyper-parameters); loading checks the feature list against the
code's, so a model saved by another feature version fails loudly instead of predicting garbage.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import lightgbm as lgb
import numpy as np
from maserve_prefect.predictors.base import TARGETS, Prediction, Predictor, Shape
from maserve_prefect.predictors.rows import Row

from maserve_prefect.errors import ConfigError

META_FILE = "meta.json"


def saved_meta(meta_path: Path, name: str, feature_names: Sequence[str]) -> dict[str, Any]:
    """A saved predictor's metadata, checked to be `name`'s with this code's feature list.

    Raises:
        ConfigError: another predictor's folder, or features that differ (refit and save).
    """
    meta: dict[str, Any] = json.loads(meta_path.read_text())
    if meta.get("predictor") != name:
        raise ConfigError(
            f"{meta_path}: saved by predictor {meta.get('predictor')!r}, not {name!r}"
        )
    if tuple(meta.get("features", ())) != tuple(feature_names):
        raise ConfigError(
            f"{meta_path}: saved with features {meta.get('features')}, this code computes "
            f"{list(feature_names)}; refit and save again"
        )
    return meta


Item = tuple[str, Shape, str]  # (model, shape, device)


class LightGBMPredictor(ABC):
    """Base class: one LightGBM booster per target over `features(model, shape, device)`.

    Args:
        num_trees: boosting rounds per target.
        learning_rate, num_leaves, min_data_in_leaf: LightGBM's parameters.
        seed: every LightGBM seed.
    """

    name: ClassVar[str] = "learned"
    feature_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        num_trees: int = 300,
        learning_rate: float = 0.05,
        num_leaves: int = 15,
        min_data_in_leaf: int = 5,
        seed: int = 0,
    ) -> None:
        if num_trees < 1:
            raise ConfigError(f"num_trees={num_trees} must be >= 1")
        self.hyper: dict[str, Any] = {
            "num_trees": num_trees,
            "learning_rate": learning_rate,
            "num_leaves": num_leaves,
            "min_data_in_leaf": min_data_in_leaf,
            "seed": seed,
        }
        self.boosters: dict[str, lgb.Booster] = {}

    # --- what subclasses define -------------------------------------------------------------
    @abstractmethod
    def features(self, model: str, shape: Shape, device: str) -> list[float]:
        """The feature vector of one (model, shape, device), in `feature_names` order."""

    def base(self) -> Predictor | None:
        """A physical estimate the trees correct (ratio target), or None (plain log target)."""
        return None

    # --- fitting ------------------------------------------------------------------------------
    def _params(self) -> dict[str, Any]:
        h = self.hyper
        return {
            "objective": "regression",
            "learning_rate": h["learning_rate"],
            "num_leaves": h["num_leaves"],
            "min_data_in_leaf": h["min_data_in_leaf"],
            "min_data_in_bin": 1,
            "seed": h["seed"],
            "bagging_seed": h["seed"],
            "feature_fraction_seed": h["seed"],
            "data_random_seed": h["seed"],
            "deterministic": True,
            "force_col_wise": True,
            "num_threads": 1,
            "verbose": -1,
        }

    def _base_predictions(self, items: Sequence[Item]) -> list[Prediction] | None:
        base = self.base()
        return None if base is None else [base.predict(m, s, d) for m, s, d in items]

    @staticmethod
    def _offsets(base: list[Prediction] | None, n: int, target: str) -> np.ndarray:
        """log(base target) per item, or zeros for a plain log target."""
        if base is None:
            return np.zeros(n)
        return np.log([p.get(target) for p in base])

    def fit(self, rows: Iterable[Row]) -> Self:
        """Fit one booster per target on the rows that observed it (others stay unfitted).

        Raises:
            ConfigError: no row observes any target.
        """
        rows = list(rows)
        self.boosters = {}
        unique = list(dict.fromkeys((r.model, r.shape, r.device) for r in rows))
        features = {item: self.features(*item) for item in unique}
        base_list = self._base_predictions(unique)
        base = None if base_list is None else dict(zip(unique, base_list, strict=True))
        for target in TARGETS:
            chosen = [r for r in rows if r.has(target)]
            if not chosen:
                continue
            items = [(r.model, r.shape, r.device) for r in chosen]
            x = np.array([features[i] for i in items], dtype=np.float64)
            offsets = self._offsets(
                None if base is None else [base[i] for i in items], len(items), target
            )
            y = np.log([r.target(target) for r in chosen]) - offsets
            data = lgb.Dataset(x, y, feature_name=list(self.feature_names), params={"verbose": -1})
            self.boosters[target] = lgb.train(
                self._params(), data, num_boost_round=self.hyper["num_trees"]
            )
        if not self.boosters:
            raise ConfigError(
                f"{self.name}: none of {len(rows)} training rows observes any of {TARGETS}"
            )
        return self

    @property
    def fitted_targets(self) -> tuple[str, ...]:
        return tuple(t for t in TARGETS if t in self.boosters)

    # --- predicting -----------------------------------------------------------------------------
    def predict(self, model: str, shape: Shape, device: str) -> Prediction:
        return self.predict_batch([(model, shape, device)])[0]

    def predict_batch(self, items: Sequence[Item]) -> list[Prediction]:
        """Predictions for many `(model, shape, device)` at once (one booster call per target).

        Raises:
            ConfigError: the predictor was never fitted.
        """
        if not self.boosters:
            raise ConfigError(f"{self.name} predictor is not fitted; call fit(rows) or load()")
        if not items:
            return []
        x = np.array([self.features(*i) for i in items], dtype=np.float64)
        base = self._base_predictions(items)
        out: dict[str, np.ndarray] = {}
        for target in TARGETS:
            booster = self.boosters.get(target)
            if booster is None:
                out[target] = np.full(len(items), math.nan)
                continue
            raw = np.asarray(booster.predict(x), dtype=np.float64)
            out[target] = np.exp(raw + self._offsets(base, len(items), target))
        return [
            Prediction(float(a), float(b), float(c))
            for a, b, c in zip(out["runtime_s"], out["peak_mem_bytes"], out["load_s"], strict=True)
        ]

    # --- persistence ------------------------------------------------------------------------------
    def save(self, folder: Path) -> Path:
        """Write `meta.json` and one LightGBM model text per fitted target; returns the folder."""
        if not self.boosters:
            raise ConfigError(f"{self.name} predictor is not fitted; nothing to save")
        folder.mkdir(parents=True, exist_ok=True)
        for target, booster in self.boosters.items():
            (folder / f"{target}.txt").write_text(booster.model_to_string())
        meta = {
            "predictor": self.name,
            "features": list(self.feature_names),
            "targets": list(self.boosters),
            "hyper": self.hyper,
        }
        (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return folder

    @classmethod
    def load(cls, folder: Path) -> Self:
        """Read a folder written by `save` of the same predictor class.

        Raises:
            ConfigError: missing files, another predictor's folder, or a feature list that
                differs from this code's.
        """
        meta_path = folder / META_FILE
        if not meta_path.is_file():
            raise ConfigError(f"{meta_path} not found; pass a folder written by save()")
        meta = saved_meta(meta_path, cls.name, cls.feature_names)
        obj = cls(**meta["hyper"])
        for target in meta["targets"]:
            path = folder / f"{target}.txt"
            if not path.is_file():
                raise ConfigError(f"{path} not found (listed in {meta_path})")
            obj.boosters[target] = lgb.Booster(model_str=path.read_text())
        return obj
