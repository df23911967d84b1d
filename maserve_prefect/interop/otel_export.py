"""A Semantic Trace through the OpenTelemetry SDK: spans, an OTLP JSON file, or OTLP over HTTP.

The one idea: **the SDK builds the spans and its OTLP encoder encodes them; this module only
feeds it the plans of `otel_plan`.** A private `TracerProvider` (never the global one) starts
each planned span with its planned ids (an `IdGenerator` that hands them out), parent, links and
start time, ends it at its planned end time, and an `InMemorySpanExporter` collects the finished
`ReadableSpan`s. From there:

- `write_otlp_json` encodes them with `opentelemetry.exporter.otlp.proto.common.trace_encoder`
  into one `ExportTraceServiceRequest` per root and writes each as one line of OTLP/JSON (the
  protobuf JSON mapping with hex trace and span ids, as the OTLP file exporter writes and the
  collector's `otlpjsonfile` receiver reads). The file is written beside its destination and
  renamed into place: whole or absent.
- `send_otlp` hands them to the SDK's `OTLPSpanExporter` (OTLP/HTTP, protobuf). An endpoint that
  refuses or cannot be reached is a `TraceExportError` naming it, in one line.

Examples:
    >>> from maserve_prefect.trace.model import Manifest, OpKind, OpRecord, RootRecord, Trace
    >>> t = Trace(manifest=Manifest(trace_id="t"), roots=[RootRecord(root_id="r")],
    ...           ops=[OpRecord(op_id="r/0", root_id="r", kind=OpKind.TOOL, tool_name="grep")])
    >>> [s.name for s in build_spans(t)]
    ['invoke_workflow', 'execute_tool grep']
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import socket
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from maserve_prefect.errors import ConfigError, TraceExportError, TraceImportError
from maserve_prefect.interop.otel_plan import (
    SpanPlan,
    plan_trace,
    resource_attributes,
)
from maserve_prefect.trace.model import Trace
from maserve_prefect.trace.runs import PrefectLink

SCOPE = "maserve_prefect.interop.otel"
TRACES_PATH = "/v1/traces"
DEFAULT_TIMEOUT_S = 10.0
MAX_SPANS_PER_REQUEST = 5000
"""Whole roots are sent together, at most this many spans a request (the exporter drops a
request over 64 MiB)."""
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNLIMITED = SpanLimits(
    max_attributes=SpanLimits.UNSET,
    max_events=SpanLimits.UNSET,
    max_links=SpanLimits.UNSET,
    max_span_attributes=SpanLimits.UNSET,
    max_event_attributes=SpanLimits.UNSET,
    max_link_attributes=SpanLimits.UNSET,
    max_attribute_length=SpanLimits.UNSET,
    max_span_attribute_length=SpanLimits.UNSET,
)


class _PlannedIds(IdGenerator):
    """Hands out the ids of the span about to start (the plan's, derived from the trace)."""

    def __init__(self) -> None:
        self.trace_id = 0
        self.span_id = 0

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id


def build_spans(
    trace: Trace, *, epoch_ns: int = 0, prefect_links: Iterable[PrefectLink] = ()
) -> list[ReadableSpan]:
    """The trace's spans as the SDK records them, in plan order (root span first per root).

    Args:
        trace: the trace.
        epoch_ns: Unix time (ns) of the run's t = 0 (`otel_plan.resolve_epoch_ns`).
        prefect_links: the ledger's Prefect run ids of ops (`Ledger.prefect_links`).

    Raises:
        TraceExportError: the SDK recorded fewer spans than planned (`OTEL_SDK_DISABLED` set).
    """
    plans = plan_trace(trace, epoch_ns=epoch_ns, prefect_links=prefect_links)
    ids = _PlannedIds()
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        sampler=ALWAYS_ON,
        resource=Resource(resource_attributes(trace)),
        shutdown_on_exit=False,
        id_generator=ids,
        span_limits=_UNLIMITED,
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(SCOPE, _version())
    num_planned = 0
    for tp in plans:
        for plan in tp.spans:
            ids.trace_id, ids.span_id = plan.trace_id, plan.span_id
            _record(tracer, plan)
            num_planned += 1
    provider.shutdown()
    spans = list(memory.get_finished_spans())
    if len(spans) != num_planned:
        raise TraceExportError(
            f"the OpenTelemetry SDK recorded {len(spans)} of {num_planned} spans; unset "
            "OTEL_SDK_DISABLED and export again"
        )
    return spans


def otlp_requests(spans: Sequence[ReadableSpan]) -> list[ExportTraceServiceRequest]:
    """One OTLP request per OTel trace (per root), spans in the order given."""
    return [encode_spans(group) for group in _by_trace(spans)]


def otlp_json(request: ExportTraceServiceRequest) -> str:
    """One request as one line of OTLP/JSON: camelCase keys, enums as numbers, hex ids."""
    data = json_format.MessageToDict(request, use_integers_for_enums=True)
    for span in _spans_of(data):
        _recode_ids(span, _b64_to_hex)
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def write_otlp_json(
    trace: Trace,
    dest: Path,
    *,
    epoch_ns: int = 0,
    prefect_links: Iterable[PrefectLink] = (),
    overwrite: bool = False,
) -> int:
    """Write `trace` as an OTLP/JSON file (one line per root); return the number of spans.

    Raises:
        TraceExportError: `dest` exists and `overwrite` is False, or cannot be written.
    """
    spans = build_spans(trace, epoch_ns=epoch_ns, prefect_links=prefect_links)
    text = "".join(otlp_json(req) + "\n" for req in otlp_requests(spans))
    _write_atomically(dest, text.encode("utf-8"), overwrite=overwrite)
    return len(spans)


def read_otlp_json(path: Path) -> list[ExportTraceServiceRequest]:
    """Read an OTLP/JSON file (one `ExportTraceServiceRequest` a line) back into protobuf.

    Raises:
        TraceImportError: the file is missing or a line is not an OTLP/JSON request (file:line).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise TraceImportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    requests = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            for span in _spans_of(data):
                _recode_ids(span, _hex_to_b64)
            requests.append(json_format.ParseDict(data, ExportTraceServiceRequest()))
        except (ValueError, TypeError, AttributeError, json_format.ParseError) as exc:
            raise TraceImportError(
                f"{path}:{lineno}: not an OTLP/JSON ExportTraceServiceRequest ({exc})"
            ) from None
    return requests


def otlp_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of `endpoint`: a bare collector URL gets `/v1/traces`.

    Examples:
        >>> otlp_traces_url("http://localhost:4318"), otlp_traces_url("http://h:1/custom")
        ('http://localhost:4318/v1/traces', 'http://h:1/custom')
    """
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"--otlp-endpoint {endpoint!r}: give an http(s) URL of an OTLP/HTTP receiver, "
            "e.g. http://localhost:4318 (a collector's OTLP/HTTP port)"
        )
    return endpoint.rstrip("/") + TRACES_PATH if parts.path in ("", "/") else endpoint


