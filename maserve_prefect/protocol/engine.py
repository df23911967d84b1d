"""The engine side of HEAR: the typed seam every backend (simulator, OpenAI, vLLM pool) implements.

Two levels. A `Replica` serves one deployment: `submit(request, controls)` answers at once with a
`Ticket` (accepted / rejected / unsupported) that later reports the first token and a final
`Outcome`; `state()` reports queues and KV use; `inform(intent)` records an intent and never causes
an action. A `Pool` owns devices and replicas and runs lifecycle actions (load / sleep / wake /
unload), each answered by a `LifecycleTicket`.

The messages themselves live in the category modules of this package: `requests.Request`,
`controls` (with their `Force`), `intents`, `outcomes` (`Ticket`, `Outcome`), `state`
(`EngineState`, `DeviceMemory`) and `capabilities`. Controls carry their force: a control the
engine cannot honour as a *requirement* makes the ticket UNSUPPORTED — unless the control lists an
allowed fallback the engine can honour, which is then used and recorded in the outcome; an
unhonoured *preference* is accepted, ignored, and noted in the outcome (`force.resolve`). To add a
control type, subclass `controls.Control` (a slots dataclass) and list it in the backend's
`Capabilities.control_types`.

Plain slots dataclasses, no pydantic: these objects live on the simulator's hot path.

Examples:
    >>> LifecycleTicket(LifecycleAction.LOAD, "r0", Acceptance.ACCEPTED).action.value
    'load'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import Control
from maserve_prefect.protocol.intents import Intent
from maserve_prefect.protocol.outcomes import Acceptance, Ticket
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.state import DeviceMemory, EngineState, Lifecycle


class LifecycleAction(Enum):
    LOAD = "load"
    SLEEP = "sleep"
    WAKE = "wake"
    UNLOAD = "unload"


@dataclass(slots=True)
class LifecycleTicket:
    """Answer to a lifecycle call: accepted or not at once; `done_s` when the action finished."""

    action: LifecycleAction
    replica: str
    acceptance: Acceptance
    reason: str = ""
    done_s: float | None = None
    error: str | None = None


class Replica(Protocol):
    """One deployment on one (set of) device(s)."""

    name: str
    deployment: str

    def capabilities(self) -> Capabilities: ...

    def submit(self, request: Request, controls: Sequence[Control] = ()) -> Ticket: ...

    def inform(self, intent: Intent) -> None: ...

    def state(self) -> EngineState: ...

    @property
    def lifecycle(self) -> Lifecycle:
        """Where the replica is in its life now (cheap: read at every dispatch)."""
        ...


class Pool(Protocol):
    """Devices and the replicas on them, with lifecycle actions."""

    def devices(self) -> Sequence[str]: ...

    def replicas(self) -> Sequence[Replica]: ...

    def load(self, deployment: str, device: str) -> LifecycleTicket: ...

    def sleep(self, replica: str, level: int = 1) -> LifecycleTicket: ...

    def wake(self, replica: str) -> LifecycleTicket: ...

    def unload(self, replica: str) -> LifecycleTicket: ...

    def memory(self, device: str) -> DeviceMemory: ...
