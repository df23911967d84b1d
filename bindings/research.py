"""The `research` binding: questions answered from Python's own bundled documentation.

Data: `data/research.jsonl`, 23 questions (id, question, key points, evidence doc ids) written
for this project against the frozen stdlib-docstring corpus of `maserve_prefect.tools.retrieval`
(the `doc_search` / `web_search` tools; results carry the corpus digest). `evidence` names the
corpus documents that answer the question (the tests check they exist and that BM25 ranks one of
them in the top 10). Evaluation: key-point recall (each point's terms, `a|b` alternatives, must
all appear); pass at 0.67.

Content model (simulator) — output tokens per role class, then decision probabilities:

- `critic`: median 260 tokens, sigma 0.5, clip [40, 900]
- `default`: median 250 tokens, sigma 0.5, clip [20, 1000]
- `planner`: median 220 tokens, sigma 0.4, clip [40, 800]
- `researcher`: median 380 tokens, sigma 0.5, clip [60, 1500]
- `writer`: median 650 tokens, sigma 0.4, clip [120, 2000]
- accept by round: 0.4, 0.7, 0.85
- converge by round: 0.3, 0.6, 0.8
- spawn weights (1..n children): 0.1, 0.3, 0.35, 0.25
- vote agreement: 0.65
- context: reference 600 delivered tokens, length elasticity 0.3, accept slope 1, converge slope 0.5; seeded by the prompt digest

What the context line means (`bindings.content`): a call given more delivered tokens writes
longer (median x ((600 + d) / 1200) ** 0.3: x0.81 with nothing delivered, x1.15 at 1,300), and an
evaluator given a longer draft accepts more often (log-odds + ln((600 + d) / 1200)); every draw
is also seeded by the digest of the call's prompt, so Full vs Selected delivery changes the
downstream work natively. Modeled, not measured: a real engine (`--content engine`) is the
reference.
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
from maserve_prefect.bindings.content import ContentProfile, ContextResponse, LengthDist

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
            "researcher": LengthDist(380, 0.5, 60, 1500),
            "planner": LengthDist(220, 0.4, 40, 800),
            "critic": LengthDist(260, 0.5, 40, 900),
            "writer": LengthDist(650, 0.4, 120, 2000),
            "default": LengthDist(250, 0.5, 20, 1000),
        },
        accept_by_round=(0.4, 0.7, 0.85),
        converge_by_round=(0.3, 0.6, 0.8),
        spawn_weights=(0.1, 0.3, 0.35, 0.25),
        vote_agreement=0.65,
        context=ContextResponse(
            reference_tokens=600, length_elasticity=0.3, accept_slope=1.0, converge_slope=0.5
        ),
    )

    def evaluate(self, instance: TaskInstance, answer: Answer) -> Quality:
        """Key-point recall of the answer; pass at `PASS_RECALL`."""
        points = key_points(self.record(instance.instance_id)["key_points"])
        return recall_quality(answer_text(answer), points, PASS_RECALL)
