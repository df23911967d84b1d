"""The simulator content model: seeded, order-independent, documented beside each binding."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from maserve_prefect.bindings import content_model_for, get_binding, list_bindings
from maserve_prefect.bindings.content import (
    ContentModel,
    ContentProfile,
    LengthDist,
    synthetic_text,
    synthetic_token_ids,
)

from maserve_prefect.errors import ConfigError
from maserve_prefect.spec.binding import BindingInfo, TaskBinding


def make_model(seed: int = 0, **profile: object) -> ContentModel:
    lengths = {"default": LengthDist(200, 0.5, 20, 800), "judge": LengthDist(50, 0.2, 5, 100)}
    return ContentModel("demo", ContentProfile(lengths=lengths, **profile), seed)  # type: ignore[arg-type]


def draws(model: ContentModel, root: str = "r0") -> list[object]:
    return [
        model.output_tokens("solver", root=root, op="s/0"),
        model.output_tokens("judge", root=root, op="j/0"),
        model.accepts(2, root=root, op="c/1"),
        model.converges(1, root=root, op="d/1"),
        model.spawn_count(4, root=root, op="p/0"),
        model.votes(5, root=root, op="v/0"),
        model.payload_text(7, root=root, op="s/0"),
        model.payload_token_ids(5, 32000, root=root, op="s/0"),
    ]


def test_same_seed_same_draws_in_any_order() -> None:
    a, b = make_model(1), make_model(1)
    first = draws(a)
    draws(b, root="other")  # unrelated draws in between must not shift the stream
    assert draws(b) == first


def test_different_seeds_and_roots_differ() -> None:
    base = [make_model(0).output_tokens("solver", root=f"r{i}", op="s") for i in range(20)]
    other = [make_model(1).output_tokens("solver", root=f"r{i}", op="s") for i in range(20)]
    assert base != other
    assert len(set(base)) > 5


def test_stable_across_processes() -> None:
    code = (
        "from maserve_prefect.bindings import get_binding;"
        "m = get_binding('math').content_model(3);"
        "print(m.output_tokens('solver', root='r', op='o'), m.spawn_count(4, root='r', op='o'))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": str(h), "PATH": "/usr/bin:/bin"},
        ).stdout
        for h in (1, 2)
    }  # fmt: skip
    assert len(outs) == 1


def test_length_distribution_matches_documented_median() -> None:
    model = make_model()
    samples = np.array([model.output_tokens("solver", root=f"r{i}", op="x") for i in range(2000)])
    assert samples.min() >= 20 and samples.max() <= 800
    assert 180 <= np.median(samples) <= 220
    judged = [model.output_tokens("judge", root=f"r{i}", op="x") for i in range(200)]
    assert max(judged) <= 100


def test_probabilities_follow_the_tables() -> None:
    model = make_model(accept_by_round=(0.0, 1.0), vote_agreement=1.0, spawn_weights=(0.0, 1.0))
    assert not any(model.accepts(1, root=f"r{i}", op="c") for i in range(50))
    assert all(model.accepts(5, root=f"r{i}", op="c") for i in range(50))  # last entry repeats
    assert model.votes(4, root="r", op="v") == [0, 0, 0, 0]
    assert {model.spawn_count(4, root=f"r{i}", op="p") for i in range(30)} == {2}
    assert model.spawn_count(1, root="r", op="p") == 1  # all weight above the cap


def test_converge_rate_is_roughly_its_probability() -> None:
    model = make_model(converge_by_round=(0.3,))
    rate = np.mean([model.converges(1, root=f"r{i}", op="d") for i in range(2000)])
    assert 0.25 < rate < 0.35


@given(n=st.integers(0, 300), seed=st.integers(0, 2**32))
@settings(max_examples=40, deadline=None)
def test_synthetic_payloads_have_exact_lengths(n: int, seed: int) -> None:
    assert len(synthetic_text(n, seed).split()) == n
    ids = synthetic_token_ids(n, seed, 1000)
    assert len(ids) == n and all(0 <= t < 1000 for t in ids)
    assert synthetic_text(n, seed) == synthetic_text(n, seed)


@pytest.mark.parametrize(
    "bad",
    [
        lambda: LengthDist(10, 0.5, 20, 100),
        lambda: LengthDist(50, -1, 20, 100),
        lambda: ContentProfile(lengths={"solver": LengthDist(50, 0.5, 20, 100)}),
        lambda: make_model(accept_by_round=(1.5,)),
        lambda: make_model(spawn_weights=(0.0,)),
        lambda: make_model().accepts(0, root="r", op="o"),
        lambda: synthetic_text(-1, 0),
    ],
)
def test_bad_profiles_and_arguments_raise(bad: object) -> None:
    with pytest.raises(ConfigError):
        bad()  # type: ignore[operator]


@pytest.mark.parametrize("name", list_bindings())
def test_distributions_are_documented_beside_each_binding(name: str) -> None:
    binding = get_binding(name)
    doc = importlib.import_module(type(binding).__module__).__doc__ or ""
    for line in binding.content_profile.describe():
        assert line in doc, f"{name}: docstring lacks {line!r}"


def test_user_binding_gets_default_content_model() -> None:
    class Tiny(TaskBinding):
        info = BindingInfo(binding_id="tiny", instance_ids=("a",))

        def instance(self, instance_id):  # type: ignore[no-untyped-def]
            raise NotImplementedError

        def evaluate(self, instance, answer):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    model = content_model_for(Tiny(), seed=2)
    assert model.binding_id == "tiny" and model.output_tokens("x", root="r", op="o") >= 20


def test_context_response_makes_draws_functions_of_what_the_call_was_given() -> None:
    """With a context response, more delivered tokens (same prompt digest, so the same noise)
    never shorten the output nor lower acceptance, and a different digest redraws; without
    one, `given` changes nothing."""
    from maserve_prefect.bindings.content import ContextResponse, Given

    lengths = {"default": LengthDist(300, 0.5, 10, 5000)}
    responsive = ContentModel(
        "demo",
        ContentProfile(
            lengths=lengths,
            accept_by_round=(0.5,),
            context=ContextResponse(600, length_elasticity=0.5, accept_slope=2.0),
        ),
        seed=1,
    )
    plain = ContentModel("demo", ContentProfile(lengths=lengths, accept_by_round=(0.5,)), seed=1)
    grew = accepted_more = 0
    for i in range(40):
        small, large = Given(50, f"d{i}"), Given(3000, f"d{i}")
        n_small = responsive.output_tokens("x", root="r", op=f"o{i}", given=small)
        n_large = responsive.output_tokens("x", root="r", op=f"o{i}", given=large)
        assert n_large >= n_small
        grew += n_large > n_small
        a_small = responsive.accepts(1, root="r", op=f"o{i}", given=small)
        a_large = responsive.accepts(1, root="r", op=f"o{i}", given=large)
        assert a_large or not a_small
        accepted_more += a_large and not a_small
        assert plain.output_tokens("x", root="r", op=f"o{i}", given=small) == plain.output_tokens(
            "x", root="r", op=f"o{i}"
        )
    assert grew == 40 and accepted_more > 0
    redraws = {
        responsive.output_tokens("x", root="r", op="o", given=Given(600, f"digest{i}"))
        for i in range(10)
    }
    assert len(redraws) > 1  # the prompt digest seeds the draw


@pytest.mark.parametrize("name", list_bindings())
def test_every_binding_responds_to_what_a_call_was_given(name: str) -> None:
    """Under every shipped binding a downstream call given less (Selected) writes less on the
    same noise and redraws under its own prompt digest, and the same context always gives the
    same work and decisions (issue 16: seeded by the digest of the delivered context)."""
    from maserve_prefect.bindings.content import Given

    model = get_binding(name).content_model(seed=3)
    assert model.profile.context is not None
    ref = model.profile.context.reference_tokens
    full, selected = Given(int(3 * ref), "full-digest"), Given(int(ref // 10), "sel-digest")
    for role in ("synthesizer", "verifier", "critic", "judge"):
        same = Given(full.delivered_tokens, selected.digest)  # same noise, more context
        n_sel = model.output_tokens(role, root="r", op=f"{role}/0", given=selected)
        assert model.output_tokens(role, root="r", op=f"{role}/0", given=same) >= n_sel
        n_full = model.output_tokens(role, root="r", op=f"{role}/0", given=full)
        assert n_full == model.output_tokens(role, root="r", op=f"{role}/0", given=full)
    shorter = [
        model.output_tokens("verifier", root=f"r{i}", op="v", given=Given(full.delivered_tokens, f"d{i}"))
        > model.output_tokens("verifier", root=f"r{i}", op="v", given=Given(selected.delivered_tokens, f"d{i}"))
        for i in range(20)
    ]  # fmt: skip
    assert sum(shorter) >= 15  # the length median scales with delivered tokens
    decisions = [
        (
            model.accepts(1, root="r", op="c", given=g),
            model.converges(1, root="r", op="d", given=g),
            model.spawn_count(4, root="r", op="p", given=g),
            model.votes(3, root="r", op="v", given=g),
        )
        for g in (full, full, selected)
    ]
    assert decisions[0] == decisions[1]
    redrawn = {model.spawn_count(4, root="r", op="p", given=Given(10, f"x{i}")) for i in range(12)}
    assert len(redrawn) > 1  # the digest seeds the spawn decision too


def test_answer_share_delivers_part_of_each_output() -> None:
    """Issue 16: an output's delivered answer is `answer_share` of it (the rest models Qwen3's
    thinking tokens); the shared context response's reference counts delivered answers."""
    model = make_model(answer_share=0.25)
    assert [model.answer_tokens(n) for n in (0, 1, 3, 400)] == [0, 1, 1, 100]
    assert make_model().answer_tokens(400) == 400  # share 1: everything is delivered
    lengths = {"default": LengthDist(2000, 0.5, 20, 8000)}
    profile = ContentProfile(lengths=lengths, answer_share=0.25).responsive()
    assert profile.context is not None and profile.context.reference_tokens == 1000.0
    with pytest.raises(ConfigError):
        ContentProfile(lengths=lengths, answer_share=0.0)


@pytest.mark.parametrize("name", list_bindings())
def test_shipped_lengths_fit_the_serving_limit_and_the_g5_share(name: str) -> None:
    """Every shipped binding's clip stays within the paper's 8,192 model length and delivers
    the share fitted to App. G.5 (`benchmarks/demand_population.py`)."""
    from maserve_prefect.bindings.content import QWEN3_ANSWER_SHARE

    profile = get_binding(name).content_profile
    assert profile.answer_share == QWEN3_ANSWER_SHARE
    assert all(d.max_tokens <= 8192 for d in profile.lengths.values())
