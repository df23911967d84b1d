"""The predictor seam: what a request costs on a device, whoever predicts it.

One idea: a predictor maps `(model, Shape, device)` to a `Prediction` of three numbers —
runtime of the whole request batch (prefill + decode), peak device memory, and the time to load
the model onto the device — so a planner can swap the roofline formula, a scalar LightGBM or the
operator-graph LightGBM without changing a line. Models and devices are catalog names
(`engine/catalog`); shapes are plain ints.

A `Shape` is a batch of `batch` identical requests submitted together, each with `input_len`
prompt tokens and `output_len` generated tokens. Runtime is seconds from submission until the
last request finishes; memory is bytes (weights + KV cache of the batch + activation peak); load
time is seconds of a cold load (engine init, weights in, compile / graph capture).

The helpers at the bottom build the scalar model/device features both learned predictors share
(`gbdt.py` uses them alone, `graph.py` next to its operator features).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from maserve_prefect.engines.catalog import get_gpu, get_model
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.errors import ConfigError

TARGETS = ("runtime_s", "peak_mem_bytes", "load_s")


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """A batch of `batch` identical requests: `input_len` prompt and `output_len` output tokens.

    Raises:
        ConfigError: a field is below 1.

    Examples:
        >>> Shape(4, 512, 128).num_tokens
        2560
    """

    batch: int
    input_len: int
    output_len: int

    def __post_init__(self) -> None:
        for name in ("batch", "input_len", "output_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"Shape.{name}={value!r} must be an int >= 1")

    @property
    def num_tokens(self) -> int:
        """Tokens the batch holds at its end: `batch * (input_len + output_len)`."""
        return self.batch * (self.input_len + self.output_len)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted cost of one shape on one device; NaN where a predictor has no estimate.

    Examples:
        >>> Prediction(1.5, 2e9, 30.0).get("load_s")
        30.0
    """

    runtime_s: float
    peak_mem_bytes: float
    load_s: float

    def get(self, target: str) -> float:
        """The value of `target` (one of `TARGETS`)."""
        if target not in TARGETS:
            raise ConfigError(f"unknown target {target!r}; expected one of {TARGETS}")
        value: float = getattr(self, target)
        return value


@runtime_checkable
class Predictor(Protocol):
    """Anything that predicts `Prediction`s; `name` labels it in tables and saved files."""

    name: str

    def predict(self, model: str, shape: Shape, device: str) -> Prediction:
        """Predicted runtime, peak memory and load time of `shape` for `model` on `device`."""
        ...


# --- features shared by the learned predictors ---------------------------------------------------


def _log(x: float) -> float:
    return math.log(max(x, 1e-30))


MODEL_FEATURES = (
    "log_params",
    "log_weight_bytes",
    "num_layers",
    "hidden_size",
    "log_kv_bytes_per_token",
)
DEVICE_FEATURES = (
    "log_mem_bw",
    "log_peak_flops",
    "log_memory_bytes",
    "log_host_link",
    "log_ridge_flops_per_byte",
)
SHAPE_FEATURES = ("log_batch", "log_input_len", "log_output_len")


def model_features(spec: ModelSpec) -> list[float]:
    """Scalar size features of a model (ordered as `MODEL_FEATURES`)."""
    return [
        _log(spec.num_params),
        _log(spec.weight_bytes),
        float(spec.num_layers),
        float(spec.hidden_size),
        _log(spec.kv_bytes_per_token),
    ]


def device_features(gpu: GpuSpec) -> list[float]:
    """Datasheet features of a device (ordered as `DEVICE_FEATURES`)."""
    return [
        _log(gpu.mem_bw_bytes_s),
        _log(gpu.peak_flops),
        _log(gpu.memory_bytes),
        _log(gpu.host_link_bytes_s),
        _log(gpu.peak_flops / gpu.mem_bw_bytes_s),
    ]


def shape_features(shape: Shape) -> list[float]:
    """Log sizes of a shape (ordered as `SHAPE_FEATURES`)."""
    return [_log(shape.batch), _log(shape.input_len), _log(shape.output_len)]


def resolve(model: str, device: str) -> tuple[ModelSpec, GpuSpec]:
    """Catalog lookups with the catalog's own errors (unknown names list the known ones)."""
    return get_model(model), get_gpu(device)
