"""The user's folder layout ships as subpackages of `maserve_prefect` only.

A user's own `tasks.py` / `flows.py` in the working directory must not shadow ours, both for the
editable install the Makefile makes and for a built wheel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("flows", "tasks", "predictors", "bindings")

PROBE = """
import importlib, json, sys
out = {}
for name in ("flows", "tasks", "predictors", "bindings"):
    mod = importlib.import_module("maserve_prefect." + name)
    out[name] = mod.__file__
print(json.dumps(out))
"""


def _shadowing_dir(tmp_path: Path) -> Path:
    work = tmp_path / "userproject"
    work.mkdir()
    for name in ("tasks", "flows"):
        (work / f"{name}.py").write_text("raise SystemExit('user module was imported')\n")
    return work


def _probe(cwd: Path, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra_env or {})
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    result: dict[str, str] = json.loads(proc.stdout)
    return result


def test_editable_install_imports_beside_user_tasks_py(tmp_path: Path) -> None:
    files = _probe(_shadowing_dir(tmp_path))
    for name in SUBPACKAGES:
        assert Path(files[name]).resolve() == (ROOT / name / "__init__.py").resolve()


def _source_copy(tmp_path: Path) -> Path:
    """The tracked files in a folder of their own: a build writes `build/` and `*.egg-info`
    beside its source, and an egg-info left in the project root would shadow the installed
    metadata (entry points included) of every later process started there."""
    src = tmp_path / "src"
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for rel in tracked:
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    return src


def test_only_one_top_level_name_in_wheel(tmp_path: Path) -> None:
    wheel_dir = tmp_path / "wheel"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(_source_copy(tmp_path)),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stderr}")
    (wheel,) = wheel_dir.glob("maserve_prefect-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {
            n.split("/", 1)[0]
            for n in zf.namelist()
            if not n.split("/", 1)[0].endswith(".dist-info")
        }
        assert tops == {"maserve_prefect"}
        for name in SUBPACKAGES:
            assert f"maserve_prefect/{name}/__init__.py" in zf.namelist()
        (entry_points,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        declared = zf.read(entry_points).decode()
        # the library reaches the user folders only through these plugin groups
        assert "[maserve_prefect.workflows]" in declared
        assert "flows = maserve_prefect.flows.source" in declared

    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    files = _probe(_shadowing_dir(tmp_path), {"PYTHONPATH": str(target)})
    for name in SUBPACKAGES:
        assert (
            Path(files[name]).resolve()
            == (target / "maserve_prefect" / name / "__init__.py").resolve()
        )
