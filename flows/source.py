"""This project's workflow source: the entry `flows` of the `maserve_prefect.workflows` plugin group.

The library reaches the workflows of this folder only through that entry
(`maserve_prefect.taskrunner.native`); this module names the three functions it calls.
"""

from __future__ import annotations

from maserve_prefect.flows.native import run_native
from maserve_prefect.flows.workflows import get_workflow, list_workflows

__all__ = ["get_workflow", "list_workflows", "run_native"]
