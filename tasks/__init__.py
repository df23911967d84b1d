"""maserve_prefect.tasks: the operations flows submit — model, tool, transform and state ops.

Each op is a Prefect task meant for `.submit()` / `.map()` under `MAServeTaskRunner` (a direct
call bypasses the runner and is refused). Ops exchange `Artifact`s.
"""

from maserve_prefect.tasks.artifact import Artifact
from maserve_prefect.tasks.context import ContextSpec, build_messages
from maserve_prefect.tasks.model import Decision, ModelCallError, model_call
from maserve_prefect.tasks.state import state_read, state_write
from maserve_prefect.tasks.tool import tool_call
from maserve_prefect.tasks.transform import register_transform, transform

__all__ = [
    "Artifact",
    "ContextSpec",
    "Decision",
    "ModelCallError",
    "build_messages",
    "model_call",
    "register_transform",
    "state_read",
    "state_write",
    "tool_call",
    "transform",
]
