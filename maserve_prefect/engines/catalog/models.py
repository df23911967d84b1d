"""Model catalog: look a `ModelSpec` up by name, from the shipped set or the user's own.

One idea: a model is its Hugging Face `config.json` (the architecture keys only). The shipped
set is `data/models.yaml` (each entry names the repository its numbers come from); a user adds
one with `maserve sim model add CONFIG.json --name NAME`, which writes the same entry form to
`$MASERVE_HOME/models/NAME.yaml`. Both go through `hf_config.spec_from_hf_config`, so a user
model is checked exactly as a built-in one. Built-in names win: a user entry may not shadow one
(a lookup of a built-in never touches the disk, which keeps the simulator's hot paths free of
I/O).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from maserve_prefect.engines.catalog.hf_config import spec_from_hf_config
from maserve_prefect.engines.catalog.home import user_models_dir
from maserve_prefect.engines.catalog.model_spec import GemmShape, ModelSpec
from maserve_prefect.errors import ConfigError

__all__ = [
    "MODELS",
    "GemmShape",
    "ModelSpec",
    "get_model",
    "list_models",
    "load_model_entries",
    "model_entry",
    "models_path",
    "user_models",
    "write_model_entry",
]

MODELS_FILE = "models.yaml"
_ENTRY_KEYS = {"name", "aliases", "source", "config"}


def models_path() -> Path:
    """The shipped model file."""
    return Path(str(resources.files("maserve_prefect.engines.catalog") / "data" / MODELS_FILE))


def _parse_entry(doc: Any, where: str) -> ModelSpec:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ConfigError(f"{where}: expected a mapping with a string 'name'")
    where = f"{where} ({doc['name']})"
    unknown = sorted(set(doc) - _ENTRY_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown fields {unknown}; expected {sorted(_ENTRY_KEYS)}")
    aliases = doc.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigError(f"{where}: aliases must be a list of strings")
    return spec_from_hf_config(doc.get("config"), doc["name"], where, tuple(aliases))


def load_model_entries(path: Path) -> list[ModelSpec]:
    """Every model entry of a catalog YAML file (one mapping or a list).

    Raises:
        ConfigError: unreadable YAML or a bad entry (one line naming the file and entry).
    """
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    docs = doc if isinstance(doc, list) else [doc]
    return [_parse_entry(d, f"{path} entry {i + 1}") for i, d in enumerate(docs)]


def model_entry(
    name: str, config: dict[str, Any], source: str, aliases: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The catalog entry form of a model (what `write_model_entry` stores)."""
    return {"name": name, "aliases": list(aliases), "source": source, "config": config}


def write_model_entry(entry: dict[str, Any], folder: Path | None = None) -> Path:
    """Check `entry` and write it to `folder` (default the user's models folder) atomically.

    Raises:
        ConfigError: the entry does not parse, or its name or an alias is a built-in model.
    """
    spec = _parse_entry(entry, f"model {entry.get('name')!r}")
    for alias in (spec.name, *spec.aliases):
        if _key(alias) in _BY_KEY:
            raise ConfigError(
                f"model {alias!r} is a built-in model ({_BY_KEY[_key(alias)].name}); "
                "pick another --name"
            )
    folder = folder or user_models_dir()
    folder.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.name).strip("-") or "model"
    path = folder / f"{slug}.yaml"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(entry, sort_keys=False))
    tmp.replace(path)
    return path


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-")


MODELS: tuple[ModelSpec, ...] = tuple(load_model_entries(models_path()))

_BY_KEY: dict[str, ModelSpec] = {}
for _spec in MODELS:
    for _alias in (_spec.name, *_spec.aliases):
        if _BY_KEY.get(_key(_alias), _spec) is not _spec:
            raise RuntimeError(f"duplicate model alias {_alias!r} in {models_path()}")
        _BY_KEY[_key(_alias)] = _spec


def _folder_stamp(folder: Path) -> tuple[tuple[str, int], ...]:
    if not folder.is_dir():
        return ()
    return tuple(sorted((p.name, p.stat().st_mtime_ns) for p in folder.glob("*.yaml")))


@cache
def _user_models(folder: Path, stamp: tuple[tuple[str, int], ...]) -> dict[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for name, _mtime in stamp:
        for spec in load_model_entries(folder / name):
            for alias in (spec.name, *spec.aliases):
                out[_key(alias)] = spec
    return out


def user_models() -> dict[str, ModelSpec]:
    """User model entries keyed by normalised name and alias (re-read when a file changes)."""
    folder = user_models_dir()
    return _user_models(folder, _folder_stamp(folder))


def list_models() -> list[str]:
    """Canonical names of every catalogued model: built-in, then the user's."""
    names = [m.name for m in MODELS]
    for spec in user_models().values():
        if spec.name not in names:
            names.append(spec.name)
    return names


def get_model(name: str) -> ModelSpec:
    """Look a model up by name or alias, case-insensitively (built-in, else the user's).

    Raises:
        ConfigError: the name is unknown; the message lists the known names and how to add one.

    Examples:
        >>> get_model("Qwen/Qwen3-0.6B").tie_word_embeddings
        True
    """
    spec = _BY_KEY.get(_key(name))
    if spec is None:
        spec = user_models().get(_key(name))
    if spec is None:
        raise ConfigError(
            f"unknown model {name!r}; known models: {', '.join(list_models())}. Add it from its "
            "Hugging Face config.json with `maserve sim model add CONFIG.json --name NAME`."
        )
    return spec
