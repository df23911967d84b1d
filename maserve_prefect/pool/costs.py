"""Where pool plans' predictions come from: cost-model sources, reached by name.

One idea: a pool plan only reads a `CostModel` (`pool.state`); fitting, caching and scoring the
predictors behind it is the work of the user folder `predictors/`, which the library reaches
only through the `maserve_prefect.cost_models` plugin group (`plugins`). A suite declares its
training data as a `TrainingSpec`, asks the source once for the training rows, optionally for
the predictors' held-out scores, and then for one `CostModel` per predictor kind its arms use.

Examples:
    >>> src = cost_model_source()
    >>> src.KINDS
    ('formula', 'gbdt', 'graph', 'gnn')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from maserve_prefect import plugins
from maserve_prefect.pool.recorded import POOL_MODELS
from maserve_prefect.pool.state import CostModel

GROUP = "maserve_prefect.cost_models"

Axes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # (batch, input, output)


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """Which rows the learned predictors are fitted on.

    Attributes:
        profiles: the shared measured operator profiles (`../shared/data/profiles`).
        measured_shapes / sim_shapes: (batches, input lengths, output lengths) grids.
        sim_models / sim_devices: the simulator sweep's models and GPU kinds.
        num_trees: LightGBM rounds per target.
    """

    profiles: Path
    measured_shapes: Axes = ((1, 4, 16, 64), (128, 512, 2048), (16, 128, 512))
    sim_models: tuple[str, ...] = (*POOL_MODELS, "Llama-3.1-8B", "Phi-2")
    sim_devices: tuple[str, ...] = ("V100-32GB", "A100-40GB", "A100-80GB", "H100", "L40S")
    sim_shapes: Axes = ((1, 8, 32), (128, 1024, 4096), (16, 128, 512))
    num_trees: int = 300


class CostModelSource(Protocol):
    """A provider of fitted predictions (an entry of the `maserve_prefect.cost_models` group)."""

    KINDS: tuple[str, ...]

    def training_rows(self, spec: TrainingSpec) -> Any: ...

    def training_scores(self, rows: Any, num_trees: int) -> list[dict[str, Any]]: ...

    def suite_cost_model(
        self,
        kind: str,
        *,
        models: Sequence[str],
        devices: Sequence[str],
        max_input_len: int,
        max_output_len: int,
        steps_per_doubling: int,
        training: Any,
        num_trees: int,
    ) -> CostModel: ...


def cost_model_source(name: str = "predictors") -> CostModelSource:
    """The installed cost-model source `name` (this project's: the `predictors/` folder)."""
    source: CostModelSource = plugins.load(GROUP, name)
    return source
