"""`state_read` / `state_write`: versioned task-shared state and persistent memory as ops.

A write appends a version of namespace `name` (per root for task-shared state, global for
`persistent=True`); a read returns the latest version's artifact and gives the reading op a
*state* edge to the op that wrote that version. Both apply at a quiescent instant in op-id order
(`gate.defer`), so versions never depend on thread timing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from maserve_prefect.tasks.artifact import Artifact
from maserve_prefect.tasks.ops_common import op_task, this_op

from maserve_prefect.taskrunner.memory_store import Version
from maserve_prefect.trace.model import EdgeKind, OpKind

PERSISTENT = "persistent"


@op_task(OpKind.STATE_WRITE)
def state_write(*, name: str, value: Artifact, persistent: bool = False) -> Artifact:
    """Write `value` as the next version of state `name`; returns the stored artifact."""
    op, h = this_op("state_write")
    scope = PERSISTENT if persistent else op.scope.root_id
    stored = replace(value, name=name, producer=op.op_id)
    stored = replace(stored, digest=h.store.put(stored.payload()))
    box: list[Version] = []

    def register(wake: Callable[[], None]) -> None:
        def apply() -> None:
            box.append(h.state.write(scope, name, stored.digest, op.op_id))
            wake()

        h.gate.defer((h.gate.now(), op.op_id), apply)

    h.gate.block(register, what=f"state write {name} by {op.op_id}")
    op.input_refs = [value.digest] if value.digest else []
    op.output_ref = stored.digest
    return replace(stored, fields={**stored.fields, "version": box[0].number})


@op_task(OpKind.STATE_READ)
def state_read(*, name: str, persistent: bool = False) -> Artifact:
    """Read the latest version of state `name` (an empty artifact when none exists)."""
    op, h = this_op("state_read")
    scope = PERSISTENT if persistent else op.scope.root_id
    box: list[Version | None] = []

    def register(wake: Callable[[], None]) -> None:
        def apply() -> None:
            box.append(h.state.read(scope, name))
            wake()

        h.gate.defer((h.gate.now(), op.op_id), apply)

    h.gate.block(register, what=f"state read {name} by {op.op_id}")
    version = box[0]
    if version is None:
        art = Artifact(name, "", {"version": 0}, producer=op.op_id)
        art = replace(art, digest=h.store.put(art.payload()))
    else:
        # A persistent-memory read of another root's write is a real, recorded dependency, but
        # roots are independent units of replay: such cross-root edges are not required.
        op.add_dep(version.writer, EdgeKind.STATE, required=scope != PERSISTENT)
        payload = h.store.get(version.value)
        data = json.loads(payload)
        art = Artifact(
            name, data["text"], {**data["fields"], "version": version.number}, producer=op.op_id
        )
        art = replace(art, digest=h.store.put(art.payload()))
    op.output_ref = art.digest
    return art
