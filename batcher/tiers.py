"""Service tiers: which batch is fed next across ``priority``, ``default`` and ``flex``.

A batch asks for one tier (docs/architecture.md §10, "Service tiers"):

* ``priority`` is fed *ahead* of the default tier, but only within its key's
  *allowance*: each feed step a key with priority work waiting earns its share
  (``scheduling.priority_shares``, default 0.5) of the step's room, banked up to one step's
  worth or one record, and its priority batches are served out of turn while the
  allowance lasts. Served so, a slice is charged in fair share as the batch's own turn
  (as a deadline at risk is, :mod:`worker.feeder.deadlines`): beyond the allowance a
  priority batch is fed as a default one, and a key that asks for priority on everything
  still leaves the others at least ``1 − share`` of the fleet. Its slices carry tag 0,
  so a worker starts them before what it holds of the other tiers (within the batcher's
  one-level bound, :mod:`batcher.batcher`).
* ``default`` batches (and priority ones beyond their allowance) share the fleet by
  weighted fair share, keys then batches (:class:`batcher.fairshare.FairShare`).
* ``flex`` batches have a fair share of their own, consulted only when no priority or
  default batch has a request waiting to be fed: they take only capacity no other batch
  wants, and a batch of another tier that arrives is fed from the next step. Their slices
  carry tags above :data:`FLEX_TAG`, so a worker starts what it holds of the other
  tiers first: flex is the first to give way.

Fair share (keys, then batches, by weight) and deadlines hold within a tier: a flex batch
at risk of missing its deadline is rushed only while nothing else waits.

A key whose allowance is 0 could never have a batch fed ahead, so its publishers refuse
``priority`` (:func:`check_allowance`) rather than run the batch as default in silence.

Pure logic: no I/O and no clock (:mod:`worker.feeder.plan` plans the steps).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping

from batcher.errors import BatchpipeError
from batcher.fairshare import FairShare

PRIORITY, DEFAULT, FLEX = "priority", "default", "flex"
TIERS = (PRIORITY, DEFAULT, FLEX)
#: a key's share of each step's room its priority batches are fed ahead, unless configured
DEFAULT_PRIORITY_SHARE = 0.5
#: flex slices' tags start here: above any default key's virtual service (tokens ÷ weight
#: since the key became active: 10¹² tokens at the lightest weight), so a worker starts
#: what it holds of the other tiers first; ``repr`` of such a tag is at most 24 characters
FLEX_TAG = 1e15


def tier_of(text: str) -> str:
    """The tier a header or a setting names; anything unknown is ``default`` (a typo or a
    newer publisher's tier must neither stop a batch nor buy it a better place)."""
    return text if text in TIERS else DEFAULT


def clamp_share(share: float) -> float:
    """A priority share within [0, 1]; NaN is 0 (no priority)."""
    return 0.0 if math.isnan(share) else min(1.0, max(0.0, share))


def priority_share(shares: Mapping[str, float], key: str) -> float:
    """``key``'s allowance: ``shares[key]``, else ``shares["*"]``, else
    :data:`DEFAULT_PRIORITY_SHARE` (``shares`` is ``scheduling.priority_shares``), clamped."""
    return clamp_share(shares.get(key, shares.get("*", DEFAULT_PRIORITY_SHARE)))


class TierRefusedError(BatchpipeError, ValueError):
    """A batch asks for ``priority`` from a key whose allowance is 0."""


def check_allowance(tier: str, shares: Mapping[str, float], key: str, field: str) -> str:
    """``tier``, unless it is ``priority`` and ``key``'s allowance is 0: then
    :class:`TierRefusedError` naming ``field`` (where the publisher's caller wrote the
    tier), the allowance and the entry of ``scheduling.priority_shares`` that set it."""
    if tier != PRIORITY or priority_share(shares, key) > 0:
        return tier
    entry = key if key in shares else "*"  # only an entry gives 0: the default is 0.5
    raise TierRefusedError(
        f"{field}: 'priority' is refused for key {key!r}: its priority allowance is 0 "
        f"(scheduling.priority_shares[{entry!r}] = {shares[entry]:g}), so none of its "
        "batches would be fed ahead; submit it in the default tier, or ask the operator "
        "for a share above 0"
    )


class Tiers:
    """The active batches of every tier, with :class:`FairShare`'s interface: the
    planner asks :meth:`next` for the batch to serve and :attr:`tag`/:attr:`tag_step`
    for its slice's tag."""

    def __init__(
        self, quantum: int, shares: Callable[[str], float] = lambda _key: DEFAULT_PRIORITY_SHARE
    ) -> None:
        self.main = FairShare(quantum)  # priority and default batches
        self.flex = FairShare(quantum)
        self._shares = shares  # a key's priority share (clamped here)
        self._tier: dict[str, str] = {}  # active batch -> its tier
        self._priority: dict[str, str] = {}  # active priority batch -> its key, oldest first
        self._allowance: dict[str, float] = {}  # key -> records it may be fed ahead now
        self._flex_room: int | None = None  # this step's most flex records (None: room)
        #: requests waiting to be fed, per tier
        self.waiting_by_tier: Counter[str] = Counter()
        #: the last slice's tag, what each of its requests adds, its batch's tier, and
        #: whether it was a priority batch's fed ahead (tag 0: the workers start it first)
        self.tag, self.tag_step, self.tier, self.ahead = 0.0, 0.0, DEFAULT, False

    def __len__(self) -> int:
        return len(self.main) + len(self.flex)

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._tier

    def add(
        self,
        batch_id: str,
        count: int,
        weight: float = 1.0,
        key: str = "",
        tokens: float = 1.0,
        tier: str = DEFAULT,
    ) -> None:
        """As :meth:`FairShare.add`; a batch keeps the tier it was first added with."""
        if count < 1:
            return
        tier = self._tier.setdefault(batch_id, tier_of(tier))
        (self.flex if tier == FLEX else self.main).add(batch_id, count, weight, key, tokens)
        if tier == PRIORITY:
            self._priority.setdefault(batch_id, key)
        self.waiting_by_tier[tier] += count

    def remove(self, batch_id: str) -> int:
        """Forget ``batch_id``; returns how many of its requests were waiting."""
        tier = self._tier.pop(batch_id, None)
        if tier is None:
            return 0
        self._priority.pop(batch_id, None)
        left = (self.flex if tier == FLEX else self.main).remove(batch_id)
        self.waiting_by_tier[tier] -= left
        return left

    def waiting(self, batch_id: str) -> int:
        share = self.flex if self._tier.get(batch_id) == FLEX else self.main
        return share.waiting(batch_id)

    def first_slice(self, engine: int) -> int:
        """:meth:`FairShare.first_slice` of the tier that would be fed."""
        return (self.main if len(self.main) else self.flex).first_slice(engine)

    def accrue(self, room: int, flex_room: int | None = None) -> None:
        """A step with ``room`` begins: each key with priority work waiting earns its
        share of it, carried to the next step but banked only up to one step's worth or
        one record (no burst after an idle while); flex batches may be fed at most
        ``flex_room`` in it (the workers' free slots, no cushion: what waits unread in
        the topic is read before anything fed after it, so flex keeps none there)."""
        self._flex_room = flex_room
        keys = set(self._priority.values())
        self._allowance = {k: a for k, a in self._allowance.items() if k in keys}
        for key in keys:
            earned = clamp_share(self._shares(key)) * room
            if earned > 0:
                banked = self._allowance.get(key, 0.0) + earned
                self._allowance[key] = min(banked, max(1.0, earned))

    def next(self, room: int, fresh: int = 0, first: int | None = None) -> tuple[str, int] | None:
        """The batch to serve now and how many of its requests: a priority batch within
        its key's allowance, else what fair share chooses among priority and default
        batches, else, when none of those waits, among flex batches; as
        :meth:`FairShare.next` says of ``room``, ``fresh`` and ``first``."""
        if room >= 1:
            for batch_id, key in self._priority.items():
                allowed = min(room, math.floor(self._allowance.get(key, 0.0)))
                if allowed >= 1:
                    served = self.main.serve(batch_id, allowed)
                    if served >= 1:
                        self._allowance[key] -= served
                        self.tag, self.tag_step = 0.0, 0.0  # started first by the workers
                        return batch_id, self._served(batch_id, served, ahead=True)
        if len(self.main):
            picked = self.main.next(room, fresh, first)
            if picked is None:
                return None  # their room is spent: flex waits too
            self.tag, self.tag_step = self.main.tag, self.main.tag_step
            return picked[0], self._served(*picked)
        # no overdraft for flex (a newcomer's first slice beyond credit is for the others)
        limit = room if self._flex_room is None else min(room, self._flex_room)
        picked = self.flex.next(limit, 0, first)
        if picked is None:
            return None
        if self._flex_room is not None:
            self._flex_room -= picked[1]
        self.tag, self.tag_step = FLEX_TAG + self.flex.tag, self.flex.tag_step
        return picked[0], self._served(*picked)

    def serve(self, batch_id: str, room: int) -> int:
        """As :meth:`FairShare.serve` (a deadline at risk), within the batch's tier: a
        flex batch only while no batch of another tier waits."""
        tier = self._tier.get(batch_id)
        if tier is None or (tier == FLEX and len(self.main)):
            return 0
        share = self.flex if tier == FLEX else self.main
        served = share.serve(batch_id, room)
        base = FLEX_TAG if tier == FLEX else 0.0
        self.tag, self.tag_step = base + share.tag, share.tag_step
        return self._served(batch_id, served)

    def _served(self, batch_id: str, count: int, ahead: bool = False) -> int:
        self.ahead = ahead
        tier = self.tier = self._tier[batch_id]
        self.waiting_by_tier[tier] -= count
        if not self.waiting(batch_id):  # fed to its end (for now): no longer active
            del self._tier[batch_id]
            self._priority.pop(batch_id, None)
        return count
