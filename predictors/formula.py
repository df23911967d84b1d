"""`FormulaPredictor`: the roofline baseline, built from catalog facts only.

One idea: nothing here is fitted. Runtime is the sum over the batch's engine steps of every
operator's `max(FLOPs / peak FLOPS, bytes / bandwidth)` on the datasheet peaks
(`opgraph.request_graph`: chunked prefill, then decode steps whose KV reads grow one token at a
time). Memory is what the batch holds at its end: weights + KV of `batch * (input + output)`
tokens + the activation peak of the largest step (`catalog.memory.activation_peak_bytes` over
the step's tokens and sequences). Load time is the catalog's cold-load plan
(`catalog.lifecycle.load_plan`: engine init, weights over the source link, compile and CUDA
graph capture — the cited vLLM figures).

What it leaves out, on purpose (the learned predictors may learn it): kernel efficiency below
peak, launch and host overheads per step, and the scheduler interleaving prefill with decode.
"""

from __future__ import annotations

from maserve_prefect.predictors.base import Prediction, Shape, resolve
from maserve_prefect.predictors.opgraph import RequestGraph, request_graph

from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.lifecycle import LifecycleParams, load_plan
from maserve_prefect.engines.catalog.memory import activation_peak_bytes
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.step.scheduler import default_batch_limits


def peak_memory_bytes(model: ModelSpec, gpu: GpuSpec, shape: Shape) -> float:
    """Weights + KV of every token the batch holds at its end + the largest step's activations.

    Examples:
        >>> from maserve_prefect.engines.catalog import get_gpu, get_model
        >>> m = get_model("Qwen3-8B")
        >>> peak_memory_bytes(m, get_gpu("H100"), Shape(1, 100, 10)) > m.weight_bytes
        True
    """
    budget, max_seqs = default_batch_limits(gpu.memory_bytes, gpu.name)
    seqs = min(shape.batch, max_seqs)
    step_tokens = min(budget, shape.batch * shape.input_len)
    kv = model.kv_bytes_per_token * shape.num_tokens
    return float(model.weight_bytes + kv + activation_peak_bytes(model, step_tokens, seqs))


def load_time_s(
    model: ModelSpec, gpu: GpuSpec, source: str = "disk", params: LifecycleParams | None = None
) -> float:
    """Cold-load seconds of the catalog's load plan (KV allocation takes no time there)."""
    return load_plan(model, gpu, 0, source, 1, params).total_s


class FormulaPredictor:
    """Roofline runtime, analytic memory and the catalog load plan (module docstring).

    Args:
        weight_source: where cold loads read weights from ("disk", "host", "network").
        lifecycle: load-time constants (catalog defaults).

    Examples:
        >>> p = FormulaPredictor()
        >>> a = p.predict("Qwen3-8B", Shape(1, 512, 64), "A100-80GB")
        >>> b = p.predict("Qwen3-8B", Shape(1, 512, 64), "H100")
        >>> b.runtime_s < a.runtime_s, 20 < a.load_s < 60
        (True, True)
    """

    name = "formula"

    def __init__(self, weight_source: str = "disk", lifecycle: LifecycleParams | None = None):
        self.weight_source = weight_source
        self.lifecycle = lifecycle

    def graph(self, model: str, shape: Shape, device: str) -> RequestGraph:
        """The operator totals behind the runtime figure."""
        spec, gpu = resolve(model, device)
        return request_graph(spec, gpu, shape)

    def predict(self, model: str, shape: Shape, device: str) -> Prediction:
        spec, gpu = resolve(model, device)
        return Prediction(
            runtime_s=request_graph(spec, gpu, shape).time_s(),
            peak_mem_bytes=peak_memory_bytes(spec, gpu, shape),
            load_s=load_time_s(spec, gpu, self.weight_source, self.lifecycle),
        )
