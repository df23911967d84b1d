"""The `math` binding: arithmetic word problems with integer answers and worked solutions.

Data: `data/math.jsonl`, 25 problems (id, question, integer answer, worked solution ending in
"Answer: N"), written for this project. Evaluation: the number after the last "answer" marker
(else the last number in the text) must equal the integer answer; score 1 or 0.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `critic`: median 180 tokens, sigma 0.5, clip [20, 800]
- `debater`: median 260 tokens, sigma 0.5, clip [40, 1000]
- `default`: median 200 tokens, sigma 0.5, clip [20, 1000]
- `judge`: median 120 tokens, sigma 0.4, clip [20, 500]
- `solver`: median 350 tokens, sigma 0.5, clip [40, 1500]
- `verifier`: median 150 tokens, sigma 0.5, clip [20, 600]
- `writer`: median 300 tokens, sigma 0.5, clip [40, 1200]
- accept by round: 0.45, 0.7, 0.85
- converge by round: 0.3, 0.6, 0.8
- spawn weights (1..n children): 0.3, 0.4, 0.2, 0.1
- vote agreement: 0.72
- context: reference 400 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

Context response (`bindings.content`: the shared `ContentProfile.responsive()`, reference = two
`default` outputs): a judge, verifier or aggregator given the full worked solutions writes
longer and accepts more often than one given only the final numbers. A call given nothing writes
x0.81 of the median, one given 1,200 delivered tokens x1.23; every draw is seeded by the call's
prompt digest, so Full vs Selected delivery changes downstream work natively. Modeled, not
measured: a real engine (`--content engine`) is the reference.
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
from maserve_prefect.bindings.content import ContentProfile, LengthDist

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
            "solver": LengthDist(350, 0.5, 40, 1500),
            "debater": LengthDist(260, 0.5, 40, 1000),
            "critic": LengthDist(180, 0.5, 20, 800),
            "verifier": LengthDist(150, 0.5, 20, 600),
            "judge": LengthDist(120, 0.4, 20, 500),
            "writer": LengthDist(300, 0.5, 40, 1200),
            "default": LengthDist(200, 0.5, 20, 1000),
        },
        accept_by_round=(0.45, 0.7, 0.85),
        converge_by_round=(0.3, 0.6, 0.8),
        spawn_weights=(0.3, 0.4, 0.2, 0.1),
        vote_agreement=0.72,
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
