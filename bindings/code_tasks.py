"""The `code` binding: small Python function tasks graded by unit tests in the sandbox.

Data: `data/code.jsonl`, 22 tasks (id, function name, task text, reference solution, assert-based
test source), written for this project. The task artifact carries the function name and the
test source (the tool-augmented repair loop runs them with the `run_tests` tool); the reference
solution stays hidden. Evaluation: the answer's code (the last fenced ```python block if any,
else the whole text) runs with the tests in `maserve_prefect.tools.sandbox` (a bubblewrap jail:
no network, no view of the host's files, CPU / memory / time limits, the verdict from a separate
judge); pass iff every check passes; score = passed checks / all checks.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `coder`: median 4050 tokens, sigma 0.6, clip [570, 8192]
- `critic`: median 2120 tokens, sigma 0.5, clip [290, 8192]
- `default`: median 2410 tokens, sigma 0.5, clip [190, 8192]
- `judge`: median 960 tokens, sigma 0.4, clip [90, 3850]
- `solver`: median 4050 tokens, sigma 0.6, clip [570, 8192]
- `verifier`: median 870 tokens, sigma 0.4, clip [90, 3850]
- accept by round: 0.5, 0.55, 0.75
- converge by round: 0.25, 0.5, 0.7
- spawn weights (1..n children): 0.2, 0.4, 0.3, 0.1
- vote agreement: 0.6
- answer share: 0.35 of each output is delivered (the rest is reasoning, generated but not delivered)
- context: reference 1687 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

Context response (`bindings.content`: the shared `ContentProfile.responsive()`, reference = two
delivered `default` answers): a coder or repairer given longer code and test output writes a longer
revision, and the refinement loop's critic given the whole failing code accepts more often than one
given an excerpt. A call given nothing writes x0.81 of the median, one given 2,100 delivered tokens
x1.23; every draw is seeded by the call's prompt digest, so Full vs Selected delivery changes
downstream work natively. Modeled, not measured: a real engine (`--content engine`) is the
reference.

Lengths (issue 16) — fitted to the paper's stated demand population, never to a finding's result:
every role class's median and clip are this binding's earlier answer lengths x9.6 (clip capped at
8,192), and 0.35 of each output is the delivered answer (`answer share`; the rest models Qwen3's
thinking tokens, generated but not delivered). Scale and share are the two values with which App.
G.5's population (62 Loop roots over math / research / science_qa, one Spawn, one Fork-Join)
realizes its stated per-call work: "Three blocks retain 134 calls each, with input/output totals of
92,409/352,227, 92,050/351,748, and 92,389/350,113 tokens" — 2,622 output and 689 input tokens per
call; ours 2,559 / 612 (`benchmarks/demand_population.py --g5-only`; Loop roots are two calls when the first draft is accepted). The paper states no per-call figure on
the 910C for this binding's domain, so it takes the same scale and share as the G.5 bindings (G.5
is the one stated per-call population on Qwen3-8B / 910C). A call's output is capped, as vLLM caps
it, at its `max_tokens` and at the max model length less its input (8,192 on the paper's 910C pool;
`tasks.model.capped_output`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from maserve_prefect.bindings.base import (
    ShippedBinding,
    answer_text,
    instance_ids,
    load_jsonl,
    provenance,
    role_prompts,
)
from maserve_prefect.bindings.content import QWEN3_ANSWER_SHARE, ContentProfile, LengthDist

from maserve_prefect.spec.binding import Answer, BindingInfo, Quality, TaskInstance
from maserve_prefect.tools.sandbox import run_python_tests

_FILE, _FIELDS = "code.jsonl", ("id", "function", "question", "reference", "tests")
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
TEST_TIMEOUT_S = 10.0

_FRAMING = (
    "Task: implement one Python function exactly as specified. Standard library only; no I/O, "
    "no network. Return the code in one ```python block."
)


def extract_code(text: str) -> str:
    """The last fenced Python block of `text`, else `text` itself.

    Examples:
        >>> extract_code("Here:\\n```python\\nx = 1\\n```\\n")
        'x = 1\\n'
    """
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


class CodeBinding(ShippedBinding):
    """Python function tasks; unit tests run in the sandbox.

    Examples:
        >>> b = CodeBinding()
        >>> inst = b.instance("code-19")
        >>> b.evaluate(inst, b.record("code-19")["reference"]).passed
        True
    """

    data_file = _FILE
    required_fields = _FIELDS
    info: ClassVar[BindingInfo] = BindingInfo(
        binding_id="code",
        provenance=provenance("hand-written tasks with reference solutions and assert tests"),
        instance_ids=instance_ids(load_jsonl(_FILE, _FIELDS)),
        role_prompts=role_prompts(
            _FRAMING,
            {
                "solver": "Write the function; return only the code.",
                "reviewer": "Review the code and test output for bugs and edge cases; list fixes.",
                "validator": "Run the tests on the repaired code and reply accept only if all pass.",
            },
        ),
        tools=("run_tests",),
        description="Python function tasks graded by sandboxed unit tests.",
    )
    content_profile = ContentProfile(
        lengths={
            "coder": LengthDist(4050, 0.6, 570, 8192),
            "solver": LengthDist(4050, 0.6, 570, 8192),
            "critic": LengthDist(2120, 0.5, 290, 8192),
            "verifier": LengthDist(870, 0.4, 90, 3850),
            "judge": LengthDist(960, 0.4, 90, 3850),
            "default": LengthDist(2410, 0.5, 190, 8192),
        },
        # Round 1 at least 0.5: Loop's median is two model calls across the paper's bindings (App. D.2).
        accept_by_round=(0.5, 0.55, 0.75),
        converge_by_round=(0.25, 0.5, 0.7),
        spawn_weights=(0.2, 0.4, 0.3, 0.1),
        vote_agreement=0.6,
        answer_share=QWEN3_ANSWER_SHARE,
    ).responsive()

    def _inputs(self, record: dict[str, Any]) -> dict[str, Any]:
        return {
            "task": {
                "question": record["question"],
                "function": record["function"],
                "tests": record["tests"],
            }
        }

    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        """Run the instance's tests on the answer's code in the sandbox."""
        tests = self.record(instance.instance_id)["tests"]
        run = run_python_tests(extract_code(answer_text(answer)), tests, TEST_TIMEOUT_S)
        total = run.num_passed + run.num_failed
        score = 1.0 if run.passed else (run.num_passed / total if total else 0.0)
        if run.passed:
            detail = f"{run.num_passed} checks passed ({run.isolation})"
        else:
            detail = "; ".join(filter(None, [run.error, *run.failures]))[:500] or "tests failed"
        return Quality(score, run.passed, detail)
