"""The `finance` binding: time-value-of-money problems with numeric answers and a tolerance.

Data: `data/finance.jsonl`, 22 problems (compound / simple / continuous interest, present value,
NPV, loan payments, annuity future value, effective annual rate). Each record keeps its `kind`
and `params`; the answer (rounded to cents) is the closed-form value for those parameters, and
the tests recompute every answer from the formulas. Evaluation: the final number must lie within
`max(rel_tolerance * |answer|, 0.01)` of the answer; score 1 or 0.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `analyst`: median 320 tokens, sigma 0.5, clip [40, 1200]
- `critic`: median 200 tokens, sigma 0.5, clip [20, 800]
- `default`: median 200 tokens, sigma 0.5, clip [20, 1000]
- `judge`: median 110 tokens, sigma 0.4, clip [20, 500]
- `solver`: median 280 tokens, sigma 0.5, clip [40, 1200]
- `verifier`: median 140 tokens, sigma 0.5, clip [20, 600]
- `writer`: median 260 tokens, sigma 0.5, clip [40, 1000]
- accept by round: 0.4, 0.65, 0.85
- converge by round: 0.3, 0.55, 0.8
- spawn weights (1..n children): 0.35, 0.4, 0.25
- vote agreement: 0.66
- context: reference 400 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

Context response (`bindings.content`: the shared `ContentProfile.responsive()`, reference = two
`default` outputs): an analyst or writer given fuller upstream figures writes a longer report,
and a verifier given the whole draft accepts more often. A call given nothing writes x0.81 of
the median, one given 1,200 delivered tokens x1.23; every draw is seeded by the call's prompt
digest, so Full vs Selected delivery changes downstream work natively. Modeled, not measured: a
real engine (`--content engine`) is the reference.
"""

from __future__ import annotations

from typing import ClassVar

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

_FILE = "finance.jsonl"
_FIELDS = ("id", "kind", "question", "params", "answer", "rel_tolerance")

_FRAMING = (
    "Task: solve a personal-finance or corporate-finance calculation. Use the calculator tool for "
    "arithmetic. Give money to the cent and rates in percent; end with 'Answer: <number>'."
)


class FinanceBinding(ShippedBinding):
    """Numeric finance problems; pass within a relative tolerance.

    Examples:
        >>> b = FinanceBinding()
        >>> b.evaluate(b.instance("fin-01"), "The balance is $7,401.22").passed
        True
    """

    data_file = _FILE
    required_fields = _FIELDS
    info: ClassVar[BindingInfo] = BindingInfo(
        binding_id="finance",
        provenance=provenance("hand-written problems; answers computed from closed-form formulas"),
        instance_ids=instance_ids(load_jsonl(_FILE, _FIELDS)),
        role_prompts=role_prompts(_FRAMING),
        tools=("calculator",),
        description="Interest, NPV, loan and annuity calculations; numeric tolerance.",
    )
    content_profile = ContentProfile(
        lengths={
            "solver": LengthDist(280, 0.5, 40, 1200),
            "analyst": LengthDist(320, 0.5, 40, 1200),
            "critic": LengthDist(200, 0.5, 20, 800),
            "verifier": LengthDist(140, 0.5, 20, 600),
            "judge": LengthDist(110, 0.4, 20, 500),
            "writer": LengthDist(260, 0.5, 40, 1000),
            "default": LengthDist(200, 0.5, 20, 1000),
        },
        accept_by_round=(0.4, 0.65, 0.85),
        converge_by_round=(0.3, 0.55, 0.8),
        spawn_weights=(0.35, 0.4, 0.25),
        vote_agreement=0.66,
    ).responsive()

    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        """Pass when the final number is within the record's tolerance of the answer."""
        rec = self.record(instance.instance_id)
        expected = float(rec["answer"])
        tolerance = max(float(rec["rel_tolerance"]) * abs(expected), 0.01)
        got = final_number(answer_text(answer))
        ok = got is not None and abs(got - expected) <= tolerance
        shown = "no number" if got is None else f"{got:g}"
        return Quality(float(ok), ok, f"expected {expected:g} ± {tolerance:.4g}, got {shown}")
