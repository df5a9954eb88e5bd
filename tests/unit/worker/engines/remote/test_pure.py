"""The remote engine's pure parts: packing, the AIMD window, the queue gate, the bodies."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec import structs
from openai.types import Completion as SdkCompletion
from openai.types.chat import ChatCompletion
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses import Response

from tests.unit.conftest import resolved
from worker.engines.base import EngineInput
from worker.engines.remote.aimd import ConcurrencyWindow
from worker.engines.remote.bodies import (
    AnswerError,
    Call,
    completion_of,
    embeddings_call,
    generation_call,
    request_call,
)
from worker.engines.remote.gate import FlexYield, someone_else, waiting
from worker.engines.remote.packing import pack, request_input, unpack
from worker.wire.answers import format_output_line
from worker.wire.codec import decode_result, encode_result
from worker.wire.messages import (
    ChatMessage,
    Endpoint,
    InferenceRequest,
    InferenceResult,
    ResponseFormat,
)


@given(st.recursive(st.text() | st.integers() | st.none(), lambda c: st.lists(c, max_size=4)))
def test_packing_gives_the_input_back_and_equal_ids_mean_equal_input(value: object) -> None:
    ids = pack(value)
    assert unpack(ids) == value
    assert all(0 <= i < 2**32 for i in ids)
    assert (pack([value, "x"]) == pack([value, "y"])) is False


def test_inputs_sharing_a_system_message_share_a_prefix_and_ids_estimate_tokens() -> None:
    system = ChatMessage("system", "You label support tickets by urgency. " * 10)
    a = InferenceRequest("a", messages=(system, ChatMessage("user", "printer on fire")))
    b = InferenceRequest("b", messages=(system, ChatMessage("user", "password reset")))
    ids_a, ids_b = pack(request_input(a)), pack(request_input(b))
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b, strict=False)) if x != y)
    assert shared >= len(system.content) // 4
    # about one id per 4 bytes of input: the admission limits hold as an estimate
    assert len(ids_a) == pytest.approx(len(json.dumps(request_input(a))) / 4, rel=0.1)
    chat, responses = (
        request_input(a),
        request_input(InferenceRequest("a", messages=a.messages, responses=True)),
    )
    assert pack(chat) != pack(responses), "the endpoint is part of the input"


def test_the_window_starts_slow_then_halves_once_per_round_and_grows_one_per_window() -> None:
    w = ConcurrencyWindow(minimum=1, maximum=32, initial=4)
    for _ in range(12):  # slow start: one more per success, so it doubles every round
        w.on_success(sent_at=0.1, answered_at=0.2)
    assert w.limit == 16
    w.on_overload(sent_at=1.0, now=2.0)
    assert w.limit == 8
    w.on_overload(sent_at=1.5, now=2.1)  # sent before the cut: the old window's verdict
    assert w.limit == 8
    w.on_overload(sent_at=2.5, now=3.0)
    assert w.limit == 4
    for _ in range(5):  # about one window's worth of successes adds one
        w.on_success(sent_at=3.1, answered_at=3.2)
    assert w.limit == 5
    for t in range(10):
        w.on_overload(sent_at=10.0 + t, now=10.5 + t)
    assert w.limit == 1, "never below the minimum"
    for _ in range(10_000):
        w.on_success(sent_at=30.0, answered_at=30.1)
    assert w.limit == 32, "never above the maximum"


def test_a_slow_answer_is_an_overload_and_a_fixed_window_never_moves() -> None:
    w = ConcurrencyWindow(minimum=1, maximum=32, initial=16, latency_target_s=0.5)
    w.on_success(sent_at=1.0, answered_at=1.2)
    w.on_success(sent_at=1.0, answered_at=2.0)
    assert w.limit == 8 and w.cuts == 1
    fixed = ConcurrencyWindow(minimum=1, maximum=32, initial=4, adaptive=False)
    fixed.on_overload(sent_at=1.0, now=2.0)
    assert fixed.limit == 32


def test_the_gate_reads_vllm_waiting_summed_over_models() -> None:
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n"
        'vllm:num_requests_waiting{model_name="a b",engine="0"} 3.0\n'
        'vllm:num_requests_waiting{model_name="c"} 2.0 1700000000\n'
        "vllm:num_requests_waiting_total 99\n"
        'vllm:num_requests_running{model_name="a"} 7.0\n'
    )
    assert waiting(text) == 5
    assert waiting("vllm:num_requests_waiting 4\n") == 4
    assert waiting("other_series 1\n") is None
    assert waiting('vllm:num_requests_waiting{a="b"} NaN\n') is None


#: a value other than its off value for every sampling setting OpenAI defines
OPENAI_SETTINGS: dict[str, Any] = {
    "max_tokens": 7,
    "temperature": 0.5,
    "top_p": 0.9,
    "seed": 3,
    "stop": ("END",),
    "n": 2,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "logprobs": True,
    "top_logprobs": 2,
}


def test_every_resolved_setting_goes_into_the_chat_body() -> None:
    fmt = ResponseFormat("json_schema", '{"type": "object"}', "label", True)
    s = resolved(**OPENAI_SETTINGS, top_k=5, repetition_penalty=1.1, response_format=fmt)
    body = generation_call("m", "chat", [["user", "hi"]], s, False).body
    assert body == {
        "model": "m",
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "n": 2,
        "seed": 3,
        "stop": ["END"],
        "logprobs": True,
        "top_logprobs": 2,
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": False},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "label", "schema": {"type": "object"}, "strict": True},
        },
    }
    plain = generation_call("m", "completions", [1, 2, 3], resolved(max_tokens=4)).body
    assert plain == {"model": "m", "max_tokens": 4, "temperature": 0.0, "prompt": [1, 2, 3]}
    responses = generation_call("m", "responses", [["user", "hi"]], resolved(response_format=fmt))
    assert responses.path == "/responses"
    assert responses.body["text"] == {
        "format": {
            "type": "json_schema",
            "name": "label",
            "schema": {"type": "object"},
            "strict": True,
        }
    }
    assert embeddings_call("e", ["a"], 4).body == {
        "model": "e",
        "input": ["a"],
        "encoding_format": "float",
        "dimensions": 4,
    }


#: every field of a chat request as OpenAI's SDK types it
OPENAI_CHAT_FIELDS = (
    CompletionCreateParamsNonStreaming.__required_keys__
    | CompletionCreateParamsNonStreaming.__optional_keys__
)


def chat_call(
    enable_thinking: bool | None = None, endpoint: str = "chat", **sampling: object
) -> Call:
    """The call the engine makes of a request, from its packed input as intake admits it."""
    messages = (ChatMessage("user", "hi"),)
    request = (
        InferenceRequest("a", prompt="hi", enable_thinking=enable_thinking)
        if endpoint == "completions"
        else InferenceRequest("a", messages=messages, enable_thinking=enable_thinking)
    )
    return request_call("m", EngineInput("a", pack(request_input(request)), resolved(**sampling)))


def test_a_chat_request_asking_nothing_beyond_openai_sends_only_openais_fields() -> None:
    plain = chat_call().body
    assert plain == {
        "model": "m",
        "max_tokens": 256,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": "hi"}],
    }
    every = chat_call(**OPENAI_SETTINGS, response_format=ResponseFormat("json_object")).body
    assert set(plain) <= set(every) <= OPENAI_CHAT_FIELDS, set(every) - OPENAI_CHAT_FIELDS
    assert len(every) == 13


def test_the_extensions_are_sent_when_a_request_asks_for_them() -> None:
    body = chat_call(True, top_k=5, repetition_penalty=1.1).body
    assert {k: body[k] for k in set(body) - OPENAI_CHAT_FIELDS} == {
        "top_k": 5,
        "repetition_penalty": 1.1,
        "chat_template_kwargs": {"enable_thinking": True},
    }
    # an explicit false is sent too: a template that thinks by default (Qwen3) must be told
    assert chat_call(False).body["chat_template_kwargs"] == {"enable_thinking": False}
    completions = chat_call(True, "completions", top_k=5).body
    assert completions["top_k"] == 5
    assert "chat_template_kwargs" not in completions, "no chat template renders a prompt"


def test_answers_are_read_with_the_servers_usage_and_every_choice() -> None:
    call = generation_call("m", "chat", [["user", "hi"]], resolved(n=2, logprobs=True))
    answer = {
        "choices": [
            {"index": 1, "message": {"content": "two"}, "finish_reason": "length"},
            {
                "index": 0,
                "message": {"content": "one"},
                "finish_reason": "stop",
                "logprobs": {
                    "content": [
                        {
                            "token": "one",
                            "logprob": -0.1,
                            "top_logprobs": [
                                {"token": "one", "logprob": -0.1},
                                {"token": "uno", "logprob": -2.0},
                            ],
                        }
                    ]
                },
            },
        ],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": 5,
            "completion_tokens_details": {"reasoning_tokens": 2},
        },
    }
    c = completion_of("k", call, answer)
    assert (c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.reasoning_tokens) == (
        "one",
        "stop",
        11,
        5,
        2,
    )
    assert c.logprobs is not None and c.logprobs[0].top[1].token == "uno"
    assert [(x.text, x.finish_reason) for x in c.extra_choices] == [("two", "length")]
    text_call = generation_call("m", "completions", "hi", resolved(logprobs=True, top_logprobs=1))
    t = completion_of(
        "k",
        text_call,
        {
            "choices": [
                {
                    "text": "a b",
                    "finish_reason": "length",
                    "logprobs": {
                        "tokens": ["a", " b"],
                        "token_logprobs": [-1.0, -2.0],
                        "top_logprobs": [{"a": -1.0}, {" b": -2.0}],
                    },
                }
            ],
            "usage": {},
        },
    )
    assert t.logprobs is not None and [x.token for x in t.logprobs] == ["a", " b"]
    with pytest.raises(AnswerError):
        completion_of("k", call, {"choices": []})
    with pytest.raises(AnswerError):
        completion_of("k", call, {"object": "error"})


def test_a_content_filter_stop_is_kept_through_the_wire_and_reads_with_the_sdk() -> None:
    """A server's ``content_filter`` (chat, completions, and a responses answer
    ``incomplete`` for it) reaches the output line as such, never as ``stop``."""
    chat = generation_call("m", "chat", [["user", "hi"]], resolved(n=2))
    c = completion_of(
        "k",
        chat,
        {
            "choices": [
                {"index": 0, "message": {"content": "par"}, "finish_reason": "content_filter"},
                {"index": 1, "message": {"role": "assistant"}, "finish_reason": "tool_calls"},
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 1},
        },
    )
    assert c.finish_reason == "content_filter" and c.extra_choices[0].finish_reason == "stop"
    assert c.extra_choices[0].text == ""  # a message without content reads as empty
    text = generation_call("m", "completions", "hi", resolved())
    answer = {"choices": [{"text": "x", "finish_reason": "content_filter"}], "usage": {}}
    assert completion_of("k", text, answer).finish_reason == "content_filter"
    responses = generation_call("m", "responses", [["user", "hi"]], resolved())
    cut = {
        "status": "incomplete",
        "incomplete_details": {"reason": "content_filter"},
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "pa"}]}],
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    assert completion_of("k", responses, cut).finish_reason == "content_filter"
    with pytest.raises(AnswerError, match="error: overloaded"):
        completion_of("k", responses, {"status": "failed", "error": {"message": "overloaded"}})
    with pytest.raises(AnswerError, match="in_progress"):
        completion_of("k", responses, {"status": "in_progress", "output": []})
    with pytest.raises(AnswerError, match="the response is failed"):
        completion_of("k", responses, {"status": "failed", "output": [], "error": None})

    result = InferenceResult("r", text="pa", finish_reason="content_filter", model="m")
    back = decode_result(*encode_result(result))
    assert back.finish_reason == "content_filter"
    sdk_types: tuple[tuple[Endpoint, type[ChatCompletion | SdkCompletion | Response]], ...] = (
        ("chat", ChatCompletion),
        ("completions", SdkCompletion),
        ("responses", Response),
    )
    for endpoint, sdk_type in sdk_types:
        body = format_output_line(structs.replace(back, endpoint=endpoint))["response"]["body"]
        parsed = sdk_type.model_validate(body, strict=False)
        if isinstance(parsed, Response):
            assert parsed.status == "incomplete" and parsed.incomplete_details is not None
            assert parsed.incomplete_details.reason == "content_filter"
        else:
            assert parsed.choices[0].finish_reason == "content_filter"


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ({"choices": [{"index": 0, "message": {"content": "a"}}]}, "choices indexes [0] for 2 n"),
        (
            {"choices": [{"index": i, "message": {"content": "a"}} for i in (0, 0)]},
            "choices indexes [0, 0]",
        ),
        (
            {"choices": [{"index": i, "message": {"content": "a"}} for i in (0, 1, 2)]},
            "for 2 n",
        ),
        (
            {"choices": [{"index": i, "message": {"content": ["a"]}} for i in (0, 1)]},
            "not a string",
        ),
        (
            {
                "choices": [{"index": i, "message": {"content": "a"}} for i in (0, 1)],
                "usage": {"prompt_tokens": -3},
            },
            "usage prompt_tokens is -3",
        ),
        (
            {
                "choices": [{"index": i, "message": {"content": "a"}} for i in (0, 1)],
                "usage": {"completion_tokens": 2.5},
            },
            "usage completion_tokens is 2.5",
        ),
    ],
)
def test_a_chat_answer_must_hold_what_was_asked(answer: dict[str, object], words: str) -> None:
    call = generation_call("m", "chat", [["user", "hi"]], resolved(n=2))
    with pytest.raises(AnswerError, match=re.escape(words)):
        completion_of("k", call, answer)


def test_an_embeddings_answer_must_hold_one_vector_per_input_of_the_asked_size() -> None:
    call = embeddings_call("m", ["a", "b"], 3)
    assert call.body["dimensions"] == 3 and call.body["encoding_format"] == "float"

    def rows(*vectors: list[float]) -> dict[str, object]:
        data = [{"index": i, "embedding": v} for i, v in enumerate(vectors)]
        return {"data": data[::-1], "usage": {"prompt_tokens": 2}}

    c = completion_of("k", call, rows([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]))
    assert c.embeddings == ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0)) and c.prompt_tokens == 2
    for bad, words in (
        (rows([1.0, 2.0, 3.0]), "data indexes [0] for 2 inputs"),
        (rows([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]), "vectors of [4] numbers, 3 wanted"),
        (rows([1.0, 2.0, 3.0], [1.0, 2.0]), "vectors of [2, 3] numbers"),
        (rows([1.0, 2.0, float("inf")], [1.0, 2.0, 3.0]), "not finite"),
    ):
        with pytest.raises(AnswerError, match=re.escape(words)):
            completion_of("k", call, bad)
    with pytest.raises(AnswerError, match="not readable"):  # a base64 string, not asked for
        completion_of("k", call, {"data": [{"index": i, "embedding": "AACAPw=="} for i in (0, 1)]})


def test_flex_opens_only_after_a_quiet_period_and_counts_each_closing_once() -> None:
    flex = FlexYield(quiet_s=2.0)
    assert flex.open(0.0)
    flex.pressure(10.0)
    flex.pressure(10.5)  # more pressure while closed: the same closing, a later end
    assert not flex.open(12.4) and flex.open(12.5) and flex.closings == 1
    flex.pressure(10.2)  # a late report of older pressure does not move the end back
    assert flex.open(12.5)
    flex.pressure(20.0)
    assert flex.closings == 2
    assert FlexYield(quiet_s=0.0).open(0.0)  # 0: only the last queue reading holds it


def test_a_slow_answer_is_an_overload_even_without_adaptation() -> None:
    w = ConcurrencyWindow(minimum=1, maximum=8, initial=8, adaptive=False, latency_target_s=1.0)
    assert w.on_success(sent_at=0.0, answered_at=0.5)
    assert not w.on_success(sent_at=0.0, answered_at=1.5)
    assert w.limit == 8  # not adaptive: the window stays, flex still hears it


def test_a_queue_of_the_workers_own_requests_is_nobody_elses() -> None:
    assert not someone_else(waiting=3, running=5, own=8)  # all eight are the batch's
    assert someone_else(waiting=3, running=6, own=8)  # one more: an interactive user
    assert someone_else(waiting=1, running=None, own=50)  # running not exported: anyone's
