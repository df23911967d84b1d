"""What an OpenAI-compatible server can do, found out once by asking it (`discover`).

The one idea: capabilities are *observed*, never assumed. `GET /v1/models` lists the models
(and vLLM's `max_model_len`), `GET /version` and `GET /metrics` (a 200 holding `vllm:` series)
identify vLLM, and three tiny completions probe what the request mapping relies on:

* token-id prompts — `prompt=[1, 2, 3]` must come back with `usage.prompt_tokens == 3` (exact
  input counts are what replays need); the same probe asks for `return_token_ids` and records
  whether the server returned them;
* length lock — `min_tokens == max_tokens == 3` with `ignore_eos` must yield exactly 3 tokens;
* priority scheduling — `priority=1`: vLLM answers 400 unless started with
  `--scheduling-policy priority`. Only vLLM validates this field; other servers may accept and
  ignore it, so priority scheduling is claimed for vLLM servers only (never pretend).

`kv_events` is not probed: the KV-event subscriber lives elsewhere, so the flag is True exactly
when the caller passes the server's `kv_events_endpoint`.

Examples:
    >>> normalize_base_url("http://127.0.0.1:8000/v1/")
    'http://127.0.0.1:8000'
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from maserve_prefect.errors import ConfigError, DiscoveryTimeoutError, EngineError

__all__ = ["ServerInfo", "discover", "normalize_base_url"]

_PROBE_IDS = [1, 2, 3]
_LOCK_TOKENS = 3


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What `discover` found.

    Attributes:
        base_url: the server root (no trailing `/v1`).
        models: every model id the server lists.
        model: the model this engine uses.
        max_model_len: the model's context length, when the server says (vLLM does).
        version: the server version from `/version` (vLLM), else None.
        metrics_available: `/metrics` answers with `vllm:` series.
        priority_scheduling: the server schedules by request priority.
        length_lock: `min_tokens` + `ignore_eos` yield exactly the asked length.
        token_id_prompts: `/v1/completions` takes `prompt=[ids...]` with exact counts.
        returns_token_ids: responses carry output token ids when asked (`return_token_ids`).
        kv_events: KV-cache events are published (the caller passed the endpoint).
        kv_events_endpoint: where they are published, if known.
    """

    base_url: str
    models: tuple[str, ...]
    model: str
    max_model_len: int | None = None
    version: str | None = None
    metrics_available: bool = False
    priority_scheduling: bool = False
    length_lock: bool = False
    token_id_prompts: bool = False
    returns_token_ids: bool = False
    kv_events: bool = False
    kv_events_endpoint: str | None = None

    @property
    def is_vllm(self) -> bool:
        """The server identified itself as vLLM (`/version` or `vllm:` metrics)."""
        return self.version is not None or self.metrics_available


def normalize_base_url(base_url: str) -> str:
    """The server root: trailing slashes and a trailing `/v1` removed.

    Raises:
        ConfigError: not an http(s) URL.
    """
    url = base_url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"engine URL {base_url!r} is not an http(s) URL; use e.g. "
            "--engine openai:http://127.0.0.1:8000"
        )
    return url


def _unreachable(url: str, exc: Exception) -> EngineError:
    return EngineError(
        f"cannot reach the OpenAI-compatible server at {url} ({type(exc).__name__}: {exc}); "
        "start the server or check --engine openai:URL"
    )


class _Deadline:
    """One time budget for every HTTP call of a discovery (each call gets what is left)."""

    def __init__(self, url: str, total_s: float) -> None:
        self.url, self.total_s = url, total_s
        self.end = time.monotonic() + total_s

    def left(self) -> float:
        """Seconds left for the next call.

        Raises:
            EngineError: the budget is spent.
        """
        left = self.end - time.monotonic()
        if left <= 0:
            raise DiscoveryTimeoutError(
                f"discovering {self.url} took longer than {self.total_s:g} s (the arm's "
                "timeout); the server accepts connections but does not answer in time — check "
                "that it is not hung or overloaded, or raise --timeout"
            )
        return left


def _get(client: httpx.Client, path: str, deadline: _Deadline) -> httpx.Response | None:
    """GET that answers None on any transport error or non-200 (optional endpoints)."""
    try:
        resp = client.get(path, timeout=deadline.left())
    except httpx.HTTPError:
        return None
    return resp if resp.status_code == 200 else None


def _post(
    client: httpx.Client, body: Mapping[str, Any], deadline: _Deadline
) -> tuple[int, dict[str, Any]]:
    """POST a non-streaming completion; (status, JSON body or {})."""
    try:
        resp = client.post("/v1/completions", json=dict(body), timeout=deadline.left())
    except httpx.HTTPError:
        return 0, {}
    try:
        data = resp.json()
    except ValueError:
        data = {}
    return resp.status_code, data if isinstance(data, dict) else {}


def _usage(data: Mapping[str, Any], key: str) -> int | None:
    usage = data.get("usage")
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


