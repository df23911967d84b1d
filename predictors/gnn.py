"""`GNNPredictor`: a message-passing network over the operator graph — the paper's §3.3 Predictor.

One idea: encode the request's operator data-flow graph (`dataflow.operator_graph`: one node
per operator of the decoder layer and of the step, edges along tensors) with a few rounds of
message passing, pool it, join the request and device context, and let one small head per
target (runtime, peak memory, load time) predict `log(target / formula)` — the log ratio to the
roofline formula, as the graph LightGBM does, so an unseen device or model still starts from its
own physics and the network learns how real kernels depart from it. The network is
`mpnn.MessagePassingRegressor` (numpy + scipy.sparse, hand-written backprop, Adam, fixed seed):
by default three rounds of 16 hidden units, 16-unit heads, 500 full-batch epochs at learning
rate 0.01 (about 4k parameters; a few seconds per fit on the project's training rows on one
core — `benchmarks/predictor_eval.py` prints the time).

Heads share the encoder and are trained jointly; a target a row did not observe (NaN) adds
nothing to the loss, and a target no training row observed is left unfitted and predicts NaN.

Saved form (a folder): `meta.json` (predictor name, node and context feature lists, targets,
hyper-parameters, network settings) and `weights.npz` (parameters and standardization, float64);
loading checks the feature lists, as the LightGBM predictors do.

Examples:
    >>> from maserve_prefect.predictors.rows import Row
    >>> rows = [Row("Qwen3-8B", "H100", b, 128, 16, 0.02 * b, 2e10 + b, 40.0, "sim")
    ...         for b in (1, 2, 4, 8, 16, 32)]
    >>> p = GNNPredictor(epochs=50).fit(rows)
    >>> 0 < p.predict("Qwen3-8B", Shape(4, 128, 16), "A100-80GB").runtime_s
    True
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
from maserve_prefect.predictors.base import TARGETS, Prediction, Shape, resolve
from maserve_prefect.predictors.dataflow import CONTEXT_FEATURES, NODE_FEATURES, operator_graph
from maserve_prefect.predictors.formula import FormulaPredictor
from maserve_prefect.predictors.learned import saved_meta
from maserve_prefect.predictors.mpnn import Graph, MessagePassingRegressor, MPNNConfig
from maserve_prefect.predictors.rows import Row

from maserve_prefect.errors import ConfigError

META_FILE = "meta.json"
WEIGHTS_FILE = "weights.npz"
Item = tuple[str, Shape, str]


class GNNPredictor:
    """Message passing over the operator graph, one head per target (module docstring).

    Args:
        hidden, rounds, head_hidden, epochs, learning_rate, weight_decay, seed: the network's
            settings (`mpnn.MPNNConfig`).
    """

    name: ClassVar[str] = "gnn"
    feature_names: ClassVar[tuple[str, ...]] = NODE_FEATURES + CONTEXT_FEATURES

    def __init__(
        self,
        hidden: int = 16,
        rounds: int = 3,
        head_hidden: int = 16,
        epochs: int = 500,
        learning_rate: float = 1e-2,
        weight_decay: float = 1e-3,
        seed: int = 0,
    ) -> None:
        self.config = MPNNConfig(hidden, rounds, head_hidden, epochs, learning_rate,
                                 weight_decay, seed)  # fmt: skip
        self.hyper: dict[str, Any] = {
            "hidden": hidden,
            "rounds": rounds,
            "head_hidden": head_hidden,
            "epochs": epochs,
            "learning_rate": learning_rate,
            "weight_decay": weight_decay,
            "seed": seed,
        }
        self.net: MessagePassingRegressor | None = None
        self.targets: tuple[str, ...] = ()
        self._formula = FormulaPredictor()

    # --- inputs -----------------------------------------------------------------------------
    def graph(self, model: str, shape: Shape, device: str) -> Graph:
        """The network's input for one `(model, shape, device)`."""
        spec, gpu = resolve(model, device)
        return operator_graph(spec, gpu, shape).graph

    def _offsets(self, items: Sequence[Item]) -> np.ndarray:
        """log of the formula's estimate, [items, TARGETS]."""
        preds = [self._formula.predict(*i) for i in items]
        return np.log([[p.get(t) for t in TARGETS] for p in preds])

    # --- fitting ----------------------------------------------------------------------------
    def fit(self, rows: Iterable[Row]) -> Self:
        """Fit on every row; targets no row observes stay unfitted.

        Raises:
            ConfigError: no row observes any target.
        """
        rows = list(rows)
        observed = [t for t in TARGETS if any(r.has(t) for r in rows)]
        if not observed:
            raise ConfigError(
                f"{self.name}: none of {len(rows)} training rows observes any of {TARGETS}"
            )
        items = [(r.model, r.shape, r.device) for r in rows]
        cache = {i: self.graph(*i) for i in dict.fromkeys(items)}
        offsets = self._offsets(items)
        cols = [TARGETS.index(t) for t in observed]
        y = np.array(
            [[math.log(r.target(t)) if r.has(t) else math.nan for t in observed] for r in rows]
        )
        y = y - offsets[:, cols]
        self.net = MessagePassingRegressor(self.config).fit([cache[i] for i in items], y)
        self.targets = tuple(observed)
        return self

    @property
    def fitted_targets(self) -> tuple[str, ...]:
        return self.targets

    # --- predicting -------------------------------------------------------------------------
    def predict(self, model: str, shape: Shape, device: str) -> Prediction:
        return self.predict_batch([(model, shape, device)])[0]

    def predict_batch(self, items: Sequence[Item]) -> list[Prediction]:
        """Predictions for many `(model, shape, device)` in one forward pass.

        Raises:
            ConfigError: the predictor was never fitted.
        """
        if self.net is None:
            raise ConfigError(f"{self.name} predictor is not fitted; call fit(rows) or load()")
        if not items:
            return []
        raw = self.net.predict([self.graph(*i) for i in items])
        offsets = self._offsets(items)
        out = np.full((len(items), len(TARGETS)), math.nan)
        for k, t in enumerate(self.targets):
            j = TARGETS.index(t)
            out[:, j] = np.exp(raw[:, k] + offsets[:, j])
        return [Prediction(float(a), float(b), float(c)) for a, b, c in out]

    # --- persistence ------------------------------------------------------------------------
    def save(self, folder: Path) -> Path:
        """Write `meta.json` and `weights.npz`; returns the folder."""
        if self.net is None:
            raise ConfigError(f"{self.name} predictor is not fitted; nothing to save")
        folder.mkdir(parents=True, exist_ok=True)
        net_meta, arrays = self.net.state()
        np.savez(folder / WEIGHTS_FILE, **arrays)
        meta = {
            "predictor": self.name,
            "features": list(self.feature_names),
            "targets": list(self.targets),
            "hyper": self.hyper,
            "network": net_meta,
        }
        (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return folder

    @classmethod
    def load(cls, folder: Path) -> Self:
        """Read a folder written by `save`.

        Raises:
            ConfigError: missing files, another predictor's folder, or other feature lists.
        """
        meta_path, weights = folder / META_FILE, folder / WEIGHTS_FILE
        if not meta_path.is_file() or not weights.is_file():
            raise ConfigError(f"{folder}: {META_FILE} or {WEIGHTS_FILE} missing; save() first")
        meta = saved_meta(meta_path, cls.name, cls.feature_names)
        obj = cls(**meta["hyper"])
        with np.load(weights, allow_pickle=False) as data:
            arrays = {k: np.array(data[k]) for k in data.files}
        obj.net = MessagePassingRegressor.from_state(meta["network"], arrays)
        obj.targets = tuple(meta["targets"])
        return obj
