"""`BucketTable`: predictions precomputed on a bucket grid, so scheduling never runs a model.

One idea: the scheduling path only ever does dict lookups. `BucketTable.build` asks any predictor
once for every (model, device, batch bucket, input bucket, output bucket); afterwards a request
is mapped to the smallest bucket covering each of its sizes and its prediction is read from the
dict. Buckets round up, so a looked-up cost is that of a shape at least as large (a safe side for
memory checks and deadline fits).

Which output length to look up, since it is unknown before a call finishes:

- while planning a running workflow node, the p90 of that node's recent outputs
  (`OutputTracker(node, limit).observe(n)`: a bounded window of the latest observations,
  nearest-rank p90), falling back to the configured output limit before the first observation;
- at admission (the cumulative memory check), always the configured output limit
  (`admission_prediction`), since admitting on a typical length could oversubscribe memory.

A table also answers the pool runtime's `CostModel` protocol (`runtime_s`, `peak_mem_bytes`,
`load_s`; `pool/state.py`), so a plan can use it wherever it takes a cost model.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maserve_prefect.predictors.base import Prediction, Predictor, Shape

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.errors import ConfigError

Key = tuple[str, str, int, int, int]  # (model, device, batch, input, output) buckets


def _check_axis(name: str, values: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(v) for v in values)
    if not out or any(v < 1 for v in out) or any(a >= b for a, b in itertools.pairwise(out)):
        raise ConfigError(f"Buckets.{name}={list(values)} must be strictly increasing ints >= 1")
    return out


@dataclass(frozen=True, slots=True)
class Buckets:
    """Bucket upper bounds per axis (strictly increasing).

    Examples:
        >>> Buckets((1, 8), (512, 2048), (64, 256)).cover(3, 600, 64)
        (8, 2048, 64)
    """

    batch: tuple[int, ...]
    input: tuple[int, ...]
    output: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch", _check_axis("batch", self.batch))
        object.__setattr__(self, "input", _check_axis("input", self.input))
        object.__setattr__(self, "output", _check_axis("output", self.output))

    def shapes(self) -> list[Shape]:
        return [Shape(b, i, o) for b in self.batch for i in self.input for o in self.output]

    def cover(self, batch: int, input_len: int, output_len: int) -> tuple[int, int, int]:
        """The smallest bucket on each axis that covers the value.

        Raises:
            ConfigError: a value exceeds the largest bucket of its axis.
        """
        return (
            _smallest_covering("batch", self.batch, batch),
            _smallest_covering("input", self.input, input_len),
            _smallest_covering("output", self.output, output_len),
        )


def _smallest_covering(axis: str, values: tuple[int, ...], n: int) -> int:
    i = bisect.bisect_left(values, n)
    if i == len(values):
        raise ConfigError(
            f"{axis} {n} exceeds the largest {axis} bucket {values[-1]}; "
            f"rebuild the BucketTable with a larger {axis} bucket"
        )
    return values[i]


class OutputTracker:
    """Recent output lengths of one workflow node and their p90.

    Args:
        node: the node (op template) whose calls are tracked.
        output_limit: the configured `max_tokens`, used until something is observed.
        window: how many of the latest observations count.

    Examples:
        >>> t = OutputTracker("solver", output_limit=1024, window=10)
        >>> t.expected_output()
        1024
        >>> for n in range(1, 21): t.observe(n)
        >>> t.p90(), t.expected_output()
        (19, 19)
    """

    def __init__(self, node: str, output_limit: int, window: int = 64) -> None:
        if output_limit < 1 or window < 1:
            raise ConfigError(f"OutputTracker({node!r}): output_limit and window must be >= 1")
        self.node = node
        self.output_limit = output_limit
        self._recent: deque[int] = deque(maxlen=window)

    def observe(self, num_output_tokens: int) -> None:
        """Record one finished call's output length."""
        if num_output_tokens < 0:
            raise ConfigError(f"{self.node}: output length {num_output_tokens} must be >= 0")
        self._recent.append(num_output_tokens)

    @property
    def num_observed(self) -> int:
        """Observations in the window now."""
        return len(self._recent)

    def p90(self) -> int | None:
        """Nearest-rank 90th percentile of the window, or None before any observation."""
        if not self._recent:
            return None
        ordered = sorted(self._recent)
        return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]

    def expected_output(self) -> int:
        """The p90 (at least 1, at most the limit), else the configured output limit."""
        p = self.p90()
        return self.output_limit if p is None else min(max(p, 1), self.output_limit)


