"""Admission: sampling resolved once from request and configuration, and the dedup key."""

from __future__ import annotations

import itertools
from dataclasses import fields, replace
from typing import TYPE_CHECKING, Any

from msgspec import structs

from batcher import Pending
from worker.config import BatchingConfig, GenerationConfig
from worker.engines.base import Engine, ResolvedSampling
from worker.engines.echo import EchoEngine
from worker.loop.intake import Intake, _dedup_key
from worker.loop.jobs import Identity, Job, Source
from worker.wire.codec import CodecLimits, encode_request
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

if TYPE_CHECKING:
    from worker.engines.hf.engine import HFEngine

LIMITS = CodecLimits(1 << 20, 1 << 20)
DEFAULTS = GenerationConfig()
offsets = itertools.count()


def admit(
    request: InferenceRequest,
    generation: GenerationConfig = DEFAULTS,
    engine: Engine | None = None,
) -> Pending[Job]:
    engine = engine or EchoEngine()
    intake = Intake(engine, Identity("w", engine.model_name), BatchingConfig(), generation, LIMITS)
    outcome = intake.take(Source("requests", 0, next(offsets)), *encode_request(request), 0.0)
    assert isinstance(outcome, Pending), outcome
    return outcome


def ask(text: str = "hello", **sampling: object) -> InferenceRequest:
    return InferenceRequest(
        custom_id=f"c{next(offsets)}",
        messages=(ChatMessage("user", text),),
        sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
    )


def test_the_engine_input_carries_sampling_resolved_from_the_configuration() -> None:
    pending = admit(ask(top_k=3), GenerationConfig(max_tokens=5, temperature=0.0))
    sampling = pending.payload.engine_input.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_k) == (5, 0.0, 3)
    assert pending.max_tokens == 5


def test_the_configured_enable_thinking_reaches_the_chat_template(
    tiny_hf_engine: HFEngine,
) -> None:
    think = tiny_hf_engine.encoder.tokenizer.convert_tokens_to_ids("think")
    on = admit(ask(), GenerationConfig(enable_thinking=True), tiny_hf_engine)
    assert on.payload.engine_input.sampling.enable_thinking
    assert think in on.payload.engine_input.prompt_token_ids
    off = admit(ask(), GenerationConfig(enable_thinking=False), tiny_hf_engine)
    assert think not in off.payload.engine_input.prompt_token_ids


def test_identical_greedy_requests_share_a_dedup_key_whatever_seed_was_drawn() -> None:
    first, second = admit(ask(temperature=0.0)), admit(ask(temperature=0.0))
    assert first.payload.engine_input.sampling.seed != second.payload.engine_input.sampling.seed
    assert first.dedup_key is not None and first.dedup_key == second.dedup_key
    # a default spelled out is the same request as the default left unset
    assert admit(ask(temperature=0.0, max_tokens=256)).dedup_key == first.dedup_key


def test_a_different_prompt_or_setting_gives_a_different_key() -> None:
    base = admit(ask(temperature=0.0)).dedup_key
    assert admit(ask("other", temperature=0.0)).dedup_key != base
    assert admit(ask(temperature=0.0, max_tokens=8)).dedup_key != base
    assert admit(ask(temperature=0.0, seed=1)).dedup_key != base


def test_seeded_sampled_requests_dedup_and_unseeded_ones_never_do() -> None:
    seeded = [admit(ask(temperature=0.8, seed=4)).dedup_key for _ in range(2)]
    assert seeded[0] is not None and seeded[0] == seeded[1]
    assert admit(ask(temperature=0.8, seed=5)).dedup_key != seeded[0]
    assert admit(ask(temperature=0.8)).dedup_key is None
    # a sampling temperature from the configuration counts the same as a requested one
    assert admit(ask(), GenerationConfig(temperature=0.8)).dedup_key is None


def test_every_resolved_setting_is_in_the_dedup_key() -> None:
    # the key reads the settings field by field: any one of them changed is another key
    greedy = admit(ask(temperature=0.0, seed=3)).payload.engine_input.sampling
    changed: dict[str, Any] = {
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.5,
        "top_k": 2,
        "seed": 9,
        "seeded": False,
        "stop": ("x",),
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "repetition_penalty": 1.5,
        "enable_thinking": not greedy.enable_thinking,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": structs.replace(greedy.response_format, type="json_object"),
    }
    assert set(changed) == {f.name for f in fields(ResolvedSampling)}
    base = _dedup_key((1, 2), greedy)
    for name, value in changed.items():
        assert _dedup_key((1, 2), replace(greedy, **{name: value})) != base, name


def _take_all(intake: Intake, requests: list[InferenceRequest]) -> list[Any]:
    return [
        intake.take(Source("requests", 0, next(offsets)), *encode_request(r), 0.0) for r in requests
    ]


def test_settings_resolved_once_per_setting_give_what_resolving_each_request_gives(
    monkeypatch: Any,
) -> None:
    """Admission resolves each distinct setting once (issue 42): every request still gets
    its own drawn seed, in the order resolving each request would have drawn them."""
    import random

    from worker.engines import base

    engine = EchoEngine()
    intake = Intake(engine, Identity("w", engine.model_name), BatchingConfig(), DEFAULTS, LIMITS)
    asked = [ask(f"q{i}", **s) for i in range(4) for s in ({}, {"seed": 7}, {"max_tokens": 3})]
    monkeypatch.setattr(base, "_SEEDS", random.Random(42))
    got = [o.payload.engine_input.sampling for o in _take_all(intake, asked)]
    monkeypatch.setattr(base, "_SEEDS", random.Random(42))
    each = [ResolvedSampling.resolve(r.sampling, r.enable_thinking, DEFAULTS) for r in asked]
    assert got == each
    unseeded = [s.seed for s, r in zip(got, asked, strict=True) if r.sampling.seed is None]
    assert len(set(unseeded)) == len(unseeded) == 8
    # a seeded setting is one object, shared
    assert len({id(s) for s, r in zip(got, asked, strict=True) if r.sampling.seed == 7}) == 1


class StrictEcho(EchoEngine):
    """An engine that honours no sampling field."""

    honours = frozenset()
    inert = frozenset()


def test_a_refused_setting_is_refused_for_every_request_under_its_own_custom_id() -> None:
    engine = StrictEcho()
    intake = Intake(engine, Identity("w", engine.model_name), BatchingConfig(), DEFAULTS, LIMITS)
    asked = [ask(f"q{i}", top_k=3, stop=("x",)) for i in range(3)] + [ask("ok", temperature=0.0)]
    outcomes = _take_all(intake, asked)
    for request, outcome in zip(asked[:3], outcomes, strict=False):
        error = outcome.result.error
        assert outcome.result.custom_id == request.custom_id
        assert (error.code, error.param) == (4002, "stop")  # the first by name, as before
        assert error.message == "stop is not supported by the StrictEcho engine of this worker"
    assert isinstance(outcomes[3], Pending)


def test_the_table_of_resolved_settings_is_bounded() -> None:
    from worker.loop.intake import RESOLVED_KEPT

    engine = EchoEngine()
    intake = Intake(engine, Identity("w", engine.model_name), BatchingConfig(), DEFAULTS, LIMITS)
    asked = [ask(max_tokens=1 + i) for i in range(RESOLVED_KEPT + 10)]
    outcomes = _take_all(intake, asked)
    assert [o.payload.engine_input.sampling.max_tokens for o in outcomes] == [
        1 + i for i in range(RESOLVED_KEPT + 10)
    ]
    assert len(intake._resolved) <= RESOLVED_KEPT
