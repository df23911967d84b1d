"""A request batch's operator data-flow graph: nodes with work features, edges along tensors.

One idea: the paper's Predictor (§3.3) reads a model as an operator graph — nodes carry operator
type, arithmetic work, parameter size and tensor shapes; edges are tensor dependencies — and
pairs it with request and device context. Here the graph is the decoder layer vLLM runs,
written once with its repeat count (`num_layers`) as a node feature, between the once-per-step
operators:

    embedding → add_norm_attn → qkv → [qk_norm →] rope → attention → o → add_norm_mlp
              → gate_up → act → down → final_norm → lm_head

plus the tensors that skip ahead: V goes from `qkv` straight to `attention` (only Q and K are
normalized and rotated), the residual stream runs `add_norm_attn → add_norm_mlp → final_norm`,
and the layer repeats (`down → add_norm_attn` and `add_norm_mlp → add_norm_attn` carry one
layer's output into the next, a cycle in the collapsed graph). `qk_norm` exists only for models
that have it (Qwen3), so graphs differ in structure, not only in numbers.

Node features (per node): operator-type one-hot; log repeat count; log parameter bytes; the
GEMM's log in / out widths (0 for other types); and, per phase (prefill, decode), the log of
FLOPs, bytes and roofline seconds summed over the batch's engine steps and the node's repeats,
the node's share of that phase's roofline time, and log(compute time / memory time) on this
device (how far into the compute- or bandwidth-bound regime the operator sits). The numbers come from
`opgraph.request_graph` (the formula's own accounting on this device): GEMMs, attention and
lm_head per type; the lumped elementwise total is split over its operators by the bytes each
moves per token (all are bandwidth-bound and scale with the step's tokens, so the split is
exact). Context: request shape, model size (weights, KV of the batch, the formula's peak
memory), and the roofline totals per phase and step counts.

The device enters only through these roofline figures, not as raw datasheet numbers (bandwidth,
FLOPS, memory): the measured rows cover three devices, and a network fitted on two of them
extrapolates linearly along raw datasheet axes to the third (held-out-device runtime WAPE 14 %
with them in the context, 7 % without, at the time of writing). This is a deliberate departure
from the paper, whose device features are part of the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from maserve_prefect.predictors.base import SHAPE_FEATURES, Shape, shape_features
from maserve_prefect.predictors.formula import peak_memory_bytes
from maserve_prefect.predictors.mpnn import Graph
from maserve_prefect.predictors.opgraph import PHASES, RequestGraph, request_graph

from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec
from maserve_prefect.engines.sim.cost.roofline import elementwise_bytes_per_token

NODE_KINDS = (
    "embedding", "add_norm_attn", "qkv", "qk_norm", "rope", "attention", "o", "add_norm_mlp",
    "gate_up", "act", "down", "final_norm", "lm_head",
)  # fmt: skip
_GEMMS = ("qkv", "o", "gate_up", "down")
# elementwise node -> (roofline operator it moves bytes as, once per layer?)
_ELEMENTWISE = {
    "embedding": ("embedding", False),
    "add_norm_attn": ("add_norm", True),
    "qk_norm": ("qk_norm", True),
    "rope": ("rope", True),
    "add_norm_mlp": ("add_norm", True),
    "act": ("act", True),
    "final_norm": ("add_norm", False),
}
_EDGES = (
    ("embedding", "add_norm_attn"), ("add_norm_attn", "qkv"), ("qkv", "qk_norm"),
    ("qk_norm", "rope"), ("qkv", "rope"),  # the latter only without qk_norm
    ("rope", "attention"), ("qkv", "attention"),
    ("attention", "o"), ("o", "add_norm_mlp"), ("add_norm_attn", "add_norm_mlp"),
    ("add_norm_mlp", "gate_up"), ("gate_up", "act"), ("act", "down"),
    ("down", "add_norm_attn"), ("add_norm_mlp", "add_norm_attn"),  # into the next layer
    ("down", "final_norm"), ("add_norm_mlp", "final_norm"), ("final_norm", "lm_head"),
)  # fmt: skip

NODE_FEATURES = (
    *(f"is_{k}" for k in NODE_KINDS),
    "log_repeats",
    "log_param_bytes",
    "log_in_width",
    "log_out_width",
    *(
        f"{ph}_{q}"
        for ph in PHASES
        for q in ("log_flops", "log_bytes", "log_time", "time_share", "log_compute_over_memory")
    ),
)
CONTEXT_FEATURES = (
    *SHAPE_FEATURES,
    "log_weight_bytes",
    "log_kv_bytes",
    "log_formula_mem_bytes",
    "log_t_prefill",
    "log_t_decode",
    "log_prefill_steps",
    "log_decode_steps",
)


def _log(x: float, floor: float = 1e-12) -> float:
    return math.log(max(x, floor))


@dataclass(frozen=True, slots=True)
class OperatorGraph:
    """Node kinds, the `Graph` the network reads, and the roofline totals it came from."""

    kinds: tuple[str, ...]
    graph: Graph
    totals: RequestGraph


def _node_work(
    kind: str, phase: str, model: ModelSpec, rg: RequestGraph, elem_total_per_token: float
) -> tuple[float, float, float]:
    """(FLOPs, bytes, roofline seconds) of node `kind` in `phase`, over steps and repeats."""
    if kind in _GEMMS or kind == "lm_head":
        t = rg.get(phase, kind)
        return t.flops, t.bytes, t.time_s
    if kind == "attention":
        t = rg.get(phase, "attn_prefill" if phase == "prefill" else "attn_decode")
        return t.flops, t.bytes, t.time_s
    op, per_layer = _ELEMENTWISE[kind]
    share = elementwise_bytes_per_token(model, op) * (model.num_layers if per_layer else 1)
    t = rg.get(phase, "elementwise")
    frac = share / elem_total_per_token
    return 0.0, t.bytes * frac, t.time_s * frac


def operator_graph(model: ModelSpec, gpu: GpuSpec, shape: Shape) -> OperatorGraph:
    """The data-flow graph of `shape` for `model` on `gpu` (module docstring).

    Examples:
        >>> from maserve_prefect.engines.catalog import get_gpu, get_model
        >>> og = operator_graph(get_model("Qwen3-8B"), get_gpu("H100"), Shape(1, 512, 64))
        >>> len(og.kinds), og.graph.node_x.shape[1] == len(NODE_FEATURES)
        (13, True)
        >>> len(operator_graph(get_model("Llama-2-7B"), get_gpu("H100"), Shape(1, 8, 8)).kinds)
        12
    """
    rg = request_graph(model, gpu, shape)
    kinds = tuple(k for k in NODE_KINDS if k != "qk_norm" or model.qk_norm)
    index = {k: i for i, k in enumerate(kinds)}
    gemms = {g.name: g for g in model.layer_gemms(1)}
    d = model.dtype_bytes
    elem_total = sum(
        elementwise_bytes_per_token(model, op) * (model.num_layers if per_layer else 1)
        for kind, (op, per_layer) in _ELEMENTWISE.items()
        if kind in index
    )
    phase_time = {ph: rg.time_s(ph) for ph in PHASES}
    rows = []
    for kind in kinds:
        repeats = 1 if kind in ("embedding", "final_norm", "lm_head") else model.num_layers
        one_hot = [1.0 if kind == k else 0.0 for k in NODE_KINDS]
        if kind in gemms:
            width_in, width_out = gemms[kind].in_dim, gemms[kind].out_dim
        elif kind == "lm_head":
            width_in, width_out = model.hidden_size, model.vocab_size
        else:
            width_in = width_out = 0
        params = width_in * width_out * d * repeats
        row = [*one_hot, math.log(repeats), math.log1p(params), math.log1p(width_in),
               math.log1p(width_out)]  # fmt: skip
        for phase in PHASES:
            flops, nbytes, t = _node_work(kind, phase, model, rg, elem_total)
            share = t / phase_time[phase] if phase_time[phase] > 0 else 0.0
            bound = (flops / gpu.peak_flops + 1e-12) / (nbytes / gpu.mem_bw_bytes_s + 1e-12)
            row += [math.log1p(flops), math.log1p(nbytes), _log(t, 1e-9), share, math.log(bound)]
        rows.append(row)
    edges = tuple(
        (index[a], index[b])
        for a, b in _EDGES
        if a in index and b in index and not ((a, b) == ("qkv", "rope") and "qk_norm" in index)
    )
    ctx = shape_features(shape)
    ctx += [
        _log(model.weight_bytes),
        _log(model.kv_bytes_per_token * shape.num_tokens),
        _log(peak_memory_bytes(model, gpu, shape)),
        _log(phase_time["prefill"], 1e-9),
        _log(phase_time["decode"], 1e-9),
        _log(rg.num_prefill_steps),
        _log(rg.num_decode_steps + 1),
    ]
    graph = Graph(np.array(rows, dtype=np.float64), edges, np.array(ctx, dtype=np.float64))
    return OperatorGraph(kinds, graph, rg)
