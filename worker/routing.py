"""Which requests topic a model's requests go to: the publishers' routing table.

A fleet serves several models with **one requests topic per model**, each consumed by its
own consumer group of workers that loaded that model (docs/architecture.md §4, "Models and
topics"); all groups answer on one shared results topic, so ``collect`` and ``status`` find
every answer by ``batch_id`` whatever model produced it. Publishers — ``batchpipe submit``,
:class:`batchpipe.Client`, ``batchpipe serve`` — look each request's ``model`` up in
``kafka.routes`` (model → requests topic):

* no routes (the default): every request goes to ``kafka.requests_topic``, as with one
  model;
* routes: a request goes to its model's topic, and a model without a route is refused
  (:class:`UnroutedModelError`, 4002 naming the model) before anything is published —
  never sent to a default topic where no worker serves it.

The table is built on the configuration: ``load_config`` validates ``kafka.routes`` with
:func:`worker.config.route_problems`, and a worker checks that its own model's route is
the topic it consumes (:func:`served_route_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from worker.config import Config, KafkaConfig, reserved_topics, route_problems
from worker.errors import BatchpipeError, ErrorCode


class RoutesError(BatchpipeError, ValueError):
    """The routing table itself is invalid; the message names each bad route."""


class UnroutedModelError(BatchpipeError, ValueError):
    """A request names a model that has no route; nothing was published."""

    code = ErrorCode.INVALID_PARAMETER

    def __init__(self, model: str, routes: Mapping[str, str]) -> None:
        known = ", ".join(repr(m) for m in sorted(routes))
        what = f"model {model!r} has no route" if model else "a request without a model"
        super().__init__(
            f"{what}: kafka.routes sends each model to its own requests topic and lists "
            f"only [{known}]; add --route {model or 'MODEL'}=TOPIC (or kafka.routes in the "
            "configuration) for the topic its workers consume"
        )
        self.model = model


def parse_route(text: str) -> tuple[str, str]:
    """``MODEL=TOPIC`` → ``(model, topic)``; split at the last ``=`` (topics have none).

    Raises :class:`RoutesError` naming the item when either side is empty or the topic is
    not a legal Kafka topic name.
    """
    model, sep, topic = text.rpartition("=")
    if not sep or not model or not topic:
        raise RoutesError(f"route {text!r}: expected MODEL=TOPIC, e.g. smollm2-135m-instruct=chat")
    problems = route_problems({model: topic}, {})
    if problems:
        raise RoutesError(f"route {text!r}: {problems[0]}")
    return model, topic


def served_route_problem(config: Config) -> str | None:
    """Why a worker with this configuration would wait for requests that never come, or None.

    A worker reads ``kafka.requests_topic``. With ``kafka.routes`` set (a fleet's shared
    configuration), publishers send its model's (``engine.model``'s) requests to that
    model's route only: the route must exist — else every request for the model is
    refused — and be the topic it reads — else they wait on a topic nobody consumes.
    """
    kafka, model = config.kafka, config.engine.model
    if not kafka.routes:
        return None
    routed = kafka.routes.get(model)
    if routed is None:
        return (
            f"engine.model: {model!r} has no route in kafka.routes, so publishers refuse "
            f"every request for it; add {model}: {kafka.requests_topic} to kafka.routes"
        )
    if routed != kafka.requests_topic:
        return (
            f"kafka.requests_topic: {kafka.requests_topic!r}, but kafka.routes sends model "
            f"{model!r} (engine.model) to {routed!r}: this worker would never see its requests"
        )
    return None


@dataclass(frozen=True)
class RoutingTable:
    """Model → requests topic; empty ``routes`` send everything to ``default_topic``."""

    default_topic: str
    routes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = route_problems(self.routes, {})
        if problems:
            raise RoutesError("invalid routes:\n" + "\n".join(f"  {p}" for p in problems))
        object.__setattr__(self, "routes", MappingProxyType(dict(self.routes)))

    @classmethod
    def from_kafka(cls, kafka: KafkaConfig) -> RoutingTable:
        """The table of a configuration: ``kafka.routes`` over ``kafka.requests_topic``."""
        problems = route_problems(kafka.routes, reserved_topics(kafka))
        if problems:
            raise RoutesError("invalid routes:\n" + "\n".join(f"  {p}" for p in problems))
        return cls(kafka.requests_topic, kafka.routes)

    def topic_for(self, model: str) -> str:
        """The requests topic of ``model``; :class:`UnroutedModelError` when it has none."""
        if not self.routes:
            return self.default_topic
        topic = self.routes.get(model)
        if topic is None:
            raise UnroutedModelError(model, self.routes)
        return topic

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic a request may be published to, sorted."""
        return tuple(sorted(set(self.routes.values()))) if self.routes else (self.default_topic,)
