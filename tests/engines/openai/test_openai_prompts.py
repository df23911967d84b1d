"""Request → OpenAI call mapping: synthesized prompts, endpoint choice, vLLM fields, controls."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from maserve_prefect.engines.openai.prompts import (
    ControlChoice,
    ServerFeatures,
    build_call,
    resolve_controls,
    synth_token_ids,
)
from maserve_prefect.errors import ConfigError, RequestError, UnsupportedError
from maserve_prefect.protocol.capabilities import Capabilities
from maserve_prefect.protocol.controls import (
    CachePrepare,
    CacheRetain,
    Control,
    ExecutionMode,
    Force,
    Priority,
)
from maserve_prefect.protocol.requests import Request
from maserve_prefect.protocol.subjects import ContextRef

VLLM = ServerFeatures(token_id_prompts=True, length_lock=True, cache_salt=True)
PLAIN = ServerFeatures(token_id_prompts=True)


def req(**kw: Any) -> Request:
    kw.setdefault("num_prompt_tokens", 8)
    return Request("r1", "tiny", **kw)


# -- synth_token_ids ---------------------------------------------------------------------------


def test_synth_is_deterministic_and_in_range() -> None:
    a = synth_token_ids(100, (5, 6), 16, vocab_size=300, salt="req-1")
    b = synth_token_ids(100, (5, 6), 16, vocab_size=300, salt="req-1")
    assert a == b
    assert len(a) == 100
    assert min(a) >= 16 and max(a) < 300


def test_shared_hash_prefixes_share_token_prefixes() -> None:
    a = synth_token_ids(64, (1, 2, 3), 16, vocab_size=256, salt="a")
    b = synth_token_ids(64, (1, 2, 9), 16, vocab_size=256, salt="b")
    assert a[:32] == b[:32]
    assert a[32:48] != b[32:48]  # the third block's hash differs
    assert a[48:] != b[48:]  # tails come from the request ids


def test_block_tokens_depend_on_the_hash_not_the_position_or_salt() -> None:
    a = synth_token_ids(32, (7, 8), 16, vocab_size=256, salt="a")
    b = synth_token_ids(16, (8,), 16, vocab_size=256, salt="zzz")
    assert a[16:] == b


def test_no_hashes_means_the_whole_prompt_comes_from_the_salt() -> None:
    assert synth_token_ids(20, (), 0, salt="x") != synth_token_ids(20, (), 0, salt="y")
    assert synth_token_ids(20, (), 0, salt="x") == synth_token_ids(20, (), 0, salt="x")


def test_partial_last_block_is_cut() -> None:
    full = synth_token_ids(32, (1, 2), 16, vocab_size=256)
    cut = synth_token_ids(20, (1, 2), 16, vocab_size=256)
    assert cut == full[:20]


def test_negative_and_huge_hashes_are_fine() -> None:
    ids = synth_token_ids(8, (-(2**63), 2**200), 4, vocab_size=64)
    assert len(ids) == 8 and all(16 <= t < 64 for t in ids)


@pytest.mark.parametrize(
    ("args", "match"),
    [((0, (), 0, 256), "num_tokens"), ((4, (), 0, 16), "vocab_size"), ((4, (1,), 0, 256), "block")],
)
def test_synth_rejects_bad_arguments(
    args: tuple[int, tuple[int, ...], int, int], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        synth_token_ids(*args)


# -- build_call ----------------------------------------------------------------------------------


def test_token_id_prompts_go_to_completions_unchanged() -> None:
    spec = build_call(
        req(num_prompt_tokens=None, prompt_token_ids=(9, 8, 7)), model="m", features=PLAIN
    )
    assert spec.endpoint == "completions"
    assert spec.params == {
        "model": "m",
        "max_tokens": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt": [9, 8, 7],
    }
    assert spec.extra_body == {}


def test_messages_go_to_chat() -> None:
    spec = build_call(
        req(messages=(("system", "be brief"), ("user", "hi"))), model="m", features=PLAIN
    )
    assert spec.endpoint == "chat"
    assert spec.params["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert "prompt" not in spec.params


def test_token_ids_win_over_messages() -> None:
    r = req(num_prompt_tokens=None, prompt_token_ids=(1, 2), messages=(("user", "hi"),))
    assert build_call(r, model="m", features=PLAIN).endpoint == "completions"


def test_length_only_prompts_are_synthesized_from_hashes_and_request_id() -> None:
    r = req(num_prompt_tokens=40, prefix_block_hashes=(11, 12), prefix_block_size=16)
    spec = build_call(r, model="m", features=PLAIN, vocab_size=500)
    assert spec.params["prompt"] == synth_token_ids(40, (11, 12), 16, 500, salt="r1")


def test_length_lock_sends_min_tokens_and_ignore_eos() -> None:
    spec = build_call(req(max_tokens=5, min_tokens=5), model="m", features=VLLM)
    assert spec.extra_body == {"min_tokens": 5, "ignore_eos": True}
    assert spec.notes == ()


def test_min_tokens_below_max_is_sent_without_ignore_eos() -> None:
    spec = build_call(req(max_tokens=5, min_tokens=2), model="m", features=VLLM)
    assert spec.extra_body == {"min_tokens": 2}


def test_length_lock_on_a_server_without_it_is_noted_not_sent() -> None:
    spec = build_call(req(max_tokens=5, min_tokens=5), model="m", features=PLAIN, where="e0")
    assert spec.extra_body == {}
    assert spec.notes == ("length lock not supported by e0; output may end early at EOS",)


def test_priority_cache_salt_and_token_ids_travel_in_extra_body() -> None:
    features = ServerFeatures(cache_salt=True, return_token_ids=True)
    spec = build_call(req(cache_salt="tenant-a"), model="m", features=features, priority=-2)
    assert spec.extra_body == {"priority": -2, "cache_salt": "tenant-a", "return_token_ids": True}


def test_cache_salt_without_support_is_noted() -> None:
    spec = build_call(req(cache_salt="t"), model="m", features=PLAIN)
    assert "cache_salt" not in spec.extra_body
    assert any("cache_salt" in n for n in spec.notes)


def test_token_prompts_on_a_server_without_them_are_unsupported() -> None:
    with pytest.raises(UnsupportedError, match=r"token-id prompts.*'r1'"):
        build_call(req(), model="m", features=ServerFeatures(token_id_prompts=False))
    chat = req(messages=(("user", "hi"),))
    assert (
        build_call(chat, model="m", features=ServerFeatures(token_id_prompts=False)).endpoint
        == "chat"
    )


# -- resolve_controls -------------------------------------------------------------------------


def caps(*types: type[Control], modes: tuple[str, ...] = ("default",)) -> Capabilities:
    """An OpenAI server's capabilities as `OpenAIEngine.capabilities()` builds them."""
    return Capabilities(types, True, True, Priority in types, True, False, (), modes)


