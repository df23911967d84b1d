"""A small message-passing graph network in plain numpy: forward, hand-written backprop, Adam.

One idea: a graph regressor is a few rounds of neighbours talking, a pooled summary, and one
small head per target. With node features `x_i`, in-neighbours `N⁻(i)` and out-neighbours
`N⁺(i)` (the edges are directed: tensor dataflow), context `c` (request and device), and
`relu` the rectifier:

    h⁰_i   = relu(W₀ x_i + b₀)
    hᵏ⁺¹_i = hᵏ_i + relu(Wₛᵏ hᵏ_i + Wᵢₙᵏ mean_{j∈N⁻(i)} hᵏ_j + Wₒᵤₜᵏ mean_{j∈N⁺(i)} hᵏ_j + bᵏ)
    z      = [Σ_i hᴷ_i, mean_i hᴷ_i, c]
    ŷ_t    = v_tᵀ relu(V_t z + a_t) + e_t                          one head per target t

Loss: for every target, the mean squared error over the graphs that observed it (a NaN target is
no observation), summed over targets, plus `weight_decay · Σ‖W‖²` on the weight matrices (not
biases). Inputs and targets are standardized with statistics of the training set, which are
stored with the weights; a target that is constant over the training set is predicted as that
constant (no head is trained on it). Training is full-batch Adam (β = 0.9, 0.999) with a cosine learning-rate
decay to 5 % of its start, for a fixed number of epochs — no validation split, no early stop, so
a fit depends only on its rows and its seed (initialization: `numpy.random.default_rng(seed)`,
He-normal). Everything is float64; `loss_and_grads` is exposed so tests compare its gradients
with finite differences.

Library: numpy (dense algebra) and scipy.sparse (the batch's adjacency and pooling matrices);
no autograd framework. A batch is the disjoint union of its graphs: one node matrix, one sparse
block-diagonal adjacency, sparse pooling rows per graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Self

import numpy as np
from scipy import sparse

from maserve_prefect.errors import ConfigError

Array = np.ndarray
Params = dict[str, Array]


@dataclass(frozen=True, slots=True)
class Graph:
    """One input graph: `node_x` (nodes × features), directed `edges` (src, dst), `context`.

    Examples:
        >>> g = Graph(np.ones((3, 2)), ((0, 1), (1, 2)), np.zeros(1))
        >>> g.num_nodes
        3
    """

    node_x: Array
    edges: tuple[tuple[int, int], ...]
    context: Array

    @property
    def num_nodes(self) -> int:
        return int(self.node_x.shape[0])


@dataclass(frozen=True, slots=True)
class MPNNConfig:
    """Sizes and training settings (module docstring)."""

    hidden: int = 16
    rounds: int = 3
    head_hidden: int = 16
    epochs: int = 500
    learning_rate: float = 1e-2
    weight_decay: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "head_hidden", "epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"MPNNConfig.{name}={getattr(self, name)} must be >= 1")
        if self.rounds < 0 or self.learning_rate <= 0 or self.weight_decay < 0:
            raise ConfigError(f"MPNNConfig: bad rounds / learning_rate / weight_decay in {self}")


@dataclass(frozen=True, slots=True)
class Batch:
    """Graphs of a batch as one disjoint union: `x` [V,F] stacks every node; `a_in` / `a_out`
    [V,V] are sparse and row-normalized (mean over in- / out-neighbours, `*_t` their
    transposes); `pool_sum` / `pool_mean` [B,V] sum / average each graph's nodes; `ctx` [B,C]."""

    x: Array
    a_in: sparse.csr_array
    a_out: sparse.csr_array
    a_in_t: sparse.csr_array
    a_out_t: sparse.csr_array
    pool_sum: sparse.csr_array
    pool_mean: sparse.csr_array
    ctx: Array


def _mean_adjacency(rows: list[int], cols: list[int], v: int) -> sparse.csr_array:
    a = sparse.csr_array((np.ones(len(rows)), (rows, cols)), shape=(v, v))
    a.sum_duplicates()
    a.data[:] = 1.0  # a repeated edge counts once
    deg = np.asarray(a.sum(axis=1)).ravel()
    scaled: sparse.csr_array = sparse.csr_array(sparse.diags_array(1.0 / np.maximum(deg, 1.0)) @ a)
    return scaled


