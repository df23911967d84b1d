"""The `math` binding: arithmetic word problems with integer answers and worked solutions.

Data: `data/math.jsonl`, 25 problems (id, question, integer answer, worked solution ending in
"Answer: N"), written for this project. Evaluation: the number after the last "answer" marker
(else the last number in the text) must equal the integer answer; score 1 or 0.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `critic`: median 1730 tokens, sigma 0.5, clip [190, 8192]
- `debater`: median 2500 tokens, sigma 0.5, clip [390, 8192]
- `default`: median 1930 tokens, sigma 0.5, clip [190, 8192]
- `judge`: median 1160 tokens, sigma 0.4, clip [190, 4810]
- `solver`: median 3370 tokens, sigma 0.5, clip [390, 8192]
- `verifier`: median 1450 tokens, sigma 0.5, clip [190, 5780]
- `writer`: median 2890 tokens, sigma 0.5, clip [390, 8192]
- accept by round: 0.97, 0.7, 0.85
- converge by round: 0.3, 0.6, 0.8
- spawn weights (1..n children): 0.3, 0.4, 0.2, 0.1
- vote agreement: 0.72
- answer share: 0.35 of each output is delivered (the rest is reasoning, generated but not delivered)
- context: reference 1351 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

Context response (`bindings.content`: the shared `ContentProfile.responsive()`, reference = two
delivered `default` answers): a judge, verifier or aggregator given the full worked solutions
writes longer and accepts more often than one given only the final numbers. A call given nothing
writes x0.81 of the median, one given 1,700 delivered tokens x1.23; every draw is seeded by the
call's prompt digest, so Full vs Selected delivery changes downstream work natively. Modeled, not
measured: a real engine (`--content engine`) is the reference.

Lengths (issue 16) — fitted to the paper's stated demand population, never to a finding's result:
every role class's median and clip are this binding's earlier answer lengths x9.6 (clip capped at
8,192), and 0.35 of each output is the delivered answer (`answer share`; the rest models Qwen3's
thinking tokens, generated but not delivered). Scale and share are the two values with which App.
G.5's population (62 Loop roots over math / research / science_qa, one Spawn, one Fork-Join)
realizes its stated per-call work: "Three blocks retain 134 calls each, with input/output totals of
92,409/352,227, 92,050/351,748, and 92,389/350,113 tokens" — 2,622 output and 689 input tokens per
call; ours 2,559 / 612 (`benchmarks/demand_population.py --g5-only`; Loop roots are two calls when the first draft is accepted). This binding stands for G.5's GSM8K
targets (the mapping of `mix_bg_*.yaml`), so the fit includes it. A call's output is capped, as
vLLM caps it, at its `max_tokens` and at the max model length less its input (8,192 on the paper's
910C pool; `tasks.model.capped_output`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from maserve_prefect.bindings.base import (
    ShippedBinding,
    answer_text,
    final_number,
    instance_ids,
    load_jsonl,
    provenance,
    role_prompts,
)
from maserve_prefect.bindings.content import QWEN3_ANSWER_SHARE, ContentProfile, LengthDist

from maserve_prefect.spec.binding import Answer, BindingInfo, Quality, TaskInstance

_FILE, _FIELDS = "math.jsonl", ("id", "question", "answer", "solution")

_FRAMING = (
    "Task: solve an arithmetic word problem. The answer is a whole number. "
    "End your reply with a line 'Answer: <number>'."
)


class MathBinding(ShippedBinding):
    """Integer-answer word problems; exact match on the final number.

    Examples:
        >>> b = MathBinding()
        >>> inst = b.instance("math-01")
        >>> b.evaluate(inst, "252 - 197 = 55. Answer: 55").passed
        True
    """

    data_file = _FILE
    required_fields = _FIELDS
    info: ClassVar[BindingInfo] = BindingInfo(
        binding_id="math",
        provenance=provenance("hand-written problems with worked solutions"),
        instance_ids=instance_ids(load_jsonl(_FILE, _FIELDS)),
        role_prompts=role_prompts(
            _FRAMING,
            {
                "judge": "Read the candidate solutions and give the majority-supported, checked answer."
            },
        ),
        tools=("calculator",),
        description="Arithmetic word problems; exact match on the final integer.",
    )
    content_profile = ContentProfile(
        lengths={
            "solver": LengthDist(3370, 0.5, 390, 8192),
            "debater": LengthDist(2500, 0.5, 390, 8192),
            "critic": LengthDist(1730, 0.5, 190, 8192),
            "verifier": LengthDist(1450, 0.5, 190, 5780),
            "judge": LengthDist(1160, 0.4, 190, 4810),
            "writer": LengthDist(2890, 0.5, 390, 8192),
            "default": LengthDist(1930, 0.5, 190, 8192),
        },
        # Round 1: the paper's Loop roots are two model calls (App. D.2: Loop's median; App. G.5:
        # 134 calls per block for 62 Loop roots + one Spawn + one Fork-Join, ~2.06 per Loop root).
        accept_by_round=(0.97, 0.7, 0.85),
        converge_by_round=(0.3, 0.6, 0.8),
        spawn_weights=(0.3, 0.4, 0.2, 0.1),
        vote_agreement=0.72,
        answer_share=QWEN3_ANSWER_SHARE,
    ).responsive()

    def _inputs(self, record: dict[str, Any]) -> dict[str, Any]:
        return {"task": {"question": record["question"]}}

    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        """Exact match of the final number against the integer answer."""
        expected = int(self.record(instance.instance_id)["answer"])
        got = final_number(answer_text(answer))
        ok = got is not None and got == expected
        return Quality(
            float(ok), ok, f"expected {expected}, got {got if got is not None else 'no number'}"
        )
