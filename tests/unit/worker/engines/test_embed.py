"""Embedding engines: the recipe, pooling and chunking, admission of /v1/embeddings
requests (and of the other endpoints' on each kind of worker), run_batch's split of
vectors, and the real all-MiniLM-L6-v2 on hf and vllm against a reference computed apart."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.embedding_reference import cosine, reference_vectors
from tests.openai_sdk import CreateEmbeddingResponse, sdk_line
from worker.config import BatchingConfig, EngineConfig, GenerationConfig
from worker.engines.base import Completion, Engine, EngineInput
from worker.engines.echo import EchoEngine
from worker.engines.embed.base import EmbeddingEngine, Vector
from worker.engines.embed.hf import chunks, pool
from worker.engines.embed.recipe import Recipe, read_recipe
from worker.engines.models import locate_model
from worker.errors import ErrorCode, ModelLoadError
from worker.known_models import EMBEDDING_MODEL
from worker.loop.intake import Intake, Rejection
from worker.loop.jobs import Identity, Job, Source, completed
from worker.wire.answers import format_output_line
from worker.wire.codec import CodecLimits, decode_result, encode_request, encode_result
from worker.wire.messages import ChatMessage, InferenceRequest

ids = itertools.count()


class ByteTokenizer:
    """Tokens are UTF-8 bytes between a start (256) and an end (257) token."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [256, *text.encode(), 257]}


class CountingEmbedder(EmbeddingEngine):
    """A model-free embedding engine: each sequence's vector is (its length, its sum)."""

    def load(self) -> None:
        self.recipe = Recipe("mean", normalize=False, max_tokens=12, dimension=2)
        self.tokenizer = ByteTokenizer()
        self.calls: list[int] = []

    def embed(self, sequences: Sequence[tuple[int, ...]]) -> list[Vector]:
        self.calls.append(len(sequences))
        return [(float(len(s)), float(sum(s))) for s in sequences]


@pytest.fixture
def embedder() -> CountingEmbedder:
    engine = CountingEmbedder(EngineConfig(model="counting", task="embed"))
    engine.load()
    return engine


def take(engine: Engine, request: InferenceRequest, served: str = "") -> Any:
    identity = Identity("w", served or engine.model_name)
    intake = Intake(
        engine, identity, BatchingConfig(), GenerationConfig(), CodecLimits(1 << 20, 1 << 20)
    )
    return intake.take(Source("t", 0, next(ids)), *encode_request(request), 0.0)


def error_of(outcome: Any) -> tuple[int, str]:
    assert isinstance(outcome, Rejection)
    assert outcome.result.error is not None
    return outcome.result.error.code, outcome.result.error.param


def texts(*inputs: str, **fields: Any) -> InferenceRequest:
    return InferenceRequest(custom_id=f"e{next(ids)}", embedding_inputs=inputs, **fields)


def test_an_embeddings_request_is_admitted_prompt_only(embedder: CountingEmbedder) -> None:
    pending = take(embedder, texts("ab", "c"))
    job: Job = pending.payload
    assert job.engine_input.embedding_inputs == ((256, 97, 98, 257), (256, 99, 257))
    assert job.engine_input.prompt_token_ids == (256, 97, 98, 257, 256, 99, 257)
    assert (pending.prompt_tokens, pending.max_tokens) == (7, 0)
    assert pending.prefix_key is None
    # the same bytes split elsewhere are other inputs: never answered from one run
    assert take(embedder, texts("a", "bc")).dedup_key != pending.dedup_key
    assert take(embedder, texts("ab", "c")).dedup_key == pending.dedup_key


def test_endpoint_model_dimensions_and_length_are_refused_by_name(
    embedder: CountingEmbedder,
) -> None:
    chat = InferenceRequest(custom_id="c", messages=(ChatMessage("user", "hi"),))
    completion = InferenceRequest(custom_id="p", prompt="hi")
    assert error_of(take(embedder, chat)) == (ErrorCode.INVALID_PARAMETER, "url")
    assert error_of(take(embedder, completion)) == (ErrorCode.INVALID_PARAMETER, "url")
    assert error_of(take(EchoEngine(), texts("hi"))) == (ErrorCode.INVALID_PARAMETER, "url")
    other = texts("hi", model="another")
    assert error_of(take(embedder, other)) == (ErrorCode.INVALID_PARAMETER, "model")
    wrong = texts("hi", dimensions=3)
    assert error_of(take(embedder, wrong)) == (ErrorCode.INVALID_PARAMETER, "dimensions")
    assert not isinstance(take(embedder, texts("hi", dimensions=2)), Rejection)  # its own size
    long = texts("short", "eleven char")  # 13 tokens > 12
    assert error_of(take(embedder, long)) == (ErrorCode.OVER_LIMIT, "input")


