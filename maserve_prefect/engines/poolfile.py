"""Pool files: which devices a run has, which deployments exist, and where replicas go.

A pool file (YAML) names devices (`"H100:0"`), deployments (model + serving config), placements
(one replica of a deployment on a device — the caller picks placement), optional aliases from the
deployment names specs use to pool deployments, and a `default` deployment for names the file
does not know. `build_sim_pool` loads every placement on a simulated pool and runs the clock until
all loads are done, so a run starts on a warm pool.

A fleet: a deployment may list the OpenAI-compatible endpoints that serve it,
`replicas: [http://a:8000, http://b:8000#MODEL]` (each `URL[?api_key_env=NAME][#MODEL]`, as
after `openai:` in `--engine`); `maserve run --engine fleet` places on them
(`engines.openai.fleet`). A file whose deployments all list endpoints may leave out `devices` and
`placements` (it then describes only a fleet); one with both runs on the simulator and the fleet.
Endpoints are stored redacted (user info as `***`, credentials kept in this process only).

Examples:
    >>> pf = default_pool_file()
    >>> pf.resolve("llama-3.1-8b")
    'main'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from maserve_prefect.clock.kernel import Kernel
from maserve_prefect.engines.sim.pool.device import Deployment
from maserve_prefect.engines.sim.pool.sim_pool import SimPool
from maserve_prefect.engines.target import EngineTarget, parse_engine, redact
from maserve_prefect.errors import ConfigError
from maserve_prefect.protocol.outcomes import Acceptance
from maserve_prefect.yamlfiles import read_yaml_mapping

DEFAULT_POOL = Path(__file__).parent / "pools" / "default.yaml"


class DeploymentEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    model: str
    version: str = ""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    """Context window (vLLM's `--max-model-len`); None: the model's `max_position_embeddings`."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Output budget of every call to this deployment (a call's own smaller `max_tokens` wins),
    as a harness or gateway sets one (e.g. GPT Researcher's 2,048-token budget, MAServeBench
    §5); a drawn output length is capped at it. None: no budget (the context window only)."""
    enable_prefix_caching: bool | None = None
    """vLLM's `--enable-prefix-caching` / `--no-enable-prefix-caching`; None: vLLM's default (on)."""
    kv_cache_gib: float | None = Field(default=None, gt=0)
    host_kv_gib: float | None = Field(default=None, gt=0)
    """A second KV tier in host memory (total across TP ranks, like vLLM's
    `--kv-offloading-size`); None: GPU KV only."""
    enforce_eager: bool = False
    replicas: tuple[str, ...] = ()
    """OpenAI-compatible endpoints serving this deployment (a fleet; module docstring)."""

    @field_validator("replicas", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("replicas")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # redacted at once: the pool is recorded in manifests; parse_engine keeps credentials
        out = []
        for v in value:
            try:
                out.append(str(endpoint_target(v)).removeprefix("openai:"))
            except ConfigError as exc:  # pydantic reports a ValueError with the field's place
                why = str(exc).split("': ", 1)[-1].replace("openai:http", "http")
                raise ValueError(f"endpoint {redact(v)!r}: {why}") from None
        return tuple(out)

    def endpoints(self) -> tuple[EngineTarget, ...]:
        """The deployment's endpoints, parsed (credentials found again in this process)."""
        return tuple(endpoint_target(v) for v in self.replicas)

    def to_deployment(self) -> Deployment:
        sched: list[tuple[str, Any]] = []
        if self.max_num_seqs is not None:
            sched.append(("max_num_seqs", self.max_num_seqs))
        if self.max_num_batched_tokens is not None:
            sched.append(("max_num_batched_tokens", self.max_num_batched_tokens))
        if self.max_model_len is not None:
            sched.append(("max_model_len", self.max_model_len))
        if self.enable_prefix_caching is not None:
            sched.append(("enable_prefix_caching", self.enable_prefix_caching))
        return Deployment(
            name=self.name,
            model=self.model,
            version=self.version,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_bytes=None if self.kv_cache_gib is None else int(self.kv_cache_gib * 2**30),
            scheduler=tuple(sched),
            enforce_eager=self.enforce_eager,
        )


def endpoint_target(text: str) -> EngineTarget:
    """A `replicas` entry (`http://HOST:PORT[?api_key_env=NAME][#MODEL]`) as an engine target.

    Raises:
        ConfigError: not such a URL (the message shows it redacted).
    """
    return parse_engine(text if text.startswith("openai:") else f"openai:{text}")


class Placement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment: str
    device: str


class PoolFile(BaseModel):
    """A parsed pool file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: tuple[str, ...] = ()
    deployments: tuple[DeploymentEntry, ...] = Field(min_length=1)
    placements: tuple[Placement, ...] = ()
    aliases: dict[str, str] = Field(default_factory=dict)
    default: str | None = None
    source: str = ""

    def names(self) -> list[str]:
        return [d.name for d in self.deployments]

    def resolve(self, name: str) -> str:
        """The pool deployment that serves spec deployment `name`."""
        if name in self.names():
            return name
        if name in self.aliases:
            return self.aliases[name]
        if self.default is not None:
            return self.default
        raise ConfigError(
            f"pool {self.source or '(inline)'}: no deployment {name!r} (deployments: "
            f"{', '.join(self.names())}); add it, an alias, or a `default`"
        )

    @property
    def is_fleet_only(self) -> bool:
        """Every deployment lists endpoints and there is no simulated device."""
        return not self.devices and all(d.replicas for d in self.deployments)

    def check(self) -> PoolFile:
        where = f"pool file {self.source or '(inline)'}"
        names = self.names()
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: deployment names must be unique, got {names}")
        if not self.is_fleet_only:
            for key in ("devices", "placements"):
                if not getattr(self, key):
                    raise ConfigError(
                        f"{where}: {key}: give at least one (or list every deployment's "
                        "endpoints under `replicas:` for a file that describes only a fleet)"
                    )
        self._check_endpoints(where)
        for p in self.placements:
            if p.deployment not in names:
                raise ConfigError(f"{where}: placement names unknown deployment {p.deployment!r}")
            if p.device not in self.devices:
                raise ConfigError(f"{where}: placement names unknown device {p.device!r}")
        for alias, target in self.aliases.items():
            if target not in names:
                raise ConfigError(f"{where}: alias {alias!r} points to unknown {target!r}")
        if self.default is not None and self.default not in names:
            raise ConfigError(f"{where}: default {self.default!r} is not a deployment")
        return self

    def _check_endpoints(self, where: str) -> None:
        seen: dict[str, str] = {}
        for dep in self.deployments:
            for url, target in zip(dep.replicas, dep.endpoints(), strict=True):
                key = target.base_url
                if key in seen:
                    raise ConfigError(
                        f"{where}: deployment {dep.name}: endpoint {url} is listed twice (also "
                        f"under deployment {seen[key]}); list each endpoint once"
                    )
                seen[key] = dep.name


def load_pool_file(path: str | Path) -> PoolFile:
    """Parse and check a pool file; errors name the file and the field."""
    path = Path(path)
    data = read_yaml_mapping(path, "pool file")
    try:
        return PoolFile.model_validate({**data, "source": str(path)}).check()
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"].removeprefix("Value error, ")
        raise ConfigError(f"pool file {path}: {_where(first['loc'], data)}: {msg}") from None


def _where(loc: tuple[int | str, ...], data: dict[str, Any]) -> str:
    """A validation error's location, naming a deployment by its name when it has one."""
    text = ".".join(str(p) for p in loc)
    deps = data.get("deployments")
    if len(loc) >= 2 and loc[0] == "deployments" and isinstance(loc[1], int):
        entry = deps[loc[1]] if isinstance(deps, list) and loc[1] < len(deps) else None
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            rest = ".".join(str(p) for p in loc[2:])
            return f"deployment {entry['name']}" + (f": {rest}" if rest else "")
    return text


def default_pool_file() -> PoolFile:
    """The shipped default pool."""
    return load_pool_file(DEFAULT_POOL)


def build_sim_pool(pool_file: PoolFile, kernel: Kernel) -> SimPool:
    """A simulated pool with every placement loaded (the kernel runs until loads finish).

    Raises:
        ConfigError: the file describes only a fleet (no devices), or a placement does not fit.
    """
    require_devices(pool_file)
    host = {d.name: int(d.host_kv_gib * 2**30) for d in pool_file.deployments if d.host_kv_gib}
    pool = SimPool(kernel, pool_file.devices, host_kv_bytes=host)
    deps = {d.name: d.to_deployment() for d in pool_file.deployments}
    for p in pool_file.placements:
        ticket = pool.load(deps[p.deployment], p.device)
        if ticket.acceptance is not Acceptance.ACCEPTED:
            raise ConfigError(
                f"pool file {pool_file.source or '(inline)'}: cannot place {p.deployment} on "
                f"{p.device}: {ticket.reason}"
            )
    kernel.run()
    return pool


def require_devices(pool_file: PoolFile) -> None:
    """Refuse to simulate a file that lists no devices (it describes only a fleet)."""
    if not pool_file.devices:
        raise ConfigError(
            f"pool file {pool_file.source or '(inline)'} lists no devices, only endpoints: run "
            "it with `--engine fleet`, or add `devices` and `placements` to simulate it"
        )