def make_batch(graphs: Sequence[Graph]) -> Batch:
    """Stack `graphs` into one `Batch` (features are taken as given, not standardized).

    Raises:
        ConfigError: no graphs, differing feature widths, or an edge naming a missing node.
    """
    if not graphs:
        raise ConfigError("make_batch: no graphs")
    num_f = graphs[0].node_x.shape[1]
    num_c = graphs[0].context.shape[0]
    dst_in: list[int] = []
    src_in: list[int] = []
    graph_of: list[int] = []
    base = 0
    for k, g in enumerate(graphs):
        n = g.num_nodes
        if g.node_x.shape[1] != num_f or g.context.shape[0] != num_c or n < 1:
            raise ConfigError(f"make_batch: graph {k} is empty or has other feature widths")
        for src, dst in g.edges:
            if not (0 <= src < n and 0 <= dst < n):
                raise ConfigError(f"make_batch: graph {k} edge {(src, dst)} outside 0..{n - 1}")
            src_in.append(base + src)
            dst_in.append(base + dst)
        graph_of += [k] * n
        base += n
    v, b = base, len(graphs)
    a_in = _mean_adjacency(dst_in, src_in, v)
    a_out = _mean_adjacency(src_in, dst_in, v)
    ones = np.ones(v)
    pool_sum = sparse.csr_array((ones, (graph_of, np.arange(v))), shape=(b, v))
    counts = np.bincount(graph_of, minlength=b).astype(np.float64)
    pool_mean = sparse.csr_array((ones / counts[graph_of], (graph_of, np.arange(v))), shape=(b, v))
    return Batch(
        np.concatenate([g.node_x for g in graphs], axis=0),
        a_in,
        a_out,
        sparse.csr_array(a_in.T),
        sparse.csr_array(a_out.T),
        pool_sum,
        pool_mean,
        np.stack([g.context for g in graphs]),
    )


def init_params(cfg: MPNNConfig, num_f: int, num_c: int, num_t: int) -> Params:
    """He-normal weights, zero biases, from `default_rng(cfg.seed)`."""
    rng = np.random.default_rng(cfg.seed)
    h, hh = cfg.hidden, cfg.head_hidden

    def he(fan_in: int, *shape: int, gain: float = 1.0) -> Array:
        return rng.normal(0.0, gain * np.sqrt(2.0 / fan_in), size=shape)

    p: Params = {"W0": he(num_f, num_f, h), "b0": np.zeros(h)}
    for k in range(cfg.rounds):
        # three summed inputs, residual update: keep each round's increment small at the start
        for name in ("Ws", "Wi", "Wo"):
            p[f"{name}{k}"] = he(3 * h, h, h, gain=0.5)
        p[f"b{k + 1}"] = np.zeros(h)
    z = 2 * h + num_c
    for t in range(num_t):
        p[f"V{t}"] = he(z, z, hh)
        p[f"a{t}"] = np.zeros(hh)
        p[f"v{t}"] = he(hh, hh, gain=0.5)
        p[f"e{t}"] = np.zeros(1)
    return p


def _relu(u: Array) -> Array:
    return np.maximum(u, 0.0)


def forward(p: Params, batch: Batch, rounds: int, num_t: int) -> tuple[Array, dict[str, Array]]:
    """Outputs [B,T] and what `backward` needs."""
    cache: dict[str, Array] = {}
    u = batch.x @ p["W0"] + p["b0"]
    h = _relu(u)
    cache["U0"] = u
    for k in range(rounds):
        s_in = batch.a_in @ h
        s_out = batch.a_out @ h
        u = h @ p[f"Ws{k}"] + s_in @ p[f"Wi{k}"] + s_out @ p[f"Wo{k}"] + p[f"b{k + 1}"]
        cache[f"H{k}"], cache[f"Sin{k}"], cache[f"Sout{k}"], cache[f"U{k + 1}"] = h, s_in, s_out, u
        h = h + _relu(u)
    z = np.concatenate([batch.pool_sum @ h, batch.pool_mean @ h, batch.ctx], axis=1)
    cache["z"] = z
    out = np.empty((z.shape[0], num_t))
    for t in range(num_t):
        a1 = z @ p[f"V{t}"] + p[f"a{t}"]
        cache[f"A{t}"] = a1
        out[:, t] = _relu(a1) @ p[f"v{t}"] + p[f"e{t}"][0]
    return out, cache


