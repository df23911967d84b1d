"""A small OpenAI-compatible HTTP server for the `OpenAIEngine` tests (127.0.0.1, a free port).

It speaks the streaming SSE format of `/v1/completions` and `/v1/chat/completions` (chunked
transfer encoding, a usage chunk, `data: [DONE]`), answers `/v1/models`, `/version` and
`/metrics` like vLLM, and has knobs: fail the next K streaming calls with a status, drop the
connection mid-stream, delay each chunk, hold streams until released, reject `priority` with 400
(a vLLM not started with `--scheduling-policy priority`), return token ids when asked. Every
POST body is recorded in `received`, every GET path in `gets` and every request's `Authorization` header in
`authorizations`, so a test can assert what the engine sent; `/metrics` carries a TTFT histogram
that counts the streaming calls (1 ms each), as vLLM's counts the requests it served.

Output: `max_tokens` tokens (token id `100 + i`, text `" t<i>"`), unless a test sets
`num_output_tokens`. Prompt tokens: the length of a token-id prompt, else the number of
whitespace-separated words.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class StubConfig:
    models: list[dict[str, Any]] = field(
        default_factory=lambda: [{"id": "tiny", "max_model_len": 2048}]
    )
    vllm: bool = True
    priority_scheduling: bool = False
    return_token_ids: bool = True
    fail_next: int = 0
    fail_status: int = 503
    fail_message: str = "engine overloaded"
    drop_next: int = 0
    drop_after_chunks: int = 2
    chunk_delay_s: float = 0.0
    hold: threading.Event | None = None
    num_output_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass
class StubServer:
    config: StubConfig
    url: str = ""
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def streams(self) -> list[dict[str, Any]]:
        """Bodies of the streaming generation calls (what the engine sent, not the probes)."""
        with self.lock:
            return [body for _, body in self.received if body.get("stream")]

    def take(self, knob: str) -> bool:
        """Consume one unit of a countdown knob (`fail_next`, `drop_next`)."""
        with self.lock:
            left = getattr(self.config, knob)
            if left > 0:
                setattr(self.config, knob, left - 1)
                return True
            return False


def _prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return len(prompt.split())
    return sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))


def _make_handler(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    cfg = stub.config

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _json(self, status: int, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _text(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _note_auth(self) -> None:
            with stub.lock:
                stub.authorizations.append(self.headers.get("Authorization", ""))

        def do_GET(self) -> None:
            self._note_auth()
            with stub.lock:
                stub.gets.append(self.path)
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": cfg.models})
            elif self.path == "/version" and cfg.vllm:
                self._json(200, {"version": "0.0.0-stub"})
            elif self.path == "/metrics":
                body = "vllm:num_requests_running 0\n" if cfg.vllm else "up 1\n"
                if cfg.vllm:  # a TTFT histogram: every streaming call, 1 ms each
                    n = len(stub.streams())
                    body += (
                        "".join(
                            f'vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {n}\n'
                            for le in ("0.001", "0.01", "+Inf")
                        )
                        + f"vllm:time_to_first_token_seconds_sum {n * 0.001}\n"
                    )
                    body += f"vllm:time_to_first_token_seconds_count {n}\n"
                self._text(200, body)
            else:
                self._json(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            self._note_auth()
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            with stub.lock:
                stub.received.append((self.path, body))
            chat = self.path == "/v1/chat/completions"
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}"}})
                return
            if "priority" in body and not cfg.priority_scheduling:
                msg = "Priority scheduling is not enabled (use --scheduling-policy priority)"
                self._json(400, {"object": "error", "message": msg, "code": 400})
                return
            if body.get("stream") and stub.take("fail_next"):
                self._json(cfg.fail_status, {"object": "error", "message": cfg.fail_message})
                return
            n = cfg.num_output_tokens
            if n is None:
                n = int(body.get("min_tokens") or 0) if body.get("ignore_eos") else 0
                n = max(n, int(body.get("max_tokens") or 16))
            usage = {
                "prompt_tokens": _prompt_tokens(body),
                "completion_tokens": n,
                "total_tokens": _prompt_tokens(body) + n,
                "prompt_tokens_details": {"cached_tokens": cfg.cached_tokens},
            }
            with_ids = cfg.return_token_ids and bool(body.get("return_token_ids"))
            if not body.get("stream"):
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": "".join(f" t{i}" for i in range(n)),
                    "finish_reason": "length",
                }
                if with_ids:
                    choice["token_ids"] = [100 + i for i in range(n)]
                self._json(
                    200,
                    {
                        "id": "cmpl-x",
                        "object": "text_completion",
                        "created": 0,
                        "model": body.get("model"),
                        "choices": [choice],
                        "usage": usage,
                    },
                )
                return
            self._stream(body, n, usage, chat, with_ids, drop=stub.take("drop_next"))

        def _chunk(self, payload: str) -> None:
            data = payload.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _stream(
            self,
            body: dict[str, Any],
            n: int,
            usage: dict[str, Any],
            chat: bool,
            with_ids: bool,
            drop: bool,
        ) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            base = {"id": "x", "created": 0, "model": body.get("model")}
            base["object"] = "chat.completion.chunk" if chat else "text_completion"
            if cfg.hold is not None:
                cfg.hold.wait(10.0)
            try:
                if chat:
                    role = {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                    self._chunk("data: " + json.dumps(base | {"choices": [role]}) + "\n\n")
                for i in range(n):
                    if drop and i == cfg.drop_after_chunks:
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)  # cut the stream without a final chunk
                        return
                    if cfg.chunk_delay_s:
                        time.sleep(cfg.chunk_delay_s)
                    choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                    if i == n - 1:
                        choice["finish_reason"] = "length"
                    if chat:
                        choice["delta"] = {"content": f" t{i}"}
                    else:
                        choice["text"] = f" t{i}"
                    if with_ids:
                        choice["token_ids"] = [100 + i]
                    self._chunk("data: " + json.dumps(base | {"choices": [choice]}) + "\n\n")
                if body.get("stream_options", {}).get("include_usage"):
                    tail = base | {"choices": [], "usage": usage}
                    self._chunk("data: " + json.dumps(tail) + "\n\n")
                self._chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.close_connection = True

    return Handler


@contextmanager
def serve(config: StubConfig | None = None) -> Iterator[StubServer]:
    """Run a stub server on a free 127.0.0.1 port for the `with` block."""
    stub = StubServer(config or StubConfig())
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(stub))
    httpd.daemon_threads = True
    stub.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield stub
    finally:
        if stub.config.hold is not None:
            stub.config.hold.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(5.0)
