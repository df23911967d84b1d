"""The simulator content model: seeded distributions that stand in for text a simulator lacks.

On the simulator no model writes text, yet a native run still needs output lengths and control
decisions (does the critic accept this round? did the debate converge? how many children does
the planner spawn? do the voters agree?). Each binding carries a `ContentProfile` — per-role
output-length distributions and per-decision probabilities, documented in the binding's module
docstring — and `ContentModel` draws from it.

One idea: every draw uses its own numpy `Generator` seeded from a SHA-256 of
(binding id, run seed, root id, op identity, purpose). Draws therefore do not depend on the
order in which ops run, and never use Python's salted `hash()` of strings, so the same seed gives
the same work in every process. Payloads are deterministic synthetic text / token ids of the
realized length, stored in the CAS like real outputs.

Lengths are lognormal: `median * exp(sigma * N(0, 1))`, rounded and clipped to [min, max].
Role names map to a role class (`pro`, `con`, `skeptic` → `debater`); unknown roles use
`default`.

Context dependence (issue 16): a profile with a `ContextResponse` makes a call's draws functions
of what the call was actually given — `Given`: the tokens of its delivered artifacts and earlier
turns under its context rule, and a digest of its resolved prompt. The digest joins the seed (a
call given other context draws anew), the length median scales by
`((ref + delivered) / (2 ref)) ** length_elasticity`, and the accept / converge probabilities
shift on the log-odds scale by `slope * ln((ref + delivered) / (2 ref))`. So Full vs Selected
delivery changes downstream output lengths and control decisions natively: a shorter delivered
context gives a shorter draft, which the critic (given that draft) accepts less often, which
adds a revision round. The spawn count and the votes are seeded by the digest too (a planner
or voter given other context decides anew; their probabilities do not shift). Without a
`ContextResponse`, or without `given`, the draws are the context-free ones above (a pure
function of binding, seed, root and op). A model on a real engine (`--content engine`)
generates from what it was given and stays the reference; these responses are modeled.

Reasoning and answer (issue 16): a profile's `answer_share` is the share of each generated
output that is the delivered answer — the artifact's text, what downstream calls are given; the
rest models Qwen3's thinking tokens, which are generated (decode steps, KV residency, the output
count) but stripped from what is delivered, as Qwen3's chat template and its reasoning parser
do. The paper's Qwen3-8B / 910C population generates 3.8x more output than it reads (App. G.5:
2,622 output vs 689 input tokens per call), which only a delivered answer much shorter than the
generation can give. `answer_tokens(n)` is `max(1, round(answer_share * n))`; share 1 (the
default) delivers everything.

Every shipped binding responds the same way (`ContentProfile.responsive`, one shared response,
`ContextResponse.standard`): length elasticity 0.3, accept slope 1, converge slope 0.5, and a
reference of two delivered upstream answers at the binding's `default` median (times its answer
share) unless the binding states its own; each binding's docstring quotes its line. What is modeled is therefore the *direction
and size* of the response (a call given twice the reference writes x1.23, one given nothing
x0.81; acceptance odds x2 per doubling), not any measured text.

Examples:
    >>> profile = ContentProfile(lengths={"default": LengthDist(200, 0.4, 20, 800)})
    >>> model = ContentModel("demo", profile, seed=7)
    >>> model.output_tokens("solver", root="r0", op="solve/0") == model.output_tokens(
    ...     "solver", root="r0", op="solve/0")
    True
    >>> len(synthetic_text(12, seed=1).split())
    12
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from maserve_prefect.errors import ConfigError

ROLE_CLASSES: Mapping[str, str] = {
    "solver": "solver", "worker": "worker", "child": "worker", "coder": "coder",
    "analyst": "analyst", "analyst_a": "analyst", "analyst_b": "analyst",
    "synthesizer": "writer", "writer": "writer", "editor": "writer", "expert": "writer",
    "verifier": "verifier", "validator": "verifier", "tester": "verifier",
    "critic": "critic", "evaluator": "critic", "reviewer": "critic", "diagnoser": "critic",
    "debater": "debater", "pro": "debater", "con": "debater", "skeptic": "debater",
    "judge": "judge", "aggregator": "aggregator", "summarizer": "summarizer",
    "researcher": "researcher", "lead": "planner", "planner": "planner", "parent": "planner",
    "repairer": "coder",
}  # fmt: skip
"""Role name → role class used to pick a length distribution (unknown roles → `default`)."""

_WORDS = (
    "the model reviews each step and notes where the argument holds or needs a fix so the team "
    "can compare answers check units weigh evidence cite sources list risks propose changes "
    "estimate totals verify results summarize decisions assign owners track deadlines"
).split()


@dataclass(frozen=True, slots=True)
class LengthDist:
    """Lognormal output length in tokens, clipped to [min_tokens, max_tokens]."""

    median_tokens: float
    sigma: float
    min_tokens: int
    max_tokens: int

    def __post_init__(self) -> None:
        if not (1 <= self.min_tokens <= self.median_tokens <= self.max_tokens):
            raise ConfigError(
                f"length distribution needs 1 <= min ({self.min_tokens}) <= median "
                f"({self.median_tokens}) <= max ({self.max_tokens})"
            )
        if self.sigma < 0:
            raise ConfigError(f"length distribution sigma must be >= 0, got {self.sigma}")

    def sample(self, rng: np.random.Generator) -> int:
        """One length draw."""
        raw = self.median_tokens * float(np.exp(self.sigma * rng.standard_normal()))
        return int(np.clip(round(raw), self.min_tokens, self.max_tokens))


@dataclass(frozen=True, slots=True)
class Given:
    """What one call was given: `delivered_tokens` (its delivered artifacts and replayed turns,
    rendered under its context rule) and `digest` (of its resolved prompt messages)."""

    delivered_tokens: int
    digest: str


QWEN3_ANSWER_SHARE = 0.35
"""Answer share of every shipped binding (`ContentProfile.answer_share`), fitted with the length
scale to App. G.5's stated per-call figures (689 input, 2,622 output tokens per call on the
paper's Qwen3-8B / 910C population; `benchmarks/demand_population.py` prints the fit)."""