def loss_and_grads(
    p: Params, batch: Batch, y: Array, rounds: int, weight_decay: float
) -> tuple[float, Params]:
    """The training loss (module docstring) and its gradient for every parameter.

    `y` is [B,T] with NaN where a graph did not observe a target.
    """
    num_t = y.shape[1]
    out, c = forward(p, batch, rounds, num_t)
    observed = np.isfinite(y)
    n_obs = np.maximum(observed.sum(axis=0), 1)
    err = np.where(observed, out - np.nan_to_num(y), 0.0)
    loss = float(((err**2).sum(axis=0) / n_obs).sum())
    g: Params = {}
    z = c["z"]
    dz = np.zeros_like(z)
    for t in range(num_t):
        dout = 2.0 * err[:, t] / n_obs[t]
        a1 = c[f"A{t}"]
        g[f"v{t}"] = _relu(a1).T @ dout
        g[f"e{t}"] = np.array([dout.sum()])
        da1 = np.outer(dout, p[f"v{t}"]) * (a1 > 0)
        g[f"V{t}"] = z.T @ da1
        g[f"a{t}"] = da1.sum(axis=0)
        dz += da1 @ p[f"V{t}"].T
    hid = p["b0"].shape[0]
    dh = batch.pool_sum.T @ dz[:, :hid] + batch.pool_mean.T @ dz[:, hid : 2 * hid]
    for k in reversed(range(rounds)):
        u = c[f"U{k + 1}"]
        du = dh * (u > 0)
        g[f"Ws{k}"] = c[f"H{k}"].T @ du
        g[f"Wi{k}"] = c[f"Sin{k}"].T @ du
        g[f"Wo{k}"] = c[f"Sout{k}"].T @ du
        g[f"b{k + 1}"] = du.sum(axis=0)
        dh = dh + du @ p[f"Ws{k}"].T
        dh += batch.a_in_t @ (du @ p[f"Wi{k}"].T)
        dh += batch.a_out_t @ (du @ p[f"Wo{k}"].T)
    du0 = dh * (c["U0"] > 0)
    g["W0"] = batch.x.T @ du0
    g["b0"] = du0.sum(axis=0)
    for name, w in p.items():
        if w.ndim == 2:  # weight matrices only
            loss += weight_decay * float((w**2).sum())
            g[name] = g[name] + 2.0 * weight_decay * w
    return loss, g


@dataclass(slots=True)
class _Scaler:
    mean: Array
    std: Array

    @classmethod
    def of(cls, values: Array) -> _Scaler:
        mean = np.nanmean(values, axis=0) if values.size else np.zeros(values.shape[-1])
        std = np.nanstd(values, axis=0) if values.size else np.ones(values.shape[-1])
        mean = np.nan_to_num(mean)
        std = np.where(np.isfinite(std) & (std > 1e-8), std, 1.0)
        return cls(mean, std)