def no_prio(request: Request, controls: list[Control]) -> ControlChoice:
    return resolve_controls(request, controls, capabilities=caps(ExecutionMode), where="e0")


def prio(request: Request, controls: list[Control]) -> ControlChoice:
    return resolve_controls(
        request, controls, capabilities=caps(ExecutionMode, Priority), where="e0"
    )


def test_required_priority_on_a_non_priority_server_is_unsupported() -> None:
    with pytest.raises(UnsupportedError, match=r"e0 cannot honour required Priority\(.*value=1\)"):
        no_prio(req(), [Priority(1, force=Force.REQUIREMENT)])


def test_preferred_priority_on_a_non_priority_server_is_noted() -> None:
    choice = no_prio(req(), [Priority(1)])
    assert choice.priority is None
    assert len(choice.notes) == 1 and "dropped preference Priority" in choice.notes[0]


def test_request_priority_counts_as_a_preference() -> None:
    assert prio(req(priority=3), []).priority == 3
    noted = no_prio(req(priority=3), [])
    assert noted.priority is None and "request.priority=3" in noted.notes[0]


def test_a_priority_control_overrides_the_request_field() -> None:
    choice = prio(req(priority=3), [Priority(-1, force=Force.REQUIREMENT)])
    assert choice.priority == -1 and choice.notes == ()


def test_an_allowed_fallback_rescues_a_requirement() -> None:
    mode = ExecutionMode("eager", force=Force.REQUIREMENT, fallback=("turbo", "default"))
    choice = no_prio(req(), [mode])
    assert choice.mode == "default" and choice.notes[0].startswith("fallback: ExecutionMode")


def test_a_malformed_fallback_is_bad_input_naming_the_entry() -> None:
    # "Run without it" is said with a preference, not a None fallback (HEAR's protocol).
    with pytest.raises(RequestError, match="fallback entry None"):
        prio(req(), [Priority(1, force=Force.REQUIREMENT, fallback=(None,))])


@pytest.mark.parametrize("order", ["requirement first", "preference first"])
def test_a_preference_never_overrides_a_requirement(order: str) -> None:
    need, want = Priority(1, force=Force.REQUIREMENT), Priority(9)
    controls: list[Control] = [need, want] if order == "requirement first" else [want, need]
    choice = prio(req(), controls)
    assert choice.priority == 1
    assert (
        len(choice.notes) == 1
        and "dropped preference Priority(" in choice.notes[0]
        and "value=9" in choice.notes[0]
    )
    need_mode = ExecutionMode("eager", force=Force.REQUIREMENT)
    want_mode = ExecutionMode("default")
    modes: list[Control] = (
        [need_mode, want_mode] if order == "requirement first" else [want_mode, need_mode]
    )
    two = resolve_controls(
        req(), modes, capabilities=caps(ExecutionMode, modes=("default", "eager")), where="e0"
    )
    assert two.mode == "eager" and "dropped preference ExecutionMode" in two.notes[0]


def test_conflicting_requirements_are_unsupported_not_merged() -> None:
    both = [Priority(1, force=Force.REQUIREMENT), Priority(2, force=Force.REQUIREMENT)]
    with pytest.raises(UnsupportedError, match="conflicts with requirement Priority"):
        prio(req(), both)


def test_cache_controls_are_unsupported_on_an_openai_server() -> None:
    """vLLM's OpenAI server has no retain / prepare: required ones are unsupported, preferred
    ones are dropped with the reason."""
    keep = CacheRetain(ContextRef("s1"), (1, 2), 0.5)
    warm = CachePrepare(ContextRef("s1"), (1, 2))
    for c in (keep, warm):
        required = dataclasses.replace(c, force=Force.REQUIREMENT)
        with pytest.raises(UnsupportedError, match=f"required {type(c).__name__}.*not among"):
            prio(req(), [required])
        choice = prio(req(), [c])
        assert (
            choice.priority is None and "not among the engine's control types" in (choice.notes[0])
        )


def test_a_fallback_that_also_fails_leaves_the_requirement_unsupported() -> None:
    mode = ExecutionMode("eager", force=Force.REQUIREMENT, fallback=("turbo",))
    with pytest.raises(UnsupportedError, match="mode 'eager'"):
        no_prio(req(), [mode])
