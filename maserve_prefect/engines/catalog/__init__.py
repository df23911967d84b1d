"""Model and GPU facts the simulator and the predictors both read: architectures, datasheets,
fitted device efficiencies, memory budgets and lifecycle timings."""

from maserve_prefect.engines.catalog.devices import (
    DeviceEntry,
    get_device,
    get_efficiency,
    get_gpu,
    list_gpus,
)
from maserve_prefect.engines.catalog.efficiency import DeviceEfficiency
from maserve_prefect.engines.catalog.gpus import GpuSpec
from maserve_prefect.engines.catalog.models import ModelSpec, get_model, list_models

__all__ = [
    "DeviceEfficiency",
    "DeviceEntry",
    "GpuSpec",
    "ModelSpec",
    "get_device",
    "get_efficiency",
    "get_gpu",
    "get_model",
    "list_gpus",
    "list_models",
]