class MessagePassingRegressor:
    """Fit and apply the network of the module docstring to graphs with `num_targets` outputs.

    Examples:
        >>> chain = lambda n: Graph(np.ones((n, 1)), tuple((i, i + 1) for i in range(n - 1)),
        ...                         np.zeros(1))
        >>> graphs = [chain(n) for n in range(2, 9)]
        >>> y = np.array([[float(n)] for n in range(2, 9)])
        >>> reg = MessagePassingRegressor(MPNNConfig(hidden=8, head_hidden=8, epochs=300))
        >>> pred = reg.fit(graphs, y).predict([chain(5)])
        >>> bool(abs(pred[0, 0] - 5.0) < 0.5)
        True
    """

    def __init__(self, config: MPNNConfig | None = None) -> None:
        self.config = config or MPNNConfig()
        self.params: Params = {}
        self.num_targets = 0
        self._x: _Scaler | None = None
        self._c: _Scaler | None = None
        self._y: _Scaler | None = None
        self._constant = np.zeros(0, dtype=bool)
        self.losses: list[float] = []

    def _standardized(self, graphs: Sequence[Graph]) -> Batch:
        assert self._x is not None and self._c is not None
        b = make_batch(graphs)
        return dataclasses.replace(
            b, x=(b.x - self._x.mean) / self._x.std, ctx=(b.ctx - self._c.mean) / self._c.std
        )

    def fit(self, graphs: Sequence[Graph], y: Array) -> Self:
        """Train on `graphs` with targets `y` [B,T] (NaN: not observed).

        Raises:
            ConfigError: shapes disagree, or a target has no observation.
        """
        y = np.asarray(y, dtype=np.float64)
        if y.ndim != 2 or y.shape[0] != len(graphs):
            raise ConfigError(f"fit: y has shape {y.shape}, expected ({len(graphs)}, targets)")
        if not np.isfinite(y).any(axis=0).all():
            raise ConfigError("fit: every target needs at least one observed (finite) value")
        if np.isinf(y).any():
            raise ConfigError("fit: targets must be finite or NaN")
        cfg = self.config
        self.num_targets = y.shape[1]
        nodes = np.concatenate([g.node_x for g in graphs], axis=0)
        self._x = _Scaler.of(nodes)
        self._c = _Scaler.of(np.stack([g.context for g in graphs]))
        self._y = _Scaler.of(y)
        # a target that never varies in training is that constant: no head learns it
        self._constant = np.nan_to_num(np.nanstd(y, axis=0)) < 1e-12
        batch = self._standardized(graphs)
        ys = (y - self._y.mean) / self._y.std
        ys[:, self._constant] = np.nan
        p = init_params(cfg, nodes.shape[1], batch.ctx.shape[1], self.num_targets)
        m1 = {k: np.zeros_like(v) for k, v in p.items()}
        m2 = {k: np.zeros_like(v) for k, v in p.items()}
        b1, b2, eps = 0.9, 0.999, 1e-8
        self.losses = []
        for step in range(1, cfg.epochs + 1):
            lr = cfg.learning_rate * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * step / cfg.epochs)))
            loss, grads = loss_and_grads(p, batch, ys, cfg.rounds, cfg.weight_decay)
            self.losses.append(loss)
            for k, gk in grads.items():
                m1[k] = b1 * m1[k] + (1 - b1) * gk
                m2[k] = b2 * m2[k] + (1 - b2) * gk * gk
                p[k] = p[k] - lr * (m1[k] / (1 - b1**step)) / (
                    np.sqrt(m2[k] / (1 - b2**step)) + eps
                )
        self.params = p
        return self

    def predict(self, graphs: Sequence[Graph]) -> Array:
        """Predictions [B,T] in the targets' own units.

        Raises:
            ConfigError: not fitted.
        """
        if not self.params or self._y is None:
            raise ConfigError("MessagePassingRegressor is not fitted; call fit() or from_state()")
        out, _ = forward(self.params, self._standardized(graphs), self.config.rounds,
                         self.num_targets)  # fmt: skip
        result: Array = out * self._y.std + self._y.mean
        result[:, self._constant] = self._y.mean[self._constant]
        return result

    # --- persistence ------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, object], dict[str, Array]]:
        """(JSON-able settings, arrays) that `from_state` restores exactly."""
        if self._x is None or self._c is None or self._y is None:
            raise ConfigError("MessagePassingRegressor is not fitted; nothing to save")
        arrays = {f"param.{k}": v for k, v in self.params.items()}
        for tag, sc in (("x", self._x), ("c", self._c), ("y", self._y)):
            arrays[f"scale.{tag}.mean"], arrays[f"scale.{tag}.std"] = sc.mean, sc.std
        arrays["constant"] = self._constant
        return {"config": asdict(self.config), "num_targets": self.num_targets}, arrays

    @classmethod
    def from_state(cls, meta: dict[str, object], arrays: dict[str, Array]) -> Self:
        cfg = meta["config"]
        if not isinstance(cfg, dict):
            raise ConfigError(f"from_state: bad config {cfg!r}")
        obj = cls(MPNNConfig(**cfg))
        obj.num_targets = int(str(meta["num_targets"]))
        obj.params = {k[6:]: v for k, v in arrays.items() if k.startswith("param.")}
        scalers = {
            tag: _Scaler(arrays[f"scale.{tag}.mean"], arrays[f"scale.{tag}.std"])
            for tag in ("x", "c", "y")
        }
        obj._x, obj._c, obj._y = scalers["x"], scalers["c"], scalers["y"]
        obj._constant = arrays["constant"].astype(bool)
        return obj
