"""The fixed work of one op: the engine request a model op replays, the duration of any other op.

One idea: replay never changes *what* an op does, only when it is released. A model op is
replayed **length-locked** (`max_tokens = min_tokens =` its recorded output tokens; the simulator
honours `min_tokens` exactly, so no `ignore_eos` is needed there) in one of two input contracts:

- `token` (token-locked): the prompt token ids are rebuilt from the recorded chat messages (the
  op's first input ref, a CAS JSON list of `[role, content]` pairs) with the same tokenizer the
  native simulator run used (`engines.sim.tokenizer.chat_token_ids`), so prefix caching sees exactly the
  prefixes the native run saw. The rebuilt length must equal the recorded input tokens, else the
  trace came from another tokenizer and the op is refused (use `length`). Needs an engine whose
  capabilities say `accepts_token_ids`.
- `length` (length-locked only): `num_prompt_tokens` plus the recorded prefix-block hashes when the
  trace has them (Mooncake imports). Needs `length_lock`.

An engine that cannot honour the contract is refused with `UnsupportedError` before anything runs.
Non-model ops (tool, transform, state) are not executed: a tool returns its recorded result after
its recorded `tool_duration_s`; other ops take their recorded `completed_s - ready_s` (0 when a
time is missing) — on the simulator both are virtual seconds from the native run.

Examples:
    >>> from maserve_prefect.trace.model import OpKind, OpRecord, OpTimes
    >>> op_duration(OpRecord(op_id="r/t", root_id="r", kind=OpKind.TOOL, tool_duration_s=1.5))
    1.5
    >>> op_duration(OpRecord(op_id="r/x", root_id="r", kind=OpKind.TRANSFORM,
    ...                      times=OpTimes(ready_s=2.0, completed_s=2.25)))
    0.25
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from maserve_prefect.engines.sim.tokenizer import chat_token_ids
from maserve_prefect.errors import BlobNotFoundError, ConfigError, UnsupportedError
from maserve_prefect.protocol.engine import Replica
from maserve_prefect.protocol.requests import Request
from maserve_prefect.replay.requests import op_request
from maserve_prefect.trace.cas import BlobStore
from maserve_prefect.trace.model import OpRecord


class InputLock(StrEnum):
    """The model-input contract of a replay (see the module docstring)."""

    TOKEN = "token"
    LENGTH = "length"


def op_duration(op: OpRecord) -> float:
    """Recorded duration of a non-model op (tool duration, else completed − ready, else 0)."""
    if op.tool_duration_s is not None:
        return max(op.tool_duration_s, 0.0)
    t = op.times
    if t.ready_s is not None and t.completed_s is not None:
        return max(t.completed_s - t.ready_s, 0.0)
    return 0.0


def recorded_messages(op: OpRecord, store: BlobStore | None) -> list[tuple[str, str]]:
    """The chat messages a model op was issued with (its first input ref).

    Raises:
        ConfigError: no store, no input ref, or the blob is not a list of [role, content].
    """
    where = f"op {op.op_id!r}"
    if store is None or not op.input_refs:
        raise ConfigError(
            f"{where}: token-locked replay needs the recorded prompt messages (input_refs[0] in "
            "the trace's CAS), which this trace lacks; use `lock: length`"
        )
    try:
        raw = store.get_json(op.input_refs[0])
    except BlobNotFoundError as exc:
        raise ConfigError(f"{where}: prompt blob missing ({exc}); use `lock: length`") from None
    if not isinstance(raw, list) or not all(
        isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m) for m in raw
    ):
        raise ConfigError(
            f"{where}: input_refs[0] is not a chat-message list [[role, content], ...]; "
            "use `lock: length`"
        )
    return [(m[0], m[1]) for m in raw]


def model_request(
    op: OpRecord, deployment: str, lock: InputLock, store: BlobStore | None
) -> Request:
    """The engine request that replays model op `op` on `deployment` (request id = op id).

    Raises:
        ConfigError: token lock without recorded messages, or the messages tokenize to another
            length than recorded (the trace came from another tokenizer).
    """
    if lock is InputLock.LENGTH:
        return op_request(op, deployment)
    messages = recorded_messages(op, store)
    ids = tuple(chat_token_ids(messages))
    if len(ids) != op.num_input_tokens:
        raise ConfigError(
            f"op {op.op_id!r}: the recorded messages tokenize to {len(ids)} tokens here but the "
            f"op recorded {op.num_input_tokens}; the trace used another tokenizer — replay it "
            "with `lock: length`"
        )
    out = max(op.num_output_tokens, 1)
    return Request(
        op.op_id,
        deployment,
        prompt_token_ids=ids,
        max_tokens=out,
        min_tokens=out,
        priority=op.generation.priority if op.generation else 0,
        tags={"op_id": op.op_id, "root_id": op.root_id},
    )


def check_capabilities(replicas: Iterable[Replica], lock: InputLock) -> None:
    """Refuse a contract some replica cannot honour.

    Raises:
        UnsupportedError: a replica lacks `length_lock`, or `accepts_token_ids` for token lock.
    """
    for rep in replicas:
        caps = rep.capabilities()
        if not caps.length_lock:
            raise UnsupportedError(
                f"replica {rep.name!r} cannot lock output lengths (min_tokens = max_tokens); "
                "fixed-work replay needs it"
            )
        if lock is InputLock.TOKEN and not caps.accepts_token_ids:
            raise UnsupportedError(
                f"replica {rep.name!r} does not accept prompt token ids, so token-locked replay "
                "is unsupported there; use `lock: length`"
            )


def deployment_of(op: OpRecord) -> str:
    """The deployment name a model op addressed ("" when the record has none, e.g. imports;
    the pool file's `default` deployment then serves it)."""
    return op.generation.deployment if op.generation is not None else ""