def test_run_batch_gives_each_request_its_vectors_in_order(embedder: CountingEmbedder) -> None:
    items = [
        EngineInput(
            "k1",
            (1, 2, 3),
            take(embedder, texts("x")).payload.engine_input.sampling,
            ((1, 2), (3,)),
        ),
        EngineInput("k2", (4,), take(embedder, texts("y")).payload.engine_input.sampling, ((4,),)),
    ]
    done: list[Completion] = []
    embedder.run_batch(items, done.append)
    assert embedder.calls == [3]  # one call for every text of the batch
    assert [(c.key, c.embeddings, c.prompt_tokens) for c in done] == [
        ("k1", ((2.0, 3.0), (1.0, 3.0)), 3),
        ("k2", ((1.0, 4.0),), 1),
    ]


def test_a_completion_becomes_an_embedding_response_line(embedder: CountingEmbedder) -> None:
    job: Job = take(embedder, texts("ab", "c", encoding_format="base64")).payload
    done: list[Completion] = []
    embedder.run_batch([job.engine_input], done.append)
    result = completed(
        job,
        done[0],
        identity=Identity("w", "counting"),
        batch_size=1,
        dispatched_at=0.0,
        finished_at=0.0,
    )
    line = format_output_line(decode_result(*encode_result(result)))
    assert isinstance(line["response"]["body"]["data"][0]["embedding"], str)  # base64
    body = sdk_line(line)
    assert isinstance(body, CreateEmbeddingResponse)
    assert [e.embedding for e in body.data] == [[4.0, 708.0], [3.0, 612.0]]
    assert (body.usage.prompt_tokens, body.model) == (7, "counting")


def test_mean_pooling_ignores_padding_and_normalises() -> None:
    states = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(states, mask, Recipe("mean", False, 8, 2)).tolist() == [[2.0, 2.0]]
    normed = pool(states, mask, Recipe("mean", True, 8, 2))
    assert torch.allclose(normed, torch.tensor([[2.0, 2.0]]) / 8**0.5)
    assert pool(states, mask, Recipe("cls", False, 8, 2)).tolist() == [[1.0, 0.0]]


def test_chunks_keep_the_padded_size_within_budget() -> None:
    lengths = [5, 1, 4, 9, 2, 2]
    groups = chunks(lengths, budget=10)
    assert sorted(i for group in groups for i in group) == list(range(6))
    for group in groups:
        assert len(group) == 1 or len(group) * max(lengths[i] for i in group) <= 10


def write_model(directory: Path, pooling: dict[str, bool], normalize: bool) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text(
        json.dumps({"hidden_size": 16, "max_position_embeddings": 512})
    )
    modules = [{"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "path": "2_N", "type": "sentence_transformers.models.Normalize"})
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return directory


def test_the_recipe_is_read_from_the_models_files(tmp_path: Path) -> None:
    cls = write_model(tmp_path / "cls", {"pooling_mode_cls_token": True}, normalize=False)
    assert read_recipe(cls) == Recipe("cls", normalize=False, max_tokens=128, dimension=16)
    both = {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True}
    with pytest.raises(ModelLoadError, match="mean or CLS"):
        read_recipe(write_model(tmp_path / "max", both, normalize=True))


def test_the_packaged_minilm_recipe() -> None:
    recipe = read_recipe(locate_model(EMBEDDING_MODEL).directory)
    assert recipe == Recipe("mean", normalize=True, max_tokens=256, dimension=384)


TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "hello",
    "Embeddings map text to vectors; similar texts get similar vectors.",
    "Kafka-driven batch inference on a CPU",
]


@pytest.fixture(scope="module")
def reference() -> list[list[float]]:
    return reference_vectors(TEXTS)


@pytest.fixture(scope="module", params=["hf", "vllm"])
def minilm(request: pytest.FixtureRequest) -> Iterator[EmbeddingEngine]:
    from worker.engines.factory import create_engine

    config = EngineConfig(kind=request.param, model=EMBEDDING_MODEL, task="embed", device="cpu")
    engine = create_engine(config, BatchingConfig(max_batch_tokens=1024))
    assert isinstance(engine, EmbeddingEngine)
    engine.load()
    yield engine
    engine.close()


@pytest.mark.model
def test_minilm_vectors_match_the_reference(
    minilm: EmbeddingEngine, reference: list[list[float]]
) -> None:
    request = texts(*TEXTS)
    pending = take(minilm, request, served=EMBEDDING_MODEL)
    done: list[Completion] = []
    minilm.run_batch([pending.payload.engine_input], done.append)
    (completion,) = done
    assert len(completion.embeddings) == len(TEXTS)
    for got, want in zip(completion.embeddings, reference, strict=True):
        assert len(got) == 384
        assert cosine(got, want) >= 0.999
    # alone or batched with others, a text gets the same vector
    alone: list[Completion] = []
    minilm.run_batch([take(minilm, texts(TEXTS[1])).payload.engine_input], alone.append)
    assert cosine(alone[0].embeddings[0], completion.embeddings[1]) >= 0.999