STANDARD_ELASTICITY = 0.3
"""Length elasticity of the shared context response (`ContextResponse.standard`): twice the
delivered context (around the reference) gives a median about 1.23x longer."""
STANDARD_ACCEPT_SLOPE = 1.0
"""Log-odds shift of acceptance per unit log scale of delivered context (shared response)."""
STANDARD_CONVERGE_SLOPE = 0.5
"""Log-odds shift of debate convergence per unit log scale of delivered context (shared)."""
REFERENCE_OUTPUTS = 2.0
"""The shared response's default reference: this many delivered upstream answers at the
binding's `default` median times its answer share (a synthesizer gets two analyses; a critic
gets a draft and the task)."""


@dataclass(frozen=True, slots=True)
class ContextResponse:
    """How a binding's draws respond to what a call was given (module docstring).

    Attributes:
        reference_tokens: the delivered size at which lengths and probabilities are unchanged
            (the scale is `(ref + delivered) / (2 ref)`: 1/2 with nothing delivered).
        length_elasticity: exponent of that scale on the output length median.
        accept_slope: log-odds shift of the evaluator's acceptance per unit log scale.
        converge_slope: log-odds shift of a debate's convergence per unit log scale.
    """

    reference_tokens: float
    length_elasticity: float = 0.0
    accept_slope: float = 0.0
    converge_slope: float = 0.0

    def __post_init__(self) -> None:
        if self.reference_tokens <= 0:
            raise ConfigError(
                f"context response reference_tokens must be > 0, got {self.reference_tokens}"
            )

    def log_scale(self, given: Given) -> float:
        """`ln((ref + delivered) / (2 ref))`: 0 at the reference size."""
        ref = self.reference_tokens
        return float(np.log((ref + max(given.delivered_tokens, 0)) / (2 * ref)))

    @classmethod
    def standard(
        cls,
        lengths: Mapping[str, LengthDist],
        reference_tokens: float | None = None,
        answer_share: float = 1.0,
    ) -> ContextResponse:
        """The shared response every shipped binding uses (module docstring): length elasticity
        `STANDARD_ELASTICITY`, accept slope `STANDARD_ACCEPT_SLOPE`, converge slope
        `STANDARD_CONVERGE_SLOPE`; the reference is `reference_tokens`, else two delivered
        upstream answers (`answer_share` of the `default` role class's median each: what a
        synthesizer or critic is typically given).

        Examples:
            >>> r = ContextResponse.standard({"default": LengthDist(250, 0.5, 20, 1000)})
            >>> r.reference_tokens, r.length_elasticity, r.accept_slope, r.converge_slope
            (500.0, 0.3, 1.0, 0.5)
            >>> ContextResponse.standard({"default": LengthDist(2000, 0.5, 20, 8000)},
            ...                          answer_share=0.25).reference_tokens
            1000.0
        """
        ref = reference_tokens
        if ref is None:
            ref = REFERENCE_OUTPUTS * float(lengths["default"].median_tokens) * answer_share
        return cls(
            reference_tokens=ref,
            length_elasticity=STANDARD_ELASTICITY,
            accept_slope=STANDARD_ACCEPT_SLOPE,
            converge_slope=STANDARD_CONVERGE_SLOPE,
        )

    def describe(self) -> str:
        """The documented line of this response."""
        return (
            f"context: reference {self.reference_tokens:g} delivered tokens, length elasticity "
            f"{self.length_elasticity:g}, accept slope {self.accept_slope:g}, converge slope "
            f"{self.converge_slope:g}; seeded by the prompt digest"
        )


