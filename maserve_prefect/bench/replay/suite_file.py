"""The replay suite file (`kind: replay`): a named set of replay scenarios, run at a scale.

One idea: a replay suite adds *nothing* to its scenarios but a size. Each scenario file
(`replay.scenario`) already fixes its trace sets, arrivals, arms and deadlines; the suite only
picks a scale (`demo` for CI, `full` by hand), whose overrides are a small whitelisted set applied
to the parsed scenario mapping *before* validation (`apply_scale`), so a scaled scenario is
checked exactly like a hand-written one. There are no per-suite engine knobs: the simulator
calibration and pools are the scenarios' and the catalog's. The header fields (name, kind,
description, schedule) are every suite's (`bench.suite_base`); `kind: replay` is the default.

    name: fj-barrier                       # suite (and deployment) name
    kind: replay
    description: Fork-join under barrier vs DAG release.
    scenarios:                             # scenario YAMLs, relative to this file
      - scenarios/fj_barrier.yaml
      - path: scenarios/debate.yaml        # per-scenario scales override the suite's, key by key
        scales: {full: {users: 64}}
    scales:
      demo: {users: 4, blocks: 1}
      full: {users: 32, blocks: 5, rate_per_s: 2.0}
    schedule: {interval_s: 3600}           # or {cron: "0 3 * * *"}, or null / left out
    analysis: maserve_prefect.bench.replay.findings.fj_rows   # optional: fn(results) -> list[row dict]

Scale override keys (`SCALE_KEYS`; anything else is an error naming the key):

- `users`: `native.users` of every native cohort (trace-set size).
- `blocks`: the number of paired blocks.
- `rate_per_s`: `arrivals.rate_per_s` (Poisson arrivals only).
- `closed_loop_users`: `arrivals.users` (closed-loop arrivals only).
- `window_end_s`: `window.end_s` (end of the measurement window).

`analysis` names `module.function` with the signature
`fn(results: dict[str, ScenarioResult]) -> list[dict[str, Any]]` (scenario name → result); its
rows become the suite's findings table.

Examples:
    >>> s = ReplaySuite.model_validate({"name": "s", "kind": "replay", "scenarios": ["a.yaml"],
    ...                                 "scales": {"demo": {"users": 2}}})
    >>> s.scale_names(), s.entries()[0].path.name
    (('demo', 'full'), 'a.yaml')
    >>> apply_scale({"name": "x", "blocks": 3}, {"blocks": 1}, source="x.yaml")["blocks"]
    1
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import Field, model_validator

from maserve_prefect.bench.suite_base import FrozenModel, SuiteBase
from maserve_prefect.errors import ConfigError
from maserve_prefect.replay.scenario import Scenario, parse_scenario
from maserve_prefect.yamlfiles import read_yaml_mapping

ScaleName = Literal["demo", "full"]
SCALES: tuple[str, ...] = ("demo", "full")
SCALE_KEYS: tuple[str, ...] = ("users", "blocks", "rate_per_s", "closed_loop_users", "window_end_s")

Overrides = dict[str, float | int]


class ScenarioEntry(FrozenModel):
    """One scenario of a suite, with per-scenario scale overrides (merged over the suite's)."""

    path: Path
    scales: dict[ScaleName, Overrides] = Field(default_factory=dict)


class ReplaySuite(SuiteBase):
    """A parsed `kind: replay` suite file (see the module docstring)."""

    kind: Literal["replay"] = "replay"
    scenarios: tuple[Path | ScenarioEntry, ...] = Field(min_length=1)
    scales: dict[ScaleName, Overrides] = Field(default_factory=dict)
    analysis: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*\.[A-Za-z_]\w*$")

    @model_validator(mode="after")
    def _known_keys(self) -> ReplaySuite:
        for where, scales in [("scales", self.scales)] + [
            (f"scenarios.{e.path}.scales", e.scales) for e in self.entries()
        ]:
            for scale, over in scales.items():
                bad = sorted(set(over) - set(SCALE_KEYS))
                if bad:
                    raise ValueError(
                        f"{where}.{scale}: unknown override {bad[0]!r}; "
                        f"allowed: {', '.join(SCALE_KEYS)}"
                    )
        return self

    def entries(self) -> list[ScenarioEntry]:
        """Every scenario as a `ScenarioEntry` (bare paths get no per-scenario overrides)."""
        return [
            e if isinstance(e, ScenarioEntry) else ScenarioEntry(path=e) for e in self.scenarios
        ]

    def scale_names(self) -> tuple[str, ...]:
        """`demo` and `full` (a scale the file does not list runs its scenarios unscaled)."""
        return SCALES

    def overrides(self, entry: ScenarioEntry, scale: str) -> Overrides:
        """The suite's overrides for `scale`, then the entry's on top."""
        self.check_scale(scale)
        key = cast(ScaleName, scale)
        return {**self.scales.get(key, {}), **entry.scales.get(key, {})}

    def load_scenarios(self, scale: str = "demo") -> list[Scenario]:
        """Every scenario, read, scaled and validated.

        Raises:
            ConfigError: an unreadable scenario, an override that does not fit it, a bad field,
                or two scenarios with the same name.
        """
        out: list[Scenario] = []
        for entry in self.entries():
            path = self.path(entry.path)
            data = read_yaml_mapping(path, "scenario")
            scaled = apply_scale(data, self.overrides(entry, scale), source=str(path))
            out.append(parse_scenario(scaled, source=str(path), base_dir=path.parent))
        names = [s.name for s in out]
        if len(set(names)) != len(names):
            raise ConfigError(f"suite {self.name}: scenario names must be unique, got {names}")
        return out

    def analysis_fn(self) -> Callable[[dict[str, Any]], list[dict[str, Any]]] | None:
        """The imported `analysis` function, or None.

        Raises:
            ConfigError: the module or function cannot be imported.
        """
        if self.analysis is None:
            return None
        module, _, attr = self.analysis.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(
                f"suite {self.name}: analysis {self.analysis!r} cannot be imported: {exc}"
            ) from exc
        if not callable(fn):
            raise ConfigError(f"suite {self.name}: analysis {self.analysis!r} is not callable")
        return cast(Callable[[dict[str, Any]], list[dict[str, Any]]], fn)


def apply_scale(
    data: Mapping[str, Any], overrides: Mapping[str, float | int], *, source: str = "(inline)"
) -> dict[str, Any]:
    """A copy of the scenario mapping `data` with the scale `overrides` applied.

    Raises:
        ConfigError: an unknown key, or a key that does not fit the scenario (e.g. `rate_per_s`
            on burst arrivals, `users` without a native cohort); names `source` and the key.

    Examples:
        >>> d = {"name": "x", "cohorts": [{"name": "t", "native": {"workflow": "chat"}}],
        ...      "arrivals": {"kind": "poisson", "rate_per_s": 1.0}}
        >>> out = apply_scale(d, {"users": 8, "rate_per_s": 4.0})
        >>> out["cohorts"][0]["native"]["users"], out["arrivals"]["rate_per_s"]
        (8, 4.0)
        >>> apply_scale(d, {"seeds": 3})
        Traceback (most recent call last):
        ...
        maserve_prefect.errors.ConfigError: scenario (inline): scale override 'seeds' is not one of users, blocks, rate_per_s, closed_loop_users, window_end_s
    """
    out: dict[str, Any] = dict(data)
    for key, value in overrides.items():
        where = f"scenario {source}: scale override {key!r}"
        if key not in SCALE_KEYS:
            raise ConfigError(f"{where} is not one of {', '.join(SCALE_KEYS)}")
        if key == "blocks":
            out["blocks"] = value
        elif key == "window_end_s":
            out["window"] = {**_mapping(out.get("window", {}), where), "end_s": value}
        elif key == "users":
            cohorts = [dict(_mapping(c, where)) for c in out.get("cohorts") or []]
            native = [c for c in cohorts if isinstance(c.get("native"), Mapping)]
            if not native:
                raise ConfigError(f"{where}: the scenario has no native cohort to resize")
            for c in native:
                c["native"] = {**c["native"], "users": value}
            out["cohorts"] = cohorts
        else:
            kind, field = (
                ("poisson", "rate_per_s") if key == "rate_per_s" else ("closed_loop", "users")
            )
            arrivals = _mapping(out.get("arrivals", {"kind": "burst"}), where)
            if arrivals.get("kind", "burst") != kind:
                raise ConfigError(
                    f"{where} needs `arrivals.kind: {kind}`, the scenario has "
                    f"{arrivals.get('kind', 'burst')!r}"
                )
            out["arrivals"] = {**arrivals, field: value}
    return out


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ConfigError(f"{where}: expected a mapping in the scenario, got {type(v).__name__}")
    return v