def send_otlp(
    spans: Sequence[ReadableSpan], endpoint: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> int:
    """Send `spans` to an OTLP/HTTP endpoint with the SDK's exporter; return the requests sent.

    Whole roots go together, at most `MAX_SPANS_PER_REQUEST` spans a request.

    Raises:
        ConfigError: `endpoint` is not an http(s) URL.
        TraceExportError: the endpoint refused a request or could not be reached within
            `timeout_s` (the message names it and how many requests it had taken before).
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = otlp_traces_url(endpoint)
    exporter = OTLPSpanExporter(endpoint=url, timeout=timeout_s)
    sent = 0
    try:
        for batch in _batches(spans):
            with _captured_exporter_log() as log:
                result = exporter.export(batch)
            if result is not SpanExportResult.SUCCESS:
                before = f"; {sent} earlier request(s) were taken" if sent else ""
                reason = _reason(log) or _connect_error(url, timeout_s)
                raise TraceExportError(
                    f"OTLP endpoint {url} took no spans ({reason}){before}; check that an "
                    "OTLP/HTTP receiver listens there (a collector's port 4318)"
                )
            sent += 1
    finally:
        with _captured_exporter_log():
            exporter.shutdown()
    return sent


# ---- helpers ------------------------------------------------------------------------------------


def _record(tracer: trace_api.Tracer, plan: SpanPlan) -> None:
    if plan.parent_span_id is None:
        context = Context()  # a root span: no parent, even under an ambient span
    else:
        parent = SpanContext(plan.trace_id, plan.parent_span_id, False, _SAMPLED)
        context = trace_api.set_span_in_context(trace_api.NonRecordingSpan(parent), Context())
    links = [
        Link(SpanContext(link.trace_id, link.span_id, False, _SAMPLED), link.attributes)
        for link in plan.links
    ]
    span = tracer.start_span(
        plan.name,
        context=context,
        kind=_KINDS[plan.kind],
        attributes=plan.attributes,
        links=links,
        start_time=plan.start_ns,
        record_exception=False,
        set_status_on_exception=False,
    )
    for event in plan.events:
        span.add_event(event.name, timestamp=event.time_ns)
    if plan.error is not None:
        span.set_status(Status(StatusCode.ERROR, plan.error))
    span.end(end_time=plan.end_ns)


def _batches(spans: Sequence[ReadableSpan]) -> Iterator[list[ReadableSpan]]:
    batch: list[ReadableSpan] = []
    for group in _by_trace(spans):
        if batch and len(batch) + len(group) > MAX_SPANS_PER_REQUEST:
            yield batch
            batch = []
        batch.extend(group)
    if batch:
        yield batch


def _by_trace(spans: Sequence[ReadableSpan]) -> list[list[ReadableSpan]]:
    groups: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        assert span.context is not None  # every span the SDK finished has one
        groups.setdefault(span.context.trace_id, []).append(span)
    return list(groups.values())


def _spans_of(data: Any) -> Iterator[dict[str, Any]]:
    for rs in data.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            yield from ss.get("spans", [])


def _recode_ids(span: dict[str, Any], recode: Any) -> None:
    for key in _ID_FIELDS:
        if key in span:
            span[key] = recode(span[key])
    for link in span.get("links", []):
        for key in _ID_FIELDS:
            if key in link:
                link[key] = recode(link[key])


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def _write_atomically(dest: Path, data: bytes, *, overwrite: bool) -> None:
    dest = Path(dest)
    if dest.exists() and not overwrite:
        raise TraceExportError(
            f"{dest} already exists; choose another file or pass --force to replace it"
        )
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    except OSError as exc:
        raise TraceExportError(
            f"{dest}: cannot write there ({exc.strerror or exc}); choose a file in a folder "
            "you can write"
        ) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # as open() would create it (mkstemp makes it 0600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise TraceExportError(f"{dest}: cannot write it ({exc.strerror or exc})") from None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _captured_exporter_log() -> Iterator[_Capture]:
    """The exporter's log records, kept from the terminal: the failure becomes one line."""
    logger = logging.getLogger(_EXPORTER_LOGGER)
    capture = _Capture()
    propagate = logger.propagate
    logger.addHandler(capture)
    logger.propagate = False
    try:
        yield capture
    finally:
        logger.removeHandler(capture)
        logger.propagate = propagate


_NEEDLES = (
    "Connection refused",
    "Name or service not known",
    "timed out",
    "No route to host",
    "Temporary failure in name resolution",
    "Connection reset",
)


def _reason(capture: _Capture) -> str | None:
    """The exporter's last stated reason, short: an HTTP status or the connection error.

    Read from the exporter's own log records: "Failed to export %s batch code: %s, reason: %s"
    (a refusal) and "Transient error %s encountered ..." (retried until the timeout). None when
    it gave up before stating one (a connection error it had no time left to retry).
    """
    for record in reversed(capture.records):
        args = record.args if isinstance(record.args, tuple) else ()
        template = str(record.msg)
        if template.startswith("Failed to export") and "code:" in template and len(args) == 3:
            code, reason = args[1], args[2]
        elif template.startswith("Transient error") and args:
            code, reason = None, args[0]
        else:
            continue
        if code:
            return f"HTTP {code}" + (f" {reason}" if isinstance(reason, str) and reason else "")
        text = str(reason)
        found = next((n for n in _NEEDLES if n.lower() in text.lower()), None)
        return found.lower() if found else text[:160]
    return None


def _connect_error(url: str, timeout_s: float) -> str:
    """Why `url` took nothing when the exporter did not say: can its host and port be reached?"""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=max(timeout_s, 0.1)):
            return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return (exc.strerror or type(exc).__name__).lower()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("maserve-prefect")
    except PackageNotFoundError:
        return ""


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "build_spans",
    "otlp_json",
    "otlp_requests",
    "otlp_traces_url",
    "read_otlp_json",
    "send_otlp",
    "write_otlp_json",
]
