"""The numpy message-passing network: backprop against finite differences, a structural target
that per-node sums cannot represent, determinism, exact state round-trip, input errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from maserve_prefect.predictors.mpnn import (
    Graph,
    MessagePassingRegressor,
    MPNNConfig,
    init_params,
    loss_and_grads,
    make_batch,
)

from maserve_prefect.errors import ConfigError


def chain(types: list[int], ctx: float = 0.0) -> Graph:
    """A path graph whose node i carries the one-hot of `types[i]` (0 = a, 1 = b)."""
    x = np.eye(2)[types]
    return Graph(x, tuple((i, i + 1) for i in range(len(types) - 1)), np.array([ctx]))


def a_then_b(types: list[int]) -> float:
    """Number of edges a → b: depends on the order of nodes, not only on their counts."""
    return float(sum(1 for u, v in itertools.pairwise(types) if (u, v) == (0, 1)))


def random_chains(rng: np.random.Generator, num: int) -> tuple[list[Graph], np.ndarray]:
    types = [list(rng.integers(0, 2, size=int(rng.integers(4, 11)))) for _ in range(num)]
    return [chain(t) for t in types], np.array([[a_then_b(t)] for t in types])


def test_gradients_match_finite_differences_on_a_tiny_graph() -> None:
    rng = np.random.default_rng(1)
    # a cycle, a node with two in-edges (n > 2), two targets (one unobserved), weight decay on
    graphs = [
        Graph(rng.normal(size=(n, 3)),
              (*((i, i + 1) for i in range(n - 1)), (n - 1, 0), (0, n - 1)), rng.normal(size=2))
        for n in (2, 3, 4)
    ]  # fmt: skip
    batch = make_batch(graphs)
    cfg = MPNNConfig(hidden=4, rounds=2, head_hidden=3, seed=3)
    p = init_params(cfg, 3, 2, 2)
    for name in p:  # non-zero biases so every path carries gradient
        p[name] = p[name] + rng.normal(scale=0.1, size=p[name].shape)
    y = rng.normal(size=(3, 2))
    y[1, 0] = np.nan
    _, grads = loss_and_grads(p, batch, y, cfg.rounds, 0.01)
    assert set(grads) == set(p)
    eps = 1e-6
    for name, w in p.items():
        numeric = np.zeros_like(w)
        for idx in np.ndindex(w.shape):
            old = w[idx]
            w[idx] = old + eps
            up, _ = loss_and_grads(p, batch, y, cfg.rounds, 0.01)
            w[idx] = old - eps
            down, _ = loss_and_grads(p, batch, y, cfg.rounds, 0.01)
            w[idx] = old
            numeric[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-7, err_msg=name)


def test_learns_a_structural_target_that_node_sums_cannot() -> None:
    rng = np.random.default_rng(0)
    train_g, train_y = random_chains(rng, 240)
    test_g, test_y = random_chains(rng, 120)
    # baseline: least squares on each graph's summed node features (counts of a and b)
    sums = lambda gs: np.array([[*g.node_x.sum(axis=0), 1.0] for g in gs])  # noqa: E731
    coef, *_ = np.linalg.lstsq(sums(train_g), train_y, rcond=None)
    base_mse = float(np.mean((sums(test_g) @ coef - test_y) ** 2))
    cfg = MPNNConfig(hidden=16, rounds=2, head_hidden=16, epochs=400, learning_rate=1e-2)
    reg = MessagePassingRegressor(cfg).fit(train_g, train_y)
    mse = float(np.mean((reg.predict(test_g) - test_y) ** 2))
    assert mse < 0.2 * base_mse, (mse, base_mse)
    # two graphs with the same nodes in another order: any function of sums is blind to it
    same_nodes = reg.predict([chain([0, 1, 0, 1]), chain([1, 1, 0, 0])])[:, 0]
    assert abs((same_nodes[0] - same_nodes[1]) - 2.0) < 0.5
    # without message passing (rounds=0) the network is a function of pooled nodes, as blind
    blind = MessagePassingRegressor(MPNNConfig(hidden=16, rounds=0, head_hidden=16, epochs=400,
                                               learning_rate=1e-2)).fit(train_g, train_y)  # fmt: skip
    blind_mse = float(np.mean((blind.predict(test_g) - test_y) ** 2))
    assert mse < 0.2 * blind_mse, (mse, blind_mse)


def test_fits_are_deterministic_given_the_seed() -> None:
    graphs, y = random_chains(np.random.default_rng(2), 30)
    cfg = MPNNConfig(hidden=8, head_hidden=8, epochs=40)
    a = MessagePassingRegressor(cfg).fit(graphs, y)
    b = MessagePassingRegressor(cfg).fit(list(graphs), y.copy())
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert np.array_equal(a.predict(graphs), b.predict(graphs))
    other = MessagePassingRegressor(MPNNConfig(hidden=8, head_hidden=8, epochs=40, seed=1))
    assert not np.array_equal(other.fit(graphs, y).predict(graphs), a.predict(graphs))


def test_state_round_trip_is_exact() -> None:
    graphs, y = random_chains(np.random.default_rng(3), 20)
    reg = MessagePassingRegressor(MPNNConfig(hidden=8, head_hidden=8, epochs=20)).fit(graphs, y)
    meta, arrays = reg.state()
    again = MessagePassingRegressor.from_state(meta, arrays)
    assert np.array_equal(again.predict(graphs), reg.predict(graphs))


def test_training_loss_falls_and_unobserved_targets_are_skipped() -> None:
    graphs, y = random_chains(np.random.default_rng(4), 40)
    y2 = np.concatenate([y, 2.0 * y + 1.0], axis=1)
    y2[::2, 1] = np.nan
    reg = MessagePassingRegressor(MPNNConfig(hidden=8, head_hidden=8, epochs=200)).fit(graphs, y2)
    assert reg.losses[-1] < 0.2 * reg.losses[0]
    assert np.isfinite(reg.predict(graphs)).all()


def test_bad_inputs_are_config_errors() -> None:
    g = chain([0, 1])
    with pytest.raises(ConfigError, match="no graphs"):
        make_batch([])
    with pytest.raises(ConfigError, match="edge"):
        make_batch([Graph(g.node_x, ((0, 5),), g.context)])
    with pytest.raises(ConfigError, match="at least one observed"):
        MessagePassingRegressor().fit([g], np.array([[np.nan]]))
    with pytest.raises(ConfigError, match="not fitted"):
        MessagePassingRegressor().predict([g])
    with pytest.raises(ConfigError, match="hidden"):
        MPNNConfig(hidden=0)


def test_a_constant_target_is_predicted_exactly() -> None:
    graphs, y = random_chains(np.random.default_rng(5), 30)
    y2 = np.concatenate([y, np.full_like(y, 0.25)], axis=1)
    reg = MessagePassingRegressor(MPNNConfig(hidden=8, head_hidden=8, epochs=30)).fit(graphs, y2)
    assert (reg.predict(graphs)[:, 1] == 0.25).all()
    again = MessagePassingRegressor.from_state(*reg.state())
    assert np.array_equal(again.predict(graphs), reg.predict(graphs))
