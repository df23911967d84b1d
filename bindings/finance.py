"""The `finance` binding: time-value-of-money problems with numeric answers and a tolerance.

Data: `data/finance.jsonl`, 22 problems (compound / simple / continuous interest, present value,
NPV, loan payments, annuity future value, effective annual rate). Each record keeps its `kind`
and `params`; the answer (rounded to cents) is the closed-form value for those parameters, and
the tests recompute every answer from the formulas. Evaluation: the final number must lie within
`max(rel_tolerance * |answer|, 0.01)` of the answer; score 1 or 0.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `analyst`: median 3080 tokens, sigma 0.5, clip [390, 8192]
- `critic`: median 1930 tokens, sigma 0.5, clip [190, 8192]
- `default`: median 1930 tokens, sigma 0.5, clip [190, 8192]
- `judge`: median 1060 tokens, sigma 0.4, clip [190, 4810]
- `solver`: median 2690 tokens, sigma 0.5, clip [390, 8192]
- `verifier`: median 1360 tokens, sigma 0.5, clip [190, 5780]
- `writer`: median 2500 tokens, sigma 0.5, clip [390, 8192]
- accept by round: 0.5, 0.65, 0.85
- converge by round: 0.3, 0.55, 0.8
- spawn weights (1..n children): 0.35, 0.4, 0.25
- vote agreement: 0.66
- answer share: 0.35 of each output is delivered (the rest is reasoning, generated but not delivered)
- context: reference 1351 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

Context response (`bindings.content`: the shared `ContentProfile.responsive()`, reference = two
delivered `default` answers): an analyst or writer given fuller upstream figures writes a longer
report, and a verifier given the whole draft accepts more often. A call given nothing writes x0.81
of the median, one given 1,700 delivered tokens x1.23; every draw is seeded by the call's prompt
digest, so Full vs Selected delivery changes downstream work natively. Modeled, not measured: a
real engine (`--content engine`) is the reference.

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
from maserve_prefect.bindings.content import QWEN3_ANSWER_SHARE, ContentProfile, LengthDist

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
            "solver": LengthDist(2690, 0.5, 390, 8192),
            "analyst": LengthDist(3080, 0.5, 390, 8192),
            "critic": LengthDist(1930, 0.5, 190, 8192),
            "verifier": LengthDist(1360, 0.5, 190, 5780),
            "judge": LengthDist(1060, 0.4, 190, 4810),
            "writer": LengthDist(2500, 0.5, 390, 8192),
            "default": LengthDist(1930, 0.5, 190, 8192),
        },
        # Round 1 at least 0.5: Loop's median is two model calls across the paper's bindings (App. D.2).
        accept_by_round=(0.5, 0.65, 0.85),
        converge_by_round=(0.3, 0.55, 0.8),
        spawn_weights=(0.35, 0.4, 0.25),
        vote_agreement=0.66,
        answer_share=QWEN3_ANSWER_SHARE,
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