class BucketTable:
    """Predictions for every bucket point, read by dict access (module docstring)."""

    def __init__(self, buckets: Buckets, entries: dict[Key, Prediction], predictor: str) -> None:
        self.buckets = buckets
        self.entries = entries
        self.predictor = predictor
        self._model_names: dict[str, str] = {}
        self._device_names: dict[str, str] = {}

    @classmethod
    def build(
        cls,
        predictor: Predictor,
        models: Sequence[str],
        devices: Sequence[str],
        buckets: Buckets,
    ) -> BucketTable:
        """Ask `predictor` once for every bucket point (batched when it offers `predict_batch`).

        Examples:
            >>> from maserve_prefect.predictors.formula import FormulaPredictor
            >>> b = Buckets((1, 4), (512, 2048), (64, 256))
            >>> t = BucketTable.build(FormulaPredictor(), ["Qwen3-8B"], ["H100"], b)
            >>> len(t.entries)
            8
        """
        items = [
            (get_model(m).name, s, get_gpu(d).name)
            for m in models
            for d in devices
            for s in buckets.shapes()
        ]
        batch_fn = getattr(predictor, "predict_batch", None)
        if callable(batch_fn):
            preds = list(batch_fn(items))
        else:
            preds = [predictor.predict(m, s, d) for m, s, d in items]
        entries = {
            (m, d, s.batch, s.input_len, s.output_len): p
            for (m, s, d), p in zip(items, preds, strict=True)
        }
        return cls(buckets, entries, predictor.name)

    def _names(self, model: str, device: str) -> tuple[str, str]:
        m = self._model_names.get(model)
        if m is None:
            m = self._model_names[model] = get_model(model).name
        d = self._device_names.get(device)
        if d is None:
            d = self._device_names[device] = get_gpu(device).name
        return m, d

    def lookup(
        self, model: str, device: str, batch: int, input_len: int, output_len: int
    ) -> Prediction:
        """The prediction at the smallest buckets covering `batch`, `input_len`, `output_len`.

        Raises:
            ConfigError: the model / device was not built into the table, or a size exceeds
                the largest bucket.
        """
        m, d = self._names(model, device)
        key = (m, d, *self.buckets.cover(batch, input_len, output_len))
        pred = self.entries.get(key)
        if pred is None:
            raise ConfigError(
                f"BucketTable ({self.predictor}) has no entry for {m} on {d}; "
                "build it with that model and device"
            )
        return pred

    def running_prediction(
        self, model: str, device: str, batch: int, input_len: int, tracker: OutputTracker
    ) -> Prediction:
        """Planning-time prediction: the output bucket at the node's recent p90."""
        return self.lookup(model, device, batch, input_len, tracker.expected_output())

    def admission_prediction(
        self, model: str, device: str, batch: int, input_len: int, output_limit: int
    ) -> Prediction:
        """Admission-time prediction: always at the configured output limit."""
        return self.lookup(model, device, batch, input_len, output_limit)

    # --- the pool runtime's CostModel seam (`pool/state.py`) ------------------------------
    def runtime_s(
        self, model: str, device: str, batch: int, input_len: int, output_len: int
    ) -> float:
        return self._finite(self.lookup(model, device, batch, input_len, output_len), "runtime_s")

    def peak_mem_bytes(
        self, model: str, device: str, batch: int, input_len: int, output_len: int
    ) -> int:
        pred = self.lookup(model, device, batch, input_len, output_len)
        return math.ceil(self._finite(pred, "peak_mem_bytes"))

    def load_s(self, model: str, device: str) -> float:
        """Load time does not depend on the shape: read at the smallest bucket."""
        b = self.buckets
        return self._finite(
            self.lookup(model, device, b.batch[0], b.input[0], b.output[0]), "load_s"
        )

    def _finite(self, pred: Prediction, target: str) -> float:
        value = pred.get(target)
        if not math.isfinite(value):
            raise ConfigError(
                f"BucketTable ({self.predictor}) holds no {target} estimate (NaN): its predictor "
                f"was never fitted on rows that observed {target}; rebuild from one that was"
            )
        return value

    # --- persistence ----------------------------------------------------------------------------
    def save(self, path: Path) -> Path:
        """Write the table as JSON (buckets, predictor name, one record per entry)."""
        doc = {
            "predictor": self.predictor,
            "buckets": {"batch": self.buckets.batch, "input": self.buckets.input,
                        "output": self.buckets.output},
            "entries": [[*k, p.runtime_s, p.peak_mem_bytes, p.load_s]
                        for k, p in self.entries.items()],
        }  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))
        return path

    @classmethod
    def load(cls, path: Path) -> BucketTable:
        """Read a table written by `save`.

        Raises:
            ConfigError: the file is not a saved table.
        """
        try:
            doc = json.loads(path.read_text())
            b = doc["buckets"]
            buckets = Buckets(tuple(b["batch"]), tuple(b["input"]), tuple(b["output"]))
            entries = {
                (str(e[0]), str(e[1]), int(e[2]), int(e[3]), int(e[4])): Prediction(
                    float(e[5]), float(e[6]), float(e[7])
                )
                for e in doc["entries"]
            }
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ConfigError(f"{path}: not a saved BucketTable ({exc})") from exc
        return cls(buckets, entries, str(doc.get("predictor", "")))