def _check_probs(name: str, probs: tuple[float, ...]) -> None:
    if not probs or any(not 0.0 <= p <= 1.0 for p in probs):
        raise ConfigError(f"content profile {name} must be non-empty probabilities in [0, 1]")


@dataclass(frozen=True, slots=True)
class ContentProfile:
    """A binding's documented content distributions.

    Attributes:
        lengths: role class → output length distribution; must hold `default`.
        accept_by_round: P(the evaluator accepts) at refinement round 1, 2, ... (last repeats).
        converge_by_round: P(the debate has converged) after round 1, 2, ... (last repeats).
        spawn_weights: relative weight of spawning 1, 2, ... children (truncated at the max).
        vote_agreement: P(one voter gives the plurality answer) in a vote / ensemble.
        context: how lengths and decisions respond to what a call was given; None: they do not.
        answer_share: share of each generated output delivered as the artifact's text (the
            rest is reasoning, generated but stripped; module docstring), in (0, 1].
    """

    lengths: Mapping[str, LengthDist]
    accept_by_round: tuple[float, ...] = (0.35, 0.6, 0.8)
    converge_by_round: tuple[float, ...] = (0.2, 0.5, 0.75)
    spawn_weights: tuple[float, ...] = (0.15, 0.35, 0.3, 0.2)
    vote_agreement: float = 0.7
    context: ContextResponse | None = None
    answer_share: float = 1.0

    def __post_init__(self) -> None:
        if "default" not in self.lengths:
            raise ConfigError("content profile lengths must include a 'default' role class")
        _check_probs("accept_by_round", self.accept_by_round)
        _check_probs("converge_by_round", self.converge_by_round)
        _check_probs("vote_agreement", (self.vote_agreement,))
        if not 0.0 < self.answer_share <= 1.0:
            raise ConfigError(
                f"content profile answer_share must be in (0, 1], got {self.answer_share}"
            )
        if not self.spawn_weights or min(self.spawn_weights) < 0 or sum(self.spawn_weights) <= 0:
            raise ConfigError("content profile spawn_weights must be non-negative, not all zero")

    def responsive(self, reference_tokens: float | None = None) -> ContentProfile:
        """This profile with the shared context response (`ContextResponse.standard`)."""
        return replace(
            self,
            context=ContextResponse.standard(self.lengths, reference_tokens, self.answer_share),
        )

    def describe(self) -> list[str]:
        """One line per documented distribution (the binding docstrings quote these lines)."""
        lines = [
            f"`{cls}`: median {d.median_tokens:g} tokens, sigma {d.sigma:g}, "
            f"clip [{d.min_tokens}, {d.max_tokens}]"
            for cls, d in sorted(self.lengths.items())
        ]
        lines.append(f"accept by round: {', '.join(f'{p:g}' for p in self.accept_by_round)}")
        lines.append(f"converge by round: {', '.join(f'{p:g}' for p in self.converge_by_round)}")
        lines.append(
            f"spawn weights (1..n children): {', '.join(f'{w:g}' for w in self.spawn_weights)}"
        )
        lines.append(f"vote agreement: {self.vote_agreement:g}")
        lines.append(
            f"answer share: {self.answer_share:g} of each output is delivered "
            "(the rest is reasoning, generated but not delivered)"
        )
        lines.append(
            self.context.describe()
            if self.context is not None
            else "context: none (lengths and decisions do not depend on what a call was given)"
        )
        return lines


