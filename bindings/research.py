"""The `research` binding: questions answered from Python's own bundled documentation.

Data: `data/research.jsonl`, 23 questions (id, question, key points, evidence doc ids) written
for this project against the frozen stdlib-docstring corpus of `maserve_prefect.tools.retrieval`
(the `doc_search` / `web_search` tools; results carry the corpus digest). `evidence` names the
corpus documents that answer the question (the tests check they exist and that BM25 ranks one of
them in the top 10). Evaluation: key-point recall (each point's terms, `a|b` alternatives, must
all appear); pass at 0.67.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `critic`: median 2500 tokens, sigma 0.5, clip [390, 8192]
- `default`: median 2410 tokens, sigma 0.5, clip [190, 8192]
- `planner`: median 2120 tokens, sigma 0.4, clip [390, 8192]
- `researcher`: median 3660 tokens, sigma 0.5, clip [570, 8192]
- `writer`: median 6260 tokens, sigma 0.4, clip [1160, 8192]
- accept by round: 0.97, 0.7, 0.85
- converge by round: 0.3, 0.6, 0.8
- spawn weights (1..n children): 0.1, 0.3, 0.35, 0.25
- vote agreement: 0.65
- answer share: 0.35 of each output is delivered (the rest is reasoning, generated but not delivered)
- context: reference 860 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

What the context line means (`bindings.content`): a call given more delivered tokens writes longer
(median x ((860 + d) / 1720) ** 0.3: x0.81 with nothing delivered, x1.15 at 1,880), and an
evaluator given a longer draft accepts more often (log-odds + ln((860 + d) / 1720)); every draw is
also seeded by the digest of the call's prompt, so Full vs Selected delivery changes the downstream
work natively. Modeled, not measured: a real engine (`--content engine`) is the reference.

Lengths (issue 16) — fitted to the paper's stated demand population, never to a finding's result:
every role class's median and clip are this binding's earlier answer lengths x9.6 (clip capped at
8,192), and 0.35 of each output is the delivered answer (`answer share`; the rest models Qwen3's
thinking tokens, generated but not delivered). Scale and share are the two values with which App.
G.5's population (62 Loop roots over math / research / science_qa, one Spawn, one Fork-Join)
realizes its stated per-call work: "Three blocks retain 134 calls each, with input/output totals of
92,409/352,227, 92,050/351,748, and 92,389/350,113 tokens" — 2,622 output and 689 input tokens per
call; ours 2,559 / 612 (`benchmarks/demand_population.py --g5-only`; Loop roots are two calls when the first draft is accepted). This binding stands for G.5's PubMedQA
targets (the mapping of `mix_bg_*.yaml`), so the fit includes it. A call's output is capped, as
vLLM caps it, at its `max_tokens` and at the max model length less its input (8,192 on the paper's
910C pool; `tasks.model.capped_output`).
"""

from __future__ import annotations

from typing import ClassVar

from maserve_prefect.bindings.base import (
    ShippedBinding,
    answer_text,
    instance_ids,
    key_points,
    load_jsonl,
    provenance,
    recall_quality,
    role_prompts,
)
from maserve_prefect.bindings.content import (
    QWEN3_ANSWER_SHARE,
    ContentProfile,
    ContextResponse,
    LengthDist,
)

from maserve_prefect.spec.binding import Answer, BindingInfo, Quality, TaskInstance

_FILE, _FIELDS = "research.jsonl", ("id", "question", "key_points", "evidence")
PASS_RECALL = 0.67

_FRAMING = (
    "Task: answer a question about the Python standard library using only the local "
    "documentation search tool (doc_search / web_search). Name the module and function or class."
)


class ResearchBinding(ShippedBinding):
    """Stdlib documentation questions; key-point recall.

    Examples:
        >>> b = ResearchBinding()
        >>> b.evaluate(b.instance("res-01"), "Use heapq.heappush(heap, item).").passed
        True
    """

    data_file = _FILE
    required_fields = _FIELDS
    info: ClassVar[BindingInfo] = BindingInfo(
        binding_id="research",
        provenance=provenance("hand-written questions over the frozen stdlib docstring corpus"),
        instance_ids=instance_ids(load_jsonl(_FILE, _FIELDS)),
        role_prompts=role_prompts(
            _FRAMING,
            {
                "researcher": "Search the documentation with doc_search; report the relevant "
                "passages with their document ids.",
                "reviewer": "Check the findings against the cited passages; flag unsupported claims.",
                "writer": "Write the final answer from the reviewed findings, citing document ids.",
            },
        ),
        tools=("doc_search", "web_search"),
        description="Questions over Python's bundled documentation; key-point recall.",
    )
    content_profile = ContentProfile(
        lengths={
            "researcher": LengthDist(3660, 0.5, 570, 8192),
            "planner": LengthDist(2120, 0.4, 390, 8192),
            "critic": LengthDist(2500, 0.5, 390, 8192),
            "writer": LengthDist(6260, 0.4, 1160, 8192),
            "default": LengthDist(2410, 0.5, 190, 8192),
        },
        # Round 1: the paper's Loop roots are two model calls (App. D.2: Loop's median; App. G.5:
        # 134 calls per block for 62 Loop roots + one Spawn + one Fork-Join, ~2.06 per Loop root).
        accept_by_round=(0.97, 0.7, 0.85),
        converge_by_round=(0.3, 0.6, 0.8),
        spawn_weights=(0.1, 0.3, 0.35, 0.25),
        vote_agreement=0.65,
        answer_share=QWEN3_ANSWER_SHARE,
        context=ContextResponse(
            reference_tokens=860, length_elasticity=0.3, accept_slope=1.0, converge_slope=0.5
        ),
    )

    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        """Key-point recall of the answer; pass at `PASS_RECALL`."""
        points = key_points(self.record(instance.instance_id)["key_points"])
        return recall_quality(answer_text(answer), points, PASS_RECALL)
