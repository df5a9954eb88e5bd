"""Pre-allocated, reusable host buffers for staging token ids onto the device.

A batch's input ids and attention mask are written (left-padded) into one of ``slots``
host buffers that live as long as the pool. On CUDA those buffers are page-locked
(pinned), and the host→device copy runs asynchronously on a side stream; the compute
stream waits for it with an event rather than the host. Each slot records an event
after its copy, and the next batch that reuses the slot waits for that event before
overwriting the buffer, so a batch can be staged while the previous one is still being
copied or computed. A pinned copy is also what makes ``non_blocking`` truly
asynchronous: from pageable memory CUDA copies through a bounce buffer, synchronously.

Nothing is allocated per batch on the host: ``allocations`` counts buffer allocations,
and only grows when a batch's padded size exceeds what a slot holds (the slot then grows
to the new high-water mark and stays there). On the CPU the same buffers are filled and
the returned tensors are views of them, valid until ``slots`` more batches are staged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StagedBatch:
    """Left-padded ``[batch, length]`` int64 tensors on the pool's device."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


class _Slot:
    def __init__(self, capacity: int, pin: bool) -> None:
        self.capacity = capacity
        self.ids = torch.empty(capacity, dtype=torch.int64, pin_memory=pin)
        self.mask = torch.empty(capacity, dtype=torch.int64, pin_memory=pin)
        # numpy views of the same memory: row writes from Python lists without temporaries
        self.ids_np = self.ids.numpy()
        self.mask_np = self.mask.numpy()
        self.copied: torch.cuda.Event | None = torch.cuda.Event() if pin else None  # type: ignore[no-untyped-call]
        self.in_flight = False


class PinnedBufferPool:
    """A ring of ``slots`` host buffers of ``capacity_tokens`` int64 ids + mask each."""

    def __init__(
        self, device: torch.device, capacity_tokens: int, slots: int = 2, pin: bool = True
    ) -> None:
        if capacity_tokens < 1 or slots < 1:
            raise ValueError("capacity_tokens and slots must be positive")
        self.device = device
        self.pinned = pin and device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self.pinned else None  # type: ignore[no-untyped-call]
        self._slots = [_Slot(capacity_tokens, self.pinned) for _ in range(slots)]
        self._next = 0
        self.allocations = 2 * slots

    def stage(self, rows: Sequence[Sequence[int]], pad_token_id: int) -> StagedBatch:
        """Left-pad ``rows`` into the next slot and bring them to the device."""
        width = max((len(r) for r in rows), default=0)
        size = len(rows) * width
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.in_flight and slot.copied is not None:
            slot.copied.synchronize()  # the previous copy out of this slot must be done
            slot.in_flight = False
        if size > slot.capacity:
            index = self._slots.index(slot)
            slot = self._slots[index] = _Slot(_grown(size), self.pinned)
            self.allocations += 2
        ids = slot.ids_np[:size].reshape(len(rows), width)
        mask = slot.mask_np[:size].reshape(len(rows), width)
        ids.fill(pad_token_id)
        mask.fill(0)
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row) :] = row
                mask[i, width - len(row) :] = 1
        host_ids = slot.ids[:size].view(len(rows), width)
        host_mask = slot.mask[:size].view(len(rows), width)
        if self.device.type != "cuda":
            return StagedBatch(host_ids, host_mask)
        if self._stream is None or slot.copied is None:
            # pageable memory: an ordinary synchronous copy on the current stream
            return StagedBatch(host_ids.to(self.device), host_mask.to(self.device))
        return self._copy_async(slot, slot.copied, self._stream, host_ids, host_mask)

    def _copy_async(
        self,
        slot: _Slot,
        copied: torch.cuda.Event,
        stream: torch.cuda.Stream,
        host_ids: torch.Tensor,
        host_mask: torch.Tensor,
    ) -> StagedBatch:
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            dev_ids = host_ids.to(self.device, non_blocking=True)
            dev_mask = host_mask.to(self.device, non_blocking=True)
            copied.record(stream)
        slot.in_flight = True
        compute.wait_event(copied)
        # allocated on the side stream, used on the compute stream: tell the allocator
        dev_ids.record_stream(compute)
        dev_mask.record_stream(compute)
        return StagedBatch(dev_ids, dev_mask)


def _grown(size: int) -> int:
    """Grow to the next power of two so a slowly rising high-water mark reallocates rarely."""
    return 1 << (size - 1).bit_length()
