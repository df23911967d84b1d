"""Failed work is a failed command: `replay` and `bench run` exit 4 when an op failed (after
writing their results), `--allow-failures` exits 0; the simulator refuses a request over the
model's context window in vLLM's words, recorded as the op's failed attempt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from maserve_prefect.cli import _mount, app
from maserve_prefect.cli.checks import EXIT_FAILED_WORK
from maserve_prefect.trace.bundle import import_bundle
from maserve_prefect.trace.model import OpStatus

runner = CliRunner()
_mount()

VLLM_WORDS = (
    "This model's maximum context length is 40960 tokens. However, you requested 200016 tokens "
    "(200000 in the messages, 16 in the completion). Please reduce the length of the messages or "
    "completion."
)


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scenario replaying two Mooncake requests on the default pool (Qwen3-8B, 40,960-token
    context): one of 200,000 prompt tokens, one that fits."""
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    rows = [
        {
            "timestamp": 0,
            "input_length": 200_000,
            "output_length": 16,
            "hash_ids": list(range(391)),
        },
        {"timestamp": 10, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]},
    ]
    src = tmp_path / "mc.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["trace", "import-mooncake", str(src), "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    path = tmp_path / "ctx.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "ctx",
                "cohorts": [{"name": "t", "bundle": "b"}],
                "lock": "length",
                "arms": [{"name": "dag"}],
            }
        )
    )
    return path


def test_replay_with_a_failed_op_exits_4_after_writing_and_names_the_op(
    scenario: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    res = runner.invoke(app, ["replay", str(scenario), "--no-prefect", "--out", str(out)])
    assert res.exit_code == EXIT_FAILED_WORK
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error:")
    assert "mc-000001/op0" in res.stderr and "--allow-failures" in res.stderr
    ops = {op.op_id: op for op in import_bundle(out / "dag-b0").trace.ops}
    failed = ops["mc-000001/op0"]
    assert failed.status is OpStatus.FAILED and failed.num_output_tokens == 0
    assert failed.error is not None and failed.error.endswith(VLLM_WORDS)
    assert ops["mc-000002/op0"].status is OpStatus.COMPLETED
    assert (out / "summary.json").is_file()

    again = runner.invoke(
        app, ["replay", str(scenario), "--no-prefect", "--out", str(out), "--allow-failures"]
    )
    assert again.exit_code == 0, again.output


def test_bench_run_of_a_suite_with_a_failed_op_exits_4(scenario: Path, tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "ctx-suite",
                "kind": "replay",
                "scenarios": [scenario.name],
                "scales": {"demo": {"blocks": 1}},
            }
        )
    )
    res = runner.invoke(app, ["bench", "run", str(suite), "--no-prefect"])
    assert res.exit_code == EXIT_FAILED_WORK
    assert res.stderr.startswith("error:") and "--allow-failures" in res.stderr
    ok = runner.invoke(app, ["bench", "run", str(suite), "--no-prefect", "--allow-failures"])
    assert ok.exit_code == 0, ok.output


def test_run_with_failed_roots_exits_4_after_writing_the_bundle(
    prefect_api: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool whose context window (`max_model_len`, vLLM's `--max-model-len`) no prompt fits:
    every model call is refused, every root fails."""
    monkeypatch.setenv("MASERVE_HOME", str(tmp_path / "home"))
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "devices: [H100:0]\n"
        "deployments: [{name: main, model: Qwen3-0.6B, max_model_len: 8}]\n"
        "placements: [{deployment: main, device: H100:0}]\n"
        "default: main\n"
    )
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ["run", "fork_join", "--pool", str(pool), "--ledger", db, "--wait", "60"]
    res = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert res.exit_code == EXIT_FAILED_WORK, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ")
    assert "maximum context length is 8 tokens" in res.stderr and "--allow-failures" in res.stderr
    assert (tmp_path / "a" / "trace.jsonl").is_file()
    ok = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--allow-failures"])
    assert ok.exit_code == 0, ok.output
