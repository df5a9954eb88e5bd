# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EncodingFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_FORMAT_UNSPECIFIED: _ClassVar[EncodingFormat]
    ENCODING_FORMAT_FLOAT: _ClassVar[EncodingFormat]
    ENCODING_FORMAT_BASE64: _ClassVar[EncodingFormat]

class Endpoint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENDPOINT_UNSPECIFIED: _ClassVar[Endpoint]
    ENDPOINT_CHAT_COMPLETIONS: _ClassVar[Endpoint]
    ENDPOINT_COMPLETIONS: _ClassVar[Endpoint]
    ENDPOINT_EMBEDDINGS: _ClassVar[Endpoint]
    ENDPOINT_RESPONSES: _ClassVar[Endpoint]

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_COMPLETED: _ClassVar[Status]
    STATUS_FAILED: _ClassVar[Status]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
    FINISH_REASON_CONTENT_FILTER: _ClassVar[FinishReason]
ENCODING_FORMAT_UNSPECIFIED: EncodingFormat
ENCODING_FORMAT_FLOAT: EncodingFormat
ENCODING_FORMAT_BASE64: EncodingFormat
ENDPOINT_UNSPECIFIED: Endpoint
ENDPOINT_CHAT_COMPLETIONS: Endpoint
ENDPOINT_COMPLETIONS: Endpoint
ENDPOINT_EMBEDDINGS: Endpoint
ENDPOINT_RESPONSES: Endpoint
STATUS_UNSPECIFIED: Status
STATUS_COMPLETED: Status
STATUS_FAILED: Status
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ERROR: FinishReason
FINISH_REASON_CONTENT_FILTER: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class Messages(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, items: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbeddingInputs(_message.Message):
    __slots__ = ("texts",)
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, texts: _Optional[_Iterable[str]] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("type", "schema", "name", "strict")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    type: str
    schema: str
    name: str
    strict: bool
    def __init__(self, type: _Optional[str] = ..., schema: _Optional[str] = ..., name: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "n", "logprobs", "top_logprobs", "response_format")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    n: int
    logprobs: bool
    top_logprobs: int
    response_format: ResponseFormat
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., n: _Optional[int] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ...) -> None: ...

class InferenceRequest(_message.Message):
    __slots__ = ("custom_id", "batch_id", "batch_total", "model", "messages", "prompt", "prompt_token_ids", "embedding_inputs", "sampling", "enable_thinking", "metadata", "priority", "deadline", "submitted_at", "encoding_format", "dimensions", "endpoint")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CUSTOM_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_INPUTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ENABLE_THINKING_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FORMAT_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    custom_id: str
    batch_id: str
    batch_total: int
    model: str
    messages: Messages
    prompt: str
    prompt_token_ids: TokenIds
    embedding_inputs: EmbeddingInputs
    sampling: SamplingParams
    enable_thinking: bool
    metadata: _containers.ScalarMap[str, str]
    priority: int
    deadline: float
    submitted_at: float
    encoding_format: EncodingFormat
    dimensions: int
    endpoint: Endpoint
    def __init__(self, custom_id: _Optional[str] = ..., batch_id: _Optional[str] = ..., batch_total: _Optional[int] = ..., model: _Optional[str] = ..., messages: _Optional[_Union[Messages, _Mapping]] = ..., prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., embedding_inputs: _Optional[_Union[EmbeddingInputs, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., enable_thinking: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ..., priority: _Optional[int] = ..., deadline: _Optional[float] = ..., submitted_at: _Optional[float] = ..., encoding_format: _Optional[_Union[EncodingFormat, str]] = ..., dimensions: _Optional[int] = ..., endpoint: _Optional[_Union[Endpoint, str]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "top_logprobs")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Logprobs(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, content: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("text", "finish_reason", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    finish_reason: FinishReason
    logprobs: Logprobs
    def __init__(self, text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "reasoning_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "param")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    param: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., param: _Optional[str] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queued_s", "batch_wait_s", "engine_s")
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    BATCH_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    ENGINE_S_FIELD_NUMBER: _ClassVar[int]
    queued_s: float
    batch_wait_s: float
    engine_s: float
    def __init__(self, queued_s: _Optional[float] = ..., batch_wait_s: _Optional[float] = ..., engine_s: _Optional[float] = ...) -> None: ...

class InferenceResult(_message.Message):
    __slots__ = ("custom_id", "batch_id", "batch_total", "metadata", "status", "text", "finish_reason", "usage", "error", "timings", "batch_size", "model", "worker_id", "created_at", "endpoint", "logprobs", "extra_choices", "embeddings", "encoding_format")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CUSTOM_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_TOTAL_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_CHOICES_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FORMAT_FIELD_NUMBER: _ClassVar[int]
    custom_id: str
    batch_id: str
    batch_total: int
    metadata: _containers.ScalarMap[str, str]
    status: Status
    text: str
    finish_reason: FinishReason
    usage: Usage
    error: Error
    timings: Timings
    batch_size: int
    model: str
    worker_id: str
    created_at: float
    endpoint: Endpoint
    logprobs: Logprobs
    extra_choices: _containers.RepeatedCompositeFieldContainer[Choice]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    encoding_format: EncodingFormat
    def __init__(self, custom_id: _Optional[str] = ..., batch_id: _Optional[str] = ..., batch_total: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., status: _Optional[_Union[Status, str]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., batch_size: _Optional[int] = ..., model: _Optional[str] = ..., worker_id: _Optional[str] = ..., created_at: _Optional[float] = ..., endpoint: _Optional[_Union[Endpoint, str]] = ..., logprobs: _Optional[_Union[Logprobs, _Mapping]] = ..., extra_choices: _Optional[_Iterable[_Union[Choice, _Mapping]]] = ..., embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., encoding_format: _Optional[_Union[EncodingFormat, str]] = ...) -> None: ...
