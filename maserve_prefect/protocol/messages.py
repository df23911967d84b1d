"""HEAR's typed messages, in four categories — one import surface for harness and engine code.

One idea: HEAR is bidirectional and every exchange names its subject (`subjects`: a request, a
versioned context, or a serving instance). Harness -> engine:

1. Execution Description & Intent (`intents`) — roles, stages, dependencies and readiness,
   sizes and output limits, context lifecycles, known future uses; forecasts wrapped in
   `Prediction`. Informs only (`Channel.inform`); never triggers an action.
2. Execution Requirements & Control (`controls`) — priority / ordering key, waiting-time
   requirements, cache prepare / retain / release, allowed execution modes; each with a `Force`
   and explicit fallbacks, resolved by `force.resolve`.

Engine -> harness:

3. State & Capabilities (`state`, `capabilities`) — residency by tier, capacity, queues,
   pressure, cost estimates; supported controls and configurations. Reserves nothing.
4. Execution Outcomes (`outcomes`) — accepted, completed, rejected, unsupported, failed;
   realized mode and fallbacks, cache reuse, latency, resources, retries, errors.

The classes live in the category modules; this module re-exports them (no definitions here).

Examples:
    >>> from maserve_prefect.protocol import messages as m
    >>> m.RoleIntent(m.RequestRef("r1"), "critic").subject.key()
    'request:r1'
"""

from __future__ import annotations

from maserve_prefect.protocol.capabilities import HearCapabilities, Usable, usable
from maserve_prefect.protocol.controls import (
    CacheOp,
    CachePrepare,
    CacheRelease,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    MaxWait,
    OrderingKey,
    Priority,
    Tier,
)
from maserve_prefect.protocol.intents import (
    ContextAction,
    ContextIntent,
    ContinuationIntent,
    DependencyIntent,
    FutureUseIntent,
    IntentMessage,
    Prediction,
    Readiness,
    RoleIntent,
    SizeIntent,
    StageIntent,
    encode_intent,
)
from maserve_prefect.protocol.outcomes import (
    Accepted,
    CacheReuse,
    Completed,
    Failed,
    FallbackUsed,
    HearOutcome,
    Latency,
    OutcomeKind,
    Realization,
    Rejected,
    Resources,
    Unsupported,
    outcome_of,
    require_completed,
)
from maserve_prefect.protocol.state import (
    CostEstimate,
    PrefixRange,
    Pressure,
    QueueState,
    ResidencyView,
    StateReport,
    TierCapacity,
)
from maserve_prefect.protocol.subjects import (
    ContextRef,
    InstanceRef,
    RequestRef,
    Subject,
    subject_key,
)

__all__ = [
    "Accepted",
    "CacheOp",
    "CachePrepare",
    "CacheRelease",
    "CacheRetain",
    "CacheReuse",
    "Completed",
    "ContextAction",
    "ContextIntent",
    "ContextRef",
    "ContinuationIntent",
    "Control",
    "CostEstimate",
    "DependencyIntent",
    "ExecutionMode",
    "Failed",
    "FallbackUsed",
    "Force",
    "FutureUseIntent",
    "HearCapabilities",
    "HearOutcome",
    "InstanceRef",
    "IntentMessage",
    "Latency",
    "MaxWait",
    "OrderingKey",
    "OutcomeKind",
    "Prediction",
    "PrefixRange",
    "Pressure",
    "Priority",
    "QueueState",
    "Readiness",
    "Realization",
    "Rejected",
    "RequestRef",
    "ResidencyView",
    "Resources",
    "RoleIntent",
    "SizeIntent",
    "StageIntent",
    "StateReport",
    "Subject",
    "Tier",
    "TierCapacity",
    "Unsupported",
    "Usable",
    "encode_intent",
    "outcome_of",
    "require_completed",
    "subject_key",
    "usable",
]
