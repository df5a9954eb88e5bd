"""Identical-input deduplication: one run answers every request with the same input.

A request whose ``dedup_key`` equals that of a queued or running *leader* becomes the
leader's *follower*: it is never run; when the leader completes, its result answers the
followers too. The index only records who follows whom; the batcher decides when a
follower must be promoted (its leader left without a result it can share).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic

from batcher.types import Pending, T


class DedupIndex(Generic[T]):
    """Leaders by dedup key, followers by leader key.

    Invariant: every registered leader key maps back to its dedup key, every follower sits
    in exactly one leader's list, and a leader has followers only while registered.
    """

    def __init__(self) -> None:
        self._leader_by_dedup: dict[Hashable, str] = {}
        self._dedup_by_leader: dict[str, Hashable] = {}
        self._followers: dict[str, list[Pending[T]]] = {}
        self._leader_of: dict[str, str] = {}

    def __len__(self) -> int:
        """Number of followers."""
        return len(self._leader_of)

    def leader_for(self, dedup_key: Hashable) -> str | None:
        return self._leader_by_dedup.get(dedup_key)

    def is_follower(self, key: str) -> bool:
        return key in self._leader_of

    def register(self, leader: Pending[T]) -> None:
        """Make ``leader`` the one request that runs for its dedup key."""
        if leader.dedup_key is None:
            raise ValueError(f"{leader.key}: a leader needs a dedup_key")
        if leader.dedup_key in self._leader_by_dedup:
            raise ValueError(f"{leader.key}: dedup key already has a leader")
        self._leader_by_dedup[leader.dedup_key] = leader.key
        self._dedup_by_leader[leader.key] = leader.dedup_key

    def follow(self, leader_key: str, item: Pending[T]) -> None:
        if leader_key not in self._dedup_by_leader:
            raise KeyError(f"{leader_key!r} is not a registered leader")
        self._followers.setdefault(leader_key, []).append(item)
        self._leader_of[item.key] = leader_key

    def followers(self, leader_key: str) -> list[Pending[T]]:
        """The followers of a leader, in joining order (a copy)."""
        return list(self._followers.get(leader_key, ()))

    def all_followers(self) -> list[tuple[str, Pending[T]]]:
        """(leader key, follower) for every follower."""
        return [(leader, item) for leader, items in self._followers.items() for item in items]

    def remove_follower(self, key: str) -> None:
        leader_key = self._leader_of.pop(key)
        remaining = [item for item in self._followers[leader_key] if item.key != key]
        if remaining:
            self._followers[leader_key] = remaining
        else:
            del self._followers[leader_key]

    def retire(self, leader_key: str) -> list[Pending[T]]:
        """The leader leaves: unregister it and return its followers, now unattached.

        A key that is not a registered leader (it had no dedup key) has no followers.
        """
        dedup_key = self._dedup_by_leader.pop(leader_key, None)
        if dedup_key is None:
            return []
        del self._leader_by_dedup[dedup_key]
        followers = self._followers.pop(leader_key, [])
        for item in followers:
            del self._leader_of[item.key]
        return followers
