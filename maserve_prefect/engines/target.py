"""Which engine a run or replay targets: the embedded simulator or an OpenAI-compatible server.

One idea: the CLI's `--engine` text is parsed once into an `EngineTarget`; everything downstream
branches on `target.is_sim` / `target.is_fleet` and never re-parses strings. `fleet` names the
endpoints the pool file lists per deployment (`replicas:`; `engines.openai.fleet`). `openai:URL` names a server's base URL
(with or without the `/v1` suffix); `openai:URL#MODEL` pins the served model when the server has
several.

Credentials never travel as text. `str(target)` — what manifests, bundles, summaries, Prefect
artifacts and messages show — never holds a secret:

- **user info** in the URL (`openai:http://user:PASSWORD@host`) is sent as HTTP basic auth; it is
  cut from `base_url` at parse time and kept in this process only, so `str(target)` shows
  `http://***@host`. Parsing that redacted text again in the same process finds the credentials
  (a scenario's `engine:` field is replaced by its redacted form when the file is read); in
  another process it is refused with a message saying to give them again.
- **an API key** is read from an environment variable the target *names*:
  `openai:http://host:8000?api_key_env=NAME` (or the commands' `--api-key-env NAME`), sent as
  `Authorization: Bearer <key>`. Only the variable's name is part of `str(target)`; the key is
  read when a request is built. Without one, requests carry `Bearer EMPTY` (vLLM ignores it unless
  started with `--api-key`).

Examples:
    >>> parse_engine("sim").is_sim, parse_engine("fleet").is_fleet
    (True, True)
    >>> t = parse_engine("openai:http://127.0.0.1:8000/v1#tiny")
    >>> (t.kind, t.base_url, t.model)
    ('openai', 'http://127.0.0.1:8000', 'tiny')
    >>> str(parse_engine("openai:http://u:pw@10.0.0.1:8000/v1#m"))
    'openai:http://***@10.0.0.1:8000#m'
    >>> str(parse_engine("openai:https://gpu.example?api_key_env=VLLM_KEY"))
    'openai:https://gpu.example?api_key_env=VLLM_KEY'
"""

from __future__ import annotations

import base64
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from maserve_prefect.errors import ConfigError, UnsupportedError

REDACTED = "***"
"""What `str(target)` shows in place of a URL's user info."""

