"""Output lengths the joint plan times work with: the p90 of recent completions of the same node.

One idea: a plan must not time work on output lengths it cannot know. The paper (§3.3) times a
call on the empirical 90th-percentile output length of recent completions of the same logical
workflow node, falls back to the call's configured limit when there is no history, and keeps
admission on the limit (`pool.admission`). A *node* is a call's place in its workflow: its
workflow and its id within the root with loop-iteration suffixes dropped
(`code_repair/r0001/repair#2.repairer/0` -> `code_repair:repair.repairer/0`), so every session
and every iteration of a node share one history. "Recent" is the last `HISTORY` completions
(the paper does not say how many; 32 gives a p90 that is not just the maximum). The p90 is the
nearest-rank one, and a call is never timed past its own limit (an engine stops there).

Examples:
    >>> h = OutputHistory()
    >>> u = WorkUnit("wf/r1/a#2.x/0", "wf/r1", "m", 10, 500, workflow="wf")
    >>> node_key(u), h.timing_tokens(u)
    ('wf:a.x/0', 500)
    >>> for n in range(1, 11):
    ...     h.record(u, 10 * n)
    >>> h.timing_tokens(u)
    90
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass, field

from maserve_prefect.pool.window import WorkUnit

HISTORY = 32
"""Completions of a node the p90 is taken over."""

_ITERATION = re.compile(r"#\d+")


def node_key(u: WorkUnit) -> str:
    """The logical workflow node of `u` (module docstring)."""
    local = u.unit_id.removeprefix(u.root_id + "/") if u.root_id else u.unit_id
    return f"{u.workflow or u.deployment}:{_ITERATION.sub('', local)}"


def p90(values: list[int]) -> int:
    """The nearest-rank 90th percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.9 * len(ordered)) - 1, 0)]


@dataclass(slots=True)
class OutputHistory:
    """Recent output lengths per node; `timing_tokens` is what a plan times a call on."""

    outputs: dict[str, deque[int]] = field(default_factory=dict)

    def record(self, u: WorkUnit, num_output_tokens: int) -> None:
        """`u` completed with `num_output_tokens`."""
        self.outputs.setdefault(node_key(u), deque(maxlen=HISTORY)).append(num_output_tokens)

    def timing_tokens(self, u: WorkUnit) -> int:
        """The p90 of `u`'s node's recent outputs, at most `u`'s limit; the limit without
        history."""
        seen = self.outputs.get(node_key(u))
        if not seen:
            return u.max_tokens
        return max(min(p90(list(seen)), u.max_tokens), 1)
