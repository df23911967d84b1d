"""Which engine a run or replay targets: the embedded simulator or an OpenAI-compatible server.

One idea: the CLI's `--engine` text is parsed once into an `EngineTarget`; everything downstream
branches on `target.is_sim` and never re-parses strings. `openai:URL` names a server's base URL
(with or without the `/v1` suffix); `openai:URL#MODEL` pins the served model when the server has
several.

Examples:
    >>> parse_engine("sim").is_sim
    True
    >>> t = parse_engine("openai:http://127.0.0.1:8000/v1#tiny")
    >>> (t.kind, t.base_url, t.model)
    ('openai', 'http://127.0.0.1:8000', 'tiny')
"""

from __future__ import annotations

from dataclasses import dataclass

from maserve_prefect.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """A parsed `--engine` value.

    Attributes:
        kind: "sim" or "openai".
        base_url: the server root without a trailing `/v1` (openai only).
        model: the served model name to address, or None for the server's only model.
    """

    kind: str
    base_url: str = ""
    model: str | None = None

    @property
    def is_sim(self) -> bool:
        return self.kind == "sim"

    def __str__(self) -> str:
        if self.is_sim:
            return "sim"
        return f"openai:{self.base_url}" + (f"#{self.model}" if self.model else "")


def parse_engine(text: str | EngineTarget) -> EngineTarget:
    """Parse `sim` or `openai:URL[#MODEL]`.

    Raises:
        ConfigError: anything else, naming the accepted forms.
    """
    if isinstance(text, EngineTarget):
        return text
    if text == "sim":
        return EngineTarget("sim")
    if text.startswith("openai:"):
        rest = text[len("openai:") :]
        url, _, model = rest.partition("#")
        url = url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"--engine {text!r}: expected openai:http://HOST:PORT (the server's base URL)"
            )
        return EngineTarget("openai", url, model or None)
    raise ConfigError(
        f"--engine {text!r}: expected 'sim' or 'openai:URL' (e.g. openai:http://127.0.0.1:8000)"
    )
