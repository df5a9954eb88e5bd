"""ResolvedSampling.resolve: request values, configured defaults, off values and seeds."""

from __future__ import annotations

import dataclasses
import typing
from types import NoneType, UnionType

from hypothesis import given
from hypothesis import strategies as st

from worker.config import GenerationConfig
from worker.engines.base import ResolvedSampling
from worker.wire.messages import SamplingParams

CONFIG = GenerationConfig(max_tokens=7, temperature=0.3, enable_thinking=True)


def optional(values: st.SearchStrategy[typing.Any]) -> st.SearchStrategy[typing.Any]:
    return st.none() | values


samplings = st.builds(
    SamplingParams,
    max_tokens=optional(st.integers(1, 2**31 - 1)),
    temperature=optional(st.floats(0, 2)),
    top_p=optional(st.floats(0, 1, exclude_min=True)),
    top_k=optional(st.integers(0, 2**31 - 1)),
    seed=optional(st.integers(-(2**63), 2**63 - 1)),
    stop=st.lists(st.text(max_size=4), max_size=4).map(tuple),
    presence_penalty=optional(st.floats(-2, 2)),
    frequency_penalty=optional(st.floats(-2, 2)),
    repetition_penalty=optional(st.floats(0, 10, exclude_min=True)),
)


def test_no_field_is_optional() -> None:
    hints = typing.get_type_hints(ResolvedSampling)
    for field in dataclasses.fields(ResolvedSampling):
        hint = hints[field.name]
        assert not isinstance(hint, UnionType), f"{field.name}: {hint}"
        assert NoneType not in typing.get_args(hint), f"{field.name}: {hint}"


@given(samplings, optional(st.booleans()))
def test_every_resolved_value_is_set_and_has_its_declared_type(
    sampling: SamplingParams, thinking: bool | None
) -> None:
    resolved = ResolvedSampling.resolve(sampling, thinking, CONFIG)
    hints = typing.get_type_hints(ResolvedSampling)
    for field in dataclasses.fields(resolved):
        value = getattr(resolved, field.name)
        expected = typing.get_origin(hints[field.name]) or hints[field.name]
        assert isinstance(value, expected), (field.name, value)
    assert "" not in resolved.stop


def test_unset_values_come_from_the_configuration() -> None:
    resolved = ResolvedSampling.resolve(SamplingParams(), None, CONFIG)
    assert (resolved.max_tokens, resolved.temperature, resolved.enable_thinking) == (7, 0.3, True)


def test_request_values_win_over_the_configuration_even_when_zero_or_false() -> None:
    sampling = SamplingParams(
        max_tokens=3,
        temperature=0.0,
        top_p=0.5,
        top_k=4,
        seed=0,
        stop=("\n",),
        presence_penalty=0.25,
        frequency_penalty=-0.5,
        repetition_penalty=1.25,
    )
    resolved = ResolvedSampling.resolve(sampling, False, CONFIG)
    assert resolved == ResolvedSampling(
        max_tokens=3,
        temperature=0.0,
        top_p=0.5,
        top_k=4,
        seed=0,
        seeded=True,
        stop=("\n",),
        presence_penalty=0.25,
        frequency_penalty=-0.5,
        repetition_penalty=1.25,
        enable_thinking=False,
    )


def test_settings_without_a_configured_default_resolve_to_off() -> None:
    resolved = ResolvedSampling.resolve(SamplingParams(stop=("", "end")), None, CONFIG)
    assert (resolved.top_p, resolved.top_k) == (1.0, 0)
    assert (resolved.presence_penalty, resolved.frequency_penalty) == (0.0, 0.0)
    assert resolved.repetition_penalty == 1.0 and not resolved.penalized
    assert resolved.stop == ("end",)
    penalized = ResolvedSampling.resolve(SamplingParams(repetition_penalty=1.1), None, CONFIG)
    assert penalized.penalized


def test_a_seed_is_drawn_when_the_request_gives_none_and_is_not_marked_seeded() -> None:
    first, second = (ResolvedSampling.resolve(SamplingParams(), None, CONFIG) for _ in range(2))
    assert not first.seeded and not second.seeded
    assert 0 <= first.seed < 2**63
    assert first.seed != second.seed  # 63 random bits each


def test_deterministic_means_greedy_or_seeded_by_the_request() -> None:
    def resolve(**fields: typing.Any) -> ResolvedSampling:
        return ResolvedSampling.resolve(SamplingParams(**fields), None, CONFIG)

    assert resolve(temperature=0.0).deterministic
    assert resolve(temperature=0.8, seed=5).deterministic
    # the configured temperature 0.3 samples; the drawn seed promises nothing
    assert not resolve().deterministic
    assert not resolve(temperature=0.8).deterministic
