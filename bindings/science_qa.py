"""The `science_qa` binding: four-option multiple-choice science questions.

Data: `data/science_qa.jsonl`, 23 questions (id, question, choices A–D, answer letter), written
for this project; option order was shuffled once with a fixed seed so answer letters do not cycle.
Evaluation: the chosen letter (after "answer", a lone letter, "(B)" / "B)", or the one option
whose text the answer quotes) must equal the key; score 1 or 0.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `critic`: median 1360 tokens, sigma 0.5, clip [90, 5780]
- `debater`: median 1930 tokens, sigma 0.5, clip [190, 8192]
- `default`: median 1450 tokens, sigma 0.5, clip [90, 8192]
- `judge`: median 570 tokens, sigma 0.5, clip [50, 2890]
- `solver`: median 1540 tokens, sigma 0.6, clip [90, 8192]
- accept by round: 0.97, 0.8, 0.9
- converge by round: 0.4, 0.7, 0.9
- spawn weights (1..n children): 0.5, 0.35, 0.15
- vote agreement: 0.78
- answer share: 0.35 of each output is delivered (the rest is reasoning, generated but not delivered)
- context: reference 1015 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

Context response (`bindings.content`: the shared `ContentProfile.responsive()`, reference = two
delivered `default` answers): a debater given the peers' full arguments answers at greater length
and the debate converges more often; a judge given only the answers writes less. A call given
nothing writes x0.81 of the median, one given 1,300 delivered tokens x1.23; every draw is seeded by
the call's prompt digest, so Full vs Selected delivery changes downstream work natively. Modeled,
not measured: a real engine (`--content engine`) is the reference.

Lengths (issue 16) — fitted to the paper's stated demand population, never to a finding's result:
every role class's median and clip are this binding's earlier answer lengths x9.6 (clip capped at
8,192), and 0.35 of each output is the delivered answer (`answer share`; the rest models Qwen3's
thinking tokens, generated but not delivered). Scale and share are the two values with which App.
G.5's population (62 Loop roots over math / research / science_qa, one Spawn, one Fork-Join)
realizes its stated per-call work: "Three blocks retain 134 calls each, with input/output totals of
92,409/352,227, 92,050/351,748, and 92,389/350,113 tokens" — 2,622 output and 689 input tokens per
call; ours 2,559 / 612 (`benchmarks/demand_population.py --g5-only`; Loop roots are two calls when the first draft is accepted). This binding stands for G.5's SCIENCE
targets (the mapping of `mix_bg_*.yaml`), so the fit includes it. A call's output is capped, as
vLLM caps it, at its `max_tokens` and at the max model length less its input (8,192 on the paper's
910C pool; `tasks.model.capped_output`).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from maserve_prefect.bindings.base import (
    ShippedBinding,
    answer_text,
    instance_ids,
    load_jsonl,
    normalize,
    provenance,
    role_prompts,
)
from maserve_prefect.bindings.content import QWEN3_ANSWER_SHARE, ContentProfile, LengthDist

from maserve_prefect.spec.binding import Answer, BindingInfo, Quality, TaskInstance

_FILE, _FIELDS = "science_qa.jsonl", ("id", "question", "choices", "answer")
_LETTERS = "ABCD"
_MARKED = re.compile(r"answer\s*(?:is|:|=)?\s*(?:option\s*)?\(?([A-D])\b\)?", re.IGNORECASE)
_BRACKETED = re.compile(r"\(([A-D])\)|\b([A-D])\)")

_FRAMING = (
    "Task: answer a multiple-choice science question. Exactly one option is right. "
    "End with 'Answer: <letter>'."
)


def chosen_letter(text: str, choices: dict[str, str]) -> str | None:
    """The option letter an answer picks, or None if it picks none unambiguously.

    Examples:
        >>> chosen_letter("I think the answer is (c).", {"A": "x", "B": "y", "C": "z", "D": "w"})
        'C'
    """
    marked = _MARKED.findall(text)
    if marked:
        return marked[-1].upper()
    stripped = text.strip().strip(".:)(").upper()
    if len(stripped) == 1 and stripped in _LETTERS:
        return stripped
    bracketed = _BRACKETED.findall(text)
    if bracketed:
        first, second = bracketed[-1]
        return (first or second).upper()
    norm = normalize(text)
    quoted = [k for k, v in choices.items() if normalize(v) in norm]
    return quoted[0] if len(quoted) == 1 else None


class ScienceQABinding(ShippedBinding):
    """Multiple-choice science; letter match.

    Examples:
        >>> b = ScienceQABinding()
        >>> inst = b.instance("sci-02")
        >>> b.evaluate(inst, "Answer: " + b.record("sci-02")["answer"]).passed
        True
    """

    data_file = _FILE
    required_fields = _FIELDS
    info: ClassVar[BindingInfo] = BindingInfo(
        binding_id="science_qa",
        provenance=provenance("hand-written questions; options shuffled with a fixed seed"),
        instance_ids=instance_ids(load_jsonl(_FILE, _FIELDS)),
        role_prompts=role_prompts(_FRAMING),
        tools=(),
        description="Four-option science questions; letter match.",
    )
    content_profile = ContentProfile(
        lengths={
            "solver": LengthDist(1540, 0.6, 90, 8192),
            "debater": LengthDist(1930, 0.5, 190, 8192),
            "critic": LengthDist(1360, 0.5, 90, 5780),
            "judge": LengthDist(570, 0.5, 50, 2890),
            "default": LengthDist(1450, 0.5, 90, 8192),
        },
        # Round 1: the paper's Loop roots are two model calls (App. D.2: Loop's median; App. G.5:
        # 134 calls per block for 62 Loop roots + one Spawn + one Fork-Join, ~2.06 per Loop root).
        accept_by_round=(0.97, 0.8, 0.9),
        converge_by_round=(0.4, 0.7, 0.9),
        spawn_weights=(0.5, 0.35, 0.15),
        vote_agreement=0.78,
        answer_share=QWEN3_ANSWER_SHARE,
    ).responsive()

    def _inputs(self, record: dict[str, Any]) -> dict[str, Any]:
        options = "\n".join(f"{k}. {v}" for k, v in sorted(record["choices"].items()))
        return {
            "task": {"question": f"{record['question']}\n{options}", "choices": record["choices"]}
        }

    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        """Letter match against the key."""
        rec = self.record(instance.instance_id)
        got = chosen_letter(answer_text(answer), rec["choices"])
        ok = got == rec["answer"]
        return Quality(float(ok), ok, f"expected {rec['answer']}, got {got or 'no letter'}")
