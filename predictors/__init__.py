"""maserve_prefect.predictors (shipped from the repository's predictors/ folder).

Cost predictors for the pool runtime: runtime, peak memory and load time of a request batch
(`Shape`) of a catalog model on a catalog device. `FormulaPredictor` (roofline, catalog facts
only), `GBDTPredictor` (LightGBM on scalar features), `GraphPredictor` (LightGBM on operator-graph
roofline features, correcting the formula), `GNNPredictor` (message passing over the operator
data-flow graph, numpy; `gnn`, `mpnn`, `dataflow`); `profiling` builds training rows from the simulator
and from real operator profiles; `evaluate` scores them on held-out devices and models;
`BucketTable` serves precomputed predictions to the scheduling path.
"""

from maserve_prefect.predictors.base import TARGETS, Prediction, Predictor, Shape
from maserve_prefect.predictors.formula import FormulaPredictor
from maserve_prefect.predictors.gbdt import GBDTPredictor
from maserve_prefect.predictors.gnn import GNNPredictor
from maserve_prefect.predictors.graph import GraphPredictor
from maserve_prefect.predictors.rows import Row, read_rows, write_rows
from maserve_prefect.predictors.tables import Buckets, BucketTable, OutputTracker

__all__ = [
    "TARGETS",
    "BucketTable",
    "Buckets",
    "FormulaPredictor",
    "GBDTPredictor",
    "GNNPredictor",
    "GraphPredictor",
    "OutputTracker",
    "Prediction",
    "Predictor",
    "Row",
    "Shape",
    "read_rows",
    "write_rows",
]
