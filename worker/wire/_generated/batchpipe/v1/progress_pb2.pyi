# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class PartitionProgress(_message.Message):
    __slots__ = ("group", "topic", "partition", "committed", "highest", "unanswered")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    HIGHEST_FIELD_NUMBER: _ClassVar[int]
    UNANSWERED_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    partition: int
    committed: int
    highest: int
    unanswered: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., committed: _Optional[int] = ..., highest: _Optional[int] = ..., unanswered: _Optional[_Iterable[int]] = ...) -> None: ...