def derive_seed(*parts: object) -> int:
    """A 64-bit seed from the parts' text, stable across processes (SHA-256, not `hash()`)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def synthetic_text(num_tokens: int, seed: int) -> str:
    """Deterministic filler text of exactly `num_tokens` whitespace-separated words."""
    if num_tokens < 0:
        raise ConfigError(f"num_tokens must be >= 0, got {num_tokens}")
    picks = np.random.default_rng(derive_seed("text", seed)).integers(0, len(_WORDS), num_tokens)
    return " ".join(_WORDS[i] for i in picks)


def synthetic_token_ids(num_tokens: int, seed: int, vocab_size: int) -> list[int]:
    """Deterministic token ids in [0, vocab_size) of length `num_tokens`."""
    if num_tokens < 0 or vocab_size < 1:
        raise ConfigError(
            f"need num_tokens >= 0 and vocab_size >= 1, got {num_tokens}, {vocab_size}"
        )
    rng = np.random.default_rng(derive_seed("ids", seed))
    return [int(t) for t in rng.integers(0, vocab_size, num_tokens)]


@dataclass(frozen=True, slots=True)
class ContentModel:
    """Seeded draws from a binding's `ContentProfile` for one run seed.

    Every method takes the op's identity (`root`, `op`: any stable string such as the stage
    instance and call index); the same (binding, seed, root, op) always gives the same draw.
    """

    binding_id: str
    profile: ContentProfile
    seed: int = 0
    role_classes: Mapping[str, str] = field(default_factory=lambda: ROLE_CLASSES)

    def rng(
        self, purpose: str, *, root: str, op: str, given: Given | None = None
    ) -> np.random.Generator:
        """The generator for one decision of one op (also seeded by the prompt digest when
        the profile responds to context and `given` is known)."""
        parts: tuple[object, ...] = (self.binding_id, self.seed, root, op, purpose)
        if self._response(given) is not None:
            assert given is not None
            parts += (given.digest,)
        return np.random.default_rng(derive_seed(*parts))

    def _response(self, given: Given | None) -> ContextResponse | None:
        return self.profile.context if given is not None else None

    def length_dist(self, role: str) -> LengthDist:
        """The length distribution of `role` (via its role class, else `default`)."""
        cls = self.role_classes.get(role, role)
        return self.profile.lengths.get(cls, self.profile.lengths["default"])

    def output_tokens(self, role: str, *, root: str, op: str, given: Given | None = None) -> int:
        """The realized output length of a model call by `role` (given `given`)."""
        dist = self.length_dist(role)
        rng = self.rng("length", root=root, op=op, given=given)
        response = self._response(given)
        if response is not None and response.length_elasticity:
            assert given is not None
            factor = float(np.exp(response.length_elasticity * response.log_scale(given)))
            dist = LengthDist(
                float(np.clip(dist.median_tokens * factor, dist.min_tokens, dist.max_tokens)),
                dist.sigma,
                dist.min_tokens,
                dist.max_tokens,
            )
        return dist.sample(rng)

    def accepts(self, round_index: int, *, root: str, op: str, given: Given | None = None) -> bool:
        """Whether the evaluator accepts the draft at 1-based refinement round `round_index`."""
        response = self._response(given)
        slope = response.accept_slope if response is not None else 0.0
        return self._bernoulli(
            self.profile.accept_by_round, round_index, "accept", root, op, given, slope
        )

    def converges(
        self, round_index: int, *, root: str, op: str, given: Given | None = None
    ) -> bool:
        """Whether the debate has converged after 1-based round `round_index`."""
        response = self._response(given)
        slope = response.converge_slope if response is not None else 0.0
        return self._bernoulli(
            self.profile.converge_by_round, round_index, "converge", root, op, given, slope
        )

    def spawn_count(
        self, max_children: int, *, root: str, op: str, given: Given | None = None
    ) -> int:
        """How many children a planner spawns, in [1, max_children]."""
        if max_children < 1:
            raise ConfigError(f"max_children must be >= 1, got {max_children}")
        weights = np.zeros(max_children)
        n = min(max_children, len(self.profile.spawn_weights))
        weights[:n] = self.profile.spawn_weights[:n]
        if weights.sum() == 0:  # every weighted count exceeds the cap: spawn the cap
            return max_children
        rng = self.rng("spawn", root=root, op=op, given=given)
        return int(rng.choice(max_children, p=weights / weights.sum())) + 1

    def votes(
        self, num_voters: int, *, root: str, op: str, given: Given | None = None
    ) -> list[int]:
        """Each voter's answer label: 0 is the plurality answer (w.p. `vote_agreement`);
        a dissenting voter picks one of two alternative labels, 1 or 2."""
        rng = self.rng("vote", root=root, op=op, given=given)
        agree = rng.random(num_voters) < self.profile.vote_agreement
        alternatives = rng.integers(1, 3, num_voters)
        return [0 if a else int(alt) for a, alt in zip(agree, alternatives, strict=True)]

    def answer_tokens(self, num_output_tokens: int) -> int:
        """The delivered answer's length of an output of `num_output_tokens` (module docstring:
        the rest is reasoning, generated but not delivered); 0 for an empty output."""
        if num_output_tokens <= 0:
            return 0
        return max(1, round(self.profile.answer_share * num_output_tokens))

    def payload_text(self, num_tokens: int, *, root: str, op: str) -> str:
        """Synthetic output text of the realized length for op (`root`, `op`)."""
        return synthetic_text(num_tokens, derive_seed(self.binding_id, self.seed, root, op))

    def payload_token_ids(
        self, num_tokens: int, vocab_size: int, *, root: str, op: str
    ) -> list[int]:
        """Synthetic output token ids of the realized length for op (`root`, `op`)."""
        seed = derive_seed(self.binding_id, self.seed, root, op)
        return synthetic_token_ids(num_tokens, seed, vocab_size)

    def _bernoulli(
        self,
        table: tuple[float, ...],
        round_index: int,
        purpose: str,
        root: str,
        op: str,
        given: Given | None = None,
        slope: float = 0.0,
    ) -> bool:
        if round_index < 1:
            raise ConfigError(f"round_index is 1-based, got {round_index}")
        p = table[min(round_index, len(table)) - 1]
        response = self._response(given)
        if response is not None and slope and 0.0 < p < 1.0:
            assert given is not None
            logit = float(np.log(p / (1 - p))) + slope * response.log_scale(given)
            p = 1.0 / (1.0 + float(np.exp(-logit)))
        return bool(self.rng(purpose, root=root, op=op, given=given).random() < p)
