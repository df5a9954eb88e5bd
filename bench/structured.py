"""Structured outputs on the real default model (SmolLM2, hf engine, CPU).

200 chat requests over 12 JSON Schemas — nested objects, arrays, enums, required fields,
bounded numbers and strings — run through the hf engine with ``response_format``
``json_schema`` (xgrammar guided decoding), and the same 200 requests without it, side by
side: batches alternate between the two conditions so both see the same machine load.
Each constrained output is parsed (``json.loads``) and validated against its schema with
``jsonschema``; the figure is the share that parses and validates (the goal: 100 %). The
throughput cost is generated tokens/s constrained vs unconstrained (the unconstrained
outputs mostly run to ``max_tokens``, the constrained ones stop when their JSON is
complete, so tokens/s — not requests/s — compares the work).

    python -m bench.structured            # writes bench/results/structured.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

import jsonschema

from bench.common import write_result
from worker.config import EngineConfig, GenerationConfig
from worker.engines.base import Completion, EngineInput, ResolvedSampling
from worker.engines.hf.engine import HFEngine
from worker.wire.messages import ChatMessage, InferenceRequest, ResponseFormat, SamplingParams

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
    },
    "sentiment": {
        "type": "object",
        "properties": {
            "label": {"enum": ["positive", "negative", "neutral"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["label", "confidence"],
    },
    "address": {
        "type": "object",
        "properties": {
            "city": NAME,
            "location": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number", "minimum": -90, "maximum": 90},
                    "lon": {"type": "number", "minimum": -180, "maximum": 180},
                },
                "required": ["lat", "lon"],
            },
        },
        "required": ["city", "location"],
    },
    "tags": {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3},
        },
        "required": ["tags"],
    },
    "rating": {
        "type": "object",
        "properties": {
            "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            "recommend": {"type": "boolean"},
        },
        "required": ["stars", "recommend"],
    },
    "product": {
        "type": "object",
        "properties": {
            "name": NAME,
            "price": {"type": "number", "minimum": 0, "maximum": 10000},
            "currency": {"enum": ["EUR", "USD", "GBP"]},
        },
        "required": ["name", "price", "currency"],
    },
    "event": {
        "type": "object",
        "properties": {
            "title": NAME,
            "day": {"type": "integer", "minimum": 1, "maximum": 31},
            "month": {"type": "integer", "minimum": 1, "maximum": 12},
        },
        "required": ["title", "day", "month"],
    },
    "classification": {
        "type": "object",
        "properties": {
            "topic": {"enum": ["science", "sports", "politics", "art", "other"]},
            "keywords": {"type": "array", "items": NAME, "maxItems": 2},
        },
        "required": ["topic"],
    },
    "book": {
        "type": "object",
        "properties": {
            "title": NAME,
            "author": {
                "type": "object",
                "properties": {"first": NAME, "last": NAME},
                "required": ["last"],
            },
            "year": {"type": "integer", "minimum": 1400, "maximum": 2030},
        },
        "required": ["title", "author", "year"],
    },
    "scores": {
        "type": "object",
        "properties": {
            "scores": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 100},
                "minItems": 2,
                "maxItems": 4,
            }
        },
        "required": ["scores"],
    },
    "answer": {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "reason": NAME},
        "required": ["answer", "reason"],
    },
    "recipe": {
        "type": "object",
        "properties": {
            "dish": NAME,
            "steps": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
                    "required": ["n"],
                },
                "minItems": 1,
                "maxItems": 2,
            },
            "vegetarian": {"type": "boolean"},
        },
        "required": ["dish", "steps", "vegetarian"],
    },
}
SUBJECTS = (
    "a teacher in Lisbon", "a rainy weekend", "a new phone", "the local football team",
    "a jazz concert", "a small bakery", "a mountain hike", "a science fair", "an old novel",
    "a city election", "a coffee machine", "a summer festival", "a chess club", "a museum",
    "a vegetable soup", "a train delay", "a school play",
)  # fmt: skip


def requests(engine: HFEngine, count: int, max_tokens: int) -> list[tuple[str, EngineInput]]:
    """``count`` (schema name, input) pairs, schemas and subjects in rotation."""
    names = sorted(SCHEMAS)
    out = []
    for i in range(count):
        name = names[i % len(names)]
        subject = SUBJECTS[(i // len(names)) % len(SUBJECTS)]
        fmt = ResponseFormat("json_schema", json.dumps(SCHEMAS[name]), name, True)
        prompt = f"Give a {name} for {subject} as JSON."
        request = InferenceRequest(
            f"s{i}",
            messages=(ChatMessage("user", prompt),),
            sampling=SamplingParams(response_format=fmt),
        )
        sampling = ResolvedSampling.resolve(
            SamplingParams(max_tokens=max_tokens, temperature=0.0, response_format=fmt),
            None,
            GenerationConfig(),
        )
        out.append((name, EngineInput(f"s{i}", engine.encode(request), sampling)))
    return out


def run(engine: HFEngine, inputs: list[EngineInput]) -> tuple[float, dict[str, Completion]]:
    done: list[Completion] = []
    start = time.perf_counter()
    engine.run_batch(inputs, done.append)
    return time.perf_counter() - start, {c.key: c for c in done}


def valid(text: str, schema: dict[str, Any]) -> tuple[bool, bool]:
    """(parses as JSON, and validates against ``schema``)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False, False
    return True, jsonschema.Draft202012Validator(schema).is_valid(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    engine = HFEngine(EngineConfig(device="cpu"))
    started = time.perf_counter()
    engine.load()
    load_s = time.perf_counter() - started
    work = requests(engine, args.requests, args.max_tokens)
    free_sampling = {
        key: replace(item.sampling, response_format=ResponseFormat()) for key, item in work
    }
    totals = {"constrained": [0.0, 0, 0], "unconstrained": [0.0, 0, 0]}  # s, tokens, reqs
    checks = {name: {"requests": 0, "parsed": 0, "valid": 0, "free_valid": 0} for name in SCHEMAS}
    for at in range(0, len(work), args.batch_size):
        chunk = work[at : at + args.batch_size]
        inputs = [item for _, item in chunk]
        free = [replace(item, sampling=free_sampling[name]) for name, item in chunk]
        for condition, batch in (("constrained", inputs), ("unconstrained", free)):
            seconds, done = run(engine, batch)
            total = totals[condition]
            total[0] += seconds
            total[1] += sum(c.completion_tokens for c in done.values())
            total[2] += len(batch)
            for name, item in chunk:
                parsed, ok = valid(done[item.key].text, SCHEMAS[name])
                row = checks[name]
                if condition == "constrained":
                    row["requests"] += 1
                    row["parsed"] += parsed
                    row["valid"] += ok
                else:
                    row["free_valid"] += ok
        print(f"{at + len(chunk)}/{len(work)} requests", flush=True)
    conditions = {
        name: {
            "wall_s": round(s, 2),
            "generated_tokens": tokens,
            "tokens_per_s": round(tokens / s, 2),
            "requests_per_s": round(reqs / s, 3),
        }
        for name, (s, tokens, reqs) in totals.items()
    }
    count = sum(row["requests"] for row in checks.values())
    payload = {
        "model": engine.model_name,
        "engine": "hf (transformers, CPU), xgrammar guided decoding",
        "requests": count,
        "schemas": len(SCHEMAS),
        "batch_size": args.batch_size,
        "max_tokens": args.max_tokens,
        "load_s": round(load_s, 1),
        "parsed_pct": round(100 * sum(r["parsed"] for r in checks.values()) / count, 2),
        "valid_pct": round(100 * sum(r["valid"] for r in checks.values()) / count, 2),
        "unconstrained_valid_pct": round(
            100 * sum(r["free_valid"] for r in checks.values()) / count, 2
        ),
        "tokens_per_s_ratio": round(
            conditions["constrained"]["tokens_per_s"] / conditions["unconstrained"]["tokens_per_s"],
            3,
        ),
        "conditions": conditions,
        "by_schema": checks,
        "command": "python -m bench.structured",
    }
    print(json.dumps(payload, indent=2))
    write_result("structured", payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