NO_KEY = "EMPTY"
"""The bearer token sent when no API key is configured (what the OpenAI clients send)."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Basic-auth credentials by redacted base URL, for this process only (see the module docstring).
_CREDENTIALS: dict[str, tuple[str, str]] = {}
_CREDENTIALS_LOCK = threading.Lock()


class ClientAuth(TypedDict):
    """What an OpenAI-compatible client needs to authenticate (`EngineTarget.client_auth`)."""

    api_key: str
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """A parsed `--engine` value.

    Attributes:
        kind: "sim", "openai" or "fleet" (the pool file's endpoints).
        base_url: the server root without a trailing `/v1` and without user info (openai only).
        model: the served model name to address, or None for the server's only model.
        api_key_env: the environment variable holding the API key, or None.
        basic_auth: (user, password) from the URL's user info; never shown or compared.
    """

    kind: str
    base_url: str = ""
    model: str | None = None
    api_key_env: str | None = None
    basic_auth: tuple[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def is_sim(self) -> bool:
        return self.kind == "sim"

    @property
    def is_fleet(self) -> bool:
        return self.kind == "fleet"

    def __str__(self) -> str:
        if self.is_sim or self.is_fleet:
            return self.kind
        url = _with_userinfo(self.base_url, REDACTED) if self.basic_auth else self.base_url
        query = f"?api_key_env={self.api_key_env}" if self.api_key_env else ""
        return f"openai:{url}{query}" + (f"#{self.model}" if self.model else "")

    def with_api_key_env(self, name: str | None) -> EngineTarget:
        """This target with its API key read from `name` (None: unchanged).

        Raises:
            ConfigError: `name` is not an environment variable name.
        """
        if name is None:
            return self
        if self.is_sim:
            raise ConfigError("--api-key-env applies to an OpenAI-compatible engine, not 'sim'")
        if self.is_fleet:
            raise ConfigError(
                "--api-key-env does not apply to --engine fleet: give each endpoint its own "
                "`?api_key_env=NAME` in the pool file's `replicas:`"
            )
        return _checked(replace(self, api_key_env=_env_name(name, "--api-key-env")))

    def api_key(self, env: Mapping[str, str] | None = None) -> str:
        """The bearer token: the named variable's value, else `EMPTY`.

        Raises:
            ConfigError: the named variable is unset or empty.

        Examples:
            >>> parse_engine("openai:http://h:1?api_key_env=K").api_key({"K": "s3cret"})
            's3cret'
            >>> parse_engine("openai:http://h:1").api_key({})
            'EMPTY'
        """
        if self.api_key_env is None:
            return NO_KEY
        env = os.environ if env is None else env
        value = env.get(self.api_key_env, "")
        if not value:
            raise ConfigError(
                f"the engine's API key variable {self.api_key_env} is not set (named by "
                f"api_key_env / --api-key-env); export {self.api_key_env}=<key> first"
            )
        return value

    def auth_headers(self) -> dict[str, str]:
        """Extra request headers for basic auth from the URL's user info (empty without).

        Examples:
            >>> parse_engine("openai:http://u:p@h:1").auth_headers()
            {'Authorization': 'Basic dTpw'}
        """
        if self.basic_auth is None:
            return {}
        token = base64.b64encode(":".join(self.basic_auth).encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def client_auth(self) -> ClientAuth:
        """Keyword arguments for `OpenAIEngine`, `discover` and `drain_server`: `api_key` and
        `headers` (resolved now, from the environment).

        Raises:
            ConfigError: the named API key variable is unset.
        """
        return ClientAuth(api_key=self.api_key(), headers=self.auth_headers())


def parse_single_engine(text: str | EngineTarget, what: str) -> EngineTarget:
    """`parse_engine` for commands that drive the simulator or one server (`what` names the
    command in the message): `fleet` is refused.

    Raises:
        UnsupportedError: `fleet`.
        ConfigError: as `parse_engine`.
    """
    target = parse_engine(text)
    if target.is_fleet:
        raise UnsupportedError(
            f"--engine fleet: {what} runs on 'sim' or one 'openai:URL' for now; a fleet of "
            "endpoints drives `maserve run` (native runs)"
        )
    return target


def _env_name(name: str, where: str) -> str:
    if not _ENV_NAME.match(name):
        raise ConfigError(  # the value is not shown: it may be the key itself
            f"{where}: expected the NAME of an environment variable holding the API key "
            "(letters, digits, underscores, e.g. VLLM_API_KEY), never the key itself"
        )
    return name


def _with_userinfo(url: str, userinfo: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


def _checked(target: EngineTarget) -> EngineTarget:
    if target.basic_auth is not None and target.api_key_env is not None:
        raise ConfigError(
            f"--engine {target}: give the server's credentials one way — user info in the URL "
            "(HTTP basic auth) or an API key (api_key_env / --api-key-env), not both"
        )
    return target


def _bad(shown: str, why: str) -> ConfigError:
    return ConfigError(f"--engine {shown!r}: {why}")


def parse_engine(text: str | EngineTarget) -> EngineTarget:
    """Parse `sim`, `fleet` or `openai:URL[?api_key_env=NAME][#MODEL]` (module docstring).

    Raises:
        ConfigError: anything else, naming the accepted forms (a message never repeats a
            password); redacted user info whose credentials this process does not hold.
    """
    if isinstance(text, EngineTarget):
        return text
    if text in ("sim", "fleet"):
        return EngineTarget(text)
    if not text.startswith("openai:"):
        raise _bad(
            _redact_text(text),
            "expected 'sim' or 'openai:URL' (e.g. openai:http://127.0.0.1:8000)",
        )
    rest, _, model = text[len("openai:") :].partition("#")
    rest, _, query = rest.partition("?")
    shown = _redact_text(text)
    try:
        parts = urlsplit(rest.strip())
        parts.port  # noqa: B018 — raises ValueError on a malformed port
    except ValueError as exc:
        raise _bad(shown, f"not a URL ({exc}); expected openai:http://HOST:PORT") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _bad(shown, "expected openai:http://HOST:PORT (the server's base URL)")
    api_key_env = None
    if query:
        fields = parse_qs(query, keep_blank_values=True)
        unknown = sorted(set(fields) - {"api_key_env"})
        if unknown or len(fields.get("api_key_env", [])) != 1:
            raise _bad(shown, "the only query field is one `?api_key_env=NAME`")
        api_key_env = _env_name(fields["api_key_env"][0], "api_key_env")
    host = parts.netloc.rpartition("@")[2]
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    base_url = urlunsplit((parts.scheme, host, path, "", ""))
    basic: tuple[str, str] | None = None
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        basic = _remember(base_url, userinfo, shown)
    return _checked(EngineTarget("openai", base_url, model or None, api_key_env, basic))


def _remember(base_url: str, userinfo: str, shown: str) -> tuple[str, str]:
    """Keep new credentials for `base_url`, or find those a redacted URL stands for."""
    with _CREDENTIALS_LOCK:
        if userinfo == REDACTED:
            found = _CREDENTIALS.get(base_url)
            if found is None:
                raise _bad(
                    shown,
                    "its user info was redacted when it was stored; give the URL with the "
                    "credentials again (or an API key with --api-key-env)",
                )
            return found
        user, _, password = userinfo.partition(":")
        creds = (unquote(user), unquote(password))
        _CREDENTIALS[base_url] = creds
        return creds


# Everything between `://` and the last `@` of a URL: a password may hold `/`, `#` or `?`.
_USERINFO = re.compile(r"(?<=://)[^\s'\"]*@")


_QUERY = re.compile(r"\?[^#\s'\"]*")


def _redact_text(text: str) -> str:
    """`text` with URL user info replaced by `***` and any query by `?...` — for messages about
    input that did not parse (a query may hold a key put where a variable name belongs).

    Examples:
        >>> _redact_text("openai:http://me:pw@h:1/v1?api_key=sk-1#m")
        'openai:http://***@h:1/v1?...#m'
    """
    return _QUERY.sub("?...", _USERINFO.sub(f"{REDACTED}@", text))


def redact(text: str) -> str:
    """`text` with every URL's user info replaced by `***` — for text that may quote an engine
    URL the user typed (errors from libraries, echoed options).

    Examples:
        >>> redact("cannot reach http://a:b@h:1 (refused)")
        'cannot reach http://***@h:1 (refused)'
    """
    return _USERINFO.sub(f"{REDACTED}@", text)
