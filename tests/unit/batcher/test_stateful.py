"""Stateful property test of DynamicBatcher against its invariants.

Random interleavings of add / time passing / release / take (room of an in-flight engine) /
complete / requeue / expire / revoke / resize, under random limits and formation modes,
checking after every step: limits (or the room given to take) never exceeded, every
request answered exactly once (complete, pop_expired or drop_partitions; one too big for
any batch is refused and not kept), the anchor (highest effective priority: priority with
aging) in every released batch, strict order in FIFO mode, release exactly when full /
timed out / flushed, and dedup followers answered with their leader.
"""

from __future__ import annotations

import itertools

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from batcher import BatchLimits, DynamicBatcher, Pending

PARTITIONS = [("requests", p) for p in range(3)]
Spec = tuple[int, int, int, tuple[str, int], bytes | None, bytes | None, int | None]


class BatcherMachine(RuleBasedStateMachine):
    @initialize(
        max_size=st.integers(1, 6),
        max_tokens=st.integers(20, 400),
        timeout_ms=st.sampled_from([0, 50, 100]),
        length_aware=st.booleans(),
        shared_prefix=st.booleans(),
        dedup=st.booleans(),
        aging_ms=st.sampled_from([1, 40, 1000]),
    )
    def setup(
        self,
        max_size: int,
        max_tokens: int,
        timeout_ms: int,
        length_aware: bool,
        shared_prefix: bool,
        dedup: bool,
        aging_ms: int,
    ) -> None:
        self.limits = BatchLimits(
            max_size, max_tokens, timeout_ms / 1000, length_aware, shared_prefix, aging_ms / 1000
        )
        self.fifo = not (length_aware or shared_prefix)
        self.b: DynamicBatcher[int] = DynamicBatcher(self.limits, dedup=dedup)
        self.ms = 0
        self.added: dict[str, Pending[int]] = {}
        self.answered: dict[str, str] = {}
        self.running: set[str] = set()

    @property
    def now(self) -> float:
        return self.ms / 1000

    def order(self, item: Pending[int]) -> tuple[float, int, float]:
        """Highest effective priority first: priority plus one level per aging step waited,
        i.e. the earliest virtual arrival; ties to the higher priority, then the older.
        Arrivals are distinct in this machine, so this is a total order."""
        aging_s = self.limits.priority_aging_s
        return (item.arrival - item.priority * aging_s, -item.priority, item.arrival)

    def answer(self, items: list[Pending[int]], how: str) -> None:
        for i in items:
            assert i.key in self.added, i.key
            assert i.key not in self.answered, (i.key, self.answered[i.key], how)
            self.answered[i.key] = how

    @rule(
        specs=st.lists(
            st.tuples(
                st.integers(0, 120),  # prompt tokens
                st.integers(0, 60),  # max_tokens
                st.integers(0, 2),  # priority
                st.sampled_from(PARTITIONS),
                st.sampled_from([None, b"a", b"b"]),  # dedup key
                st.sampled_from([None, b"p", b"q"]),  # prefix key
                st.none() | st.integers(0, 300),  # deadline, ms from now
            ),
            min_size=1,
            max_size=4,
        )
    )
    def add(self, specs: list[Spec]) -> None:
        for prompt, gen, priority, partition, dedup_key, prefix_key, deadline_ms in specs:
            self.ms += 1  # distinct arrivals
            n = len(self.added)
            deadline = None if deadline_ms is None else self.now + deadline_ms / 1000
            item = Pending(
                f"r{n}",
                partition,
                n,
                prompt,
                gen,
                self.now,
                n,
                priority,
                deadline,
                dedup_key,
                prefix_key,
            )
            try:
                followed = self.b.add(item, self.now)
            except ValueError:
                # too big for any batch: the caller answers it (intake: 4003); not kept, so
                # the next item may take the same key
                assert item.tokens > self.limits.max_batch_tokens
                continue
            self.added[item.key] = item
            assert item.tokens <= self.limits.max_batch_tokens
            if followed:
                assert self.b.dedup and dedup_key is not None
                assert item.key not in {i.key for i in self.b.queued()}

    @rule(ms=st.integers(0, 150))
    def advance(self, ms: int) -> None:
        self.ms += ms

    @rule(size=st.integers(1, 6))
    def resize(self, size: int) -> None:
        size = min(size, self.limits.max_batch_size)
        self.b.max_batch_size = size
        assert self.b.max_batch_size == size

    @rule(flush=st.booleans())
    def release(self, flush: bool) -> None:
        queue = self.b.queued()
        wake = self.b.wake_at()
        batch = self.b.next_batch(self.now, flush=flush)
        if not queue:
            assert batch is None and wake is None
            return
        oldest = min(i.arrival for i in queue)
        assert wake == oldest + self.limits.timeout_s
        size, limit = self.b.max_batch_size, self.limits.max_batch_tokens
        full = len(queue) >= size or sum(i.tokens for i in queue) > limit
        due = full or self.now >= wake or flush
        assert (batch is not None) == due
        if batch is None:
            return
        assert batch.reason == ("full" if full else "timeout" if self.now >= wake else "flush")
        assert 1 <= batch.size <= size
        assert batch.tokens <= limit
        assert all(i in queue for i in batch.items)
        # no starvation: the request of the highest effective priority leaves in this batch
        assert batch.items[0] == min(queue, key=self.order)
        left = [i for i in queue if i not in batch.items]
        if self.fifo:
            assert list(batch.items) == queue[: batch.size]
            assert all(self.order(i) < self.order(j) for i in batch.items for j in left)
        elif batch.size < size:
            spare = limit - batch.tokens
            assert all(i.tokens > spare for i in left)
        self.running |= {i.key for i in batch.items}

    @rule(sequences=st.integers(0, 6), tokens=st.integers(0, 400), flush=st.booleans())
    def take(self, sequences: int, tokens: int, flush: bool) -> None:
        """Room of an in-flight engine: the release rules of a batch, with the room as limits."""
        queue = self.b.queued()
        wake = self.b.wake_at()
        batch = self.b.take(self.now, sequences, tokens, flush=flush)
        if not queue or sequences < 1:
            assert batch is None
            return
        assert wake is not None
        full = len(queue) >= sequences or sum(i.tokens for i in queue) > tokens
        anchor = min(queue, key=self.order)
        due = (full or self.now >= wake or flush) and anchor.tokens <= tokens
        assert (batch is not None) == due
        if batch is None:
            return
        assert batch.reason == ("full" if full else "timeout" if self.now >= wake else "flush")
        assert 1 <= batch.size <= sequences
        assert batch.tokens <= tokens
        assert all(i in queue for i in batch.items)
        assert batch.items[0] == anchor  # the anchor first: it waits for room, never skipped
        left = [i for i in queue if i not in batch.items]
        if self.fifo:
            assert list(batch.items) == queue[: batch.size]
        elif batch.size < sequences:
            spare = tokens - batch.tokens
            assert all(i.tokens > spare for i in left)
        self.running |= {i.key for i in batch.items}

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.running)))
        done = self.b.complete(key)
        self.running.remove(key)
        leader, *followers = done
        assert leader.key == key
        assert all(self.b.dedup and f.dedup_key == leader.dedup_key for f in followers)
        self.answer(done, "completed")

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        keys = data.draw(st.sets(st.sampled_from(sorted(self.running)), min_size=1))
        self.b.requeue([self.added[k] for k in keys])
        self.running -= keys
        assert keys <= {i.key for i in self.b.queued()}

    @rule()
    def expire(self) -> None:
        expired = self.b.pop_expired(self.now)
        for i in expired:
            assert i.deadline is not None and i.deadline < self.now
            assert i.key not in self.running
        self.answer(expired, "expired")
        assert not any(i.expired(self.now) for i in self.b.queued())

    @rule(partitions=st.sets(st.sampled_from(PARTITIONS), min_size=1))
    def revoke(self, partitions: set[tuple[str, int]]) -> None:
        dropped = self.b.drop_partitions(partitions)
        assert all(i.partition in partitions for i in dropped)
        self.answer(dropped, "dropped")
        self.running -= {i.key for i in dropped}
        remaining = [*self.b.queued(), *self.b.running()]
        assert not any(i.partition in partitions for i in remaining)

    @invariant()
    def accounting(self) -> None:
        if not hasattr(self, "b"):
            return
        queued = {i.key for i in self.b.queued()}
        running = {i.key for i in self.b.running()}
        assert running == self.running
        assert not queued & running
        in_flight = self.added.keys() - self.answered.keys()
        assert queued | running <= in_flight
        assert self.b.in_flight() == len(in_flight)
        assert len(self.b) == len(queued)
        queue = self.b.queued()
        assert all(self.order(a) < self.order(b) for a, b in itertools.pairwise(queue))

    def teardown(self) -> None:
        if not hasattr(self, "b"):
            return
        for key in sorted(self.running):
            self.answer(self.b.complete(key), "completed")
        while (batch := self.b.next_batch(self.now, flush=True)) is not None:
            for i in batch.items:
                self.answer(self.b.complete(i.key), "completed")
        assert self.b.in_flight() == 0
        assert self.answered.keys() == self.added.keys()


BatcherMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_batcher_machine = BatcherMachine.TestCase