def _pick_model(
    url: str, listed: list[dict[str, Any]], model: str | None
) -> tuple[str, int | None]:
    ids = [str(m.get("id")) for m in listed]
    if not ids:
        raise EngineError(f"the server at {url} lists no models; wait until it has loaded one")
    if model is None:
        if len(ids) > 1:
            raise ConfigError(
                f"the server at {url} serves {len(ids)} models {ids}; pick one with model=..."
            )
        model = ids[0]
    if model not in ids:
        raise ConfigError(f"model {model!r} is not served at {url}; it serves {ids}")
    entry = listed[ids.index(model)]
    max_len = entry.get("max_model_len")
    return model, max_len if isinstance(max_len, int) else None


def _probe(client: httpx.Client, model: str, is_vllm: bool, deadline: _Deadline) -> dict[str, bool]:
    base = {"model": model, "prompt": _PROBE_IDS, "max_tokens": 1, "temperature": 0.0}
    status, data = _post(client, base | {"return_token_ids": True}, deadline)
    returns_ids = False
    if status == 200:
        choices = data.get("choices") or [{}]
        returns_ids = isinstance(choices[0].get("token_ids"), list)
    else:
        status, data = _post(client, base, deadline)
    token_ids = status == 200 and _usage(data, "prompt_tokens") in (None, len(_PROBE_IDS))
    lock_body = base | {"max_tokens": _LOCK_TOKENS, "min_tokens": _LOCK_TOKENS, "ignore_eos": True}
    if not token_ids:
        lock_body["prompt"] = "Hello"
    status, data = _post(client, lock_body, deadline)
    lock = status == 200 and _usage(data, "completion_tokens") == _LOCK_TOKENS
    prio_body = (base if token_ids else base | {"prompt": "Hello"}) | {"priority": 1}
    priority = is_vllm and _post(client, prio_body, deadline)[0] == 200
    return {
        "token_id_prompts": token_ids,
        "returns_token_ids": returns_ids,
        "length_lock": lock,
        "priority_scheduling": priority,
    }


def discover(
    base_url: str,
    *,
    model: str | None = None,
    api_key: str = "EMPTY",
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    kv_events_endpoint: str | None = None,
    probe: bool = True,
) -> ServerInfo:
    """Ask the server at `base_url` what it serves and can do (see the module docstring).

    Args:
        base_url: server root, with or without `/v1`.
        model: the model to use; None picks the only one served.
        api_key: bearer token (vLLM ignores it unless started with `--api-key`).
        headers: extra request headers (`EngineTarget.auth_headers`: basic auth replaces the
            bearer token).
        timeout_s: the whole discovery's time budget, shared by its HTTP calls (the probes
            generate at most 3 tokens); a replay passes its arm's timeout.
        kv_events_endpoint: the server's KV-event publisher, if the caller subscribes to it.
        probe: run the three tiny completions (False: report those features as absent).

    Raises:
        EngineError: the server cannot be reached, or `/v1/models` fails or lists nothing.
        ConfigError: a bad URL, an unknown model, or several models and `model=None`.
    """
    url = normalize_base_url(base_url)
    sent = {"Authorization": f"Bearer {api_key}"} | dict(headers or {})
    deadline = _Deadline(url, timeout_s)
    with httpx.Client(base_url=url, headers=sent, timeout=timeout_s) as client:
        try:
            resp = client.get("/v1/models", timeout=deadline.left())
        except httpx.HTTPError as exc:
            raise _unreachable(url, exc) from exc
        if resp.status_code != 200:
            raise EngineError(
                f"GET {url}/v1/models answered {resp.status_code}: {resp.text[:200]!r}; "
                "is this an OpenAI-compatible server (check --engine openai:URL and the API key)?"
            )
        listed = resp.json().get("data") or []
        chosen, max_len = _pick_model(url, [m for m in listed if isinstance(m, dict)], model)
        version_resp = _get(client, "/version", deadline)
        version = None
        if version_resp is not None:
            try:
                found_version = version_resp.json().get("version")
            except (ValueError, AttributeError):
                found_version = None
            version = str(found_version) if found_version is not None else None
        metrics_resp = _get(client, "/metrics", deadline)
        metrics = metrics_resp is not None and "vllm:" in metrics_resp.text
        found = (
            _probe(client, chosen, version is not None or metrics, deadline)
            if probe
            else dict.fromkeys(
                ("token_id_prompts", "returns_token_ids", "length_lock", "priority_scheduling"),
                False,
            )
        )
    return ServerInfo(
        base_url=url,
        models=tuple(str(m.get("id")) for m in listed if isinstance(m, dict)),
        model=chosen,
        max_model_len=max_len,
        version=version,
        metrics_available=metrics,
        kv_events=kv_events_endpoint is not None,
        kv_events_endpoint=kv_events_endpoint,
        **found,
    )
