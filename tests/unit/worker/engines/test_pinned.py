"""PinnedBufferPool: left padding into reusable buffers, no allocation per batch."""

from __future__ import annotations

import pytest
import torch

from worker.engines.hf.pinned import PinnedBufferPool

CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


def test_rows_are_left_padded_with_a_mask() -> None:
    pool = PinnedBufferPool(CPU, capacity_tokens=64)
    staged = pool.stage([[5, 6, 7], [8], []], pad_token_id=0)
    assert staged.input_ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert staged.attention_mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert staged.input_ids.dtype == staged.attention_mask.dtype == torch.int64


def test_many_batches_allocate_nothing_and_reuse_the_slots() -> None:
    pool = PinnedBufferPool(CPU, capacity_tokens=256, slots=2)
    before = pool.allocations
    pointers = set()
    for n in range(200):
        rows = [list(range(1, 2 + (n + i) % 30)) for i in range(1 + n % 8)]
        staged = pool.stage(rows, pad_token_id=0)
        pointers.add(staged.input_ids.data_ptr())
        assert staged.input_ids[-1, -len(rows[-1]) :].tolist() == rows[-1]
    assert pool.allocations == before == 4
    assert len(pointers) == 2


def test_a_batch_stays_intact_while_the_next_one_is_staged() -> None:
    pool = PinnedBufferPool(CPU, capacity_tokens=16, slots=2)
    first = pool.stage([[1, 2]], pad_token_id=0)
    pool.stage([[3, 4, 5]], pad_token_id=0)
    assert first.input_ids.tolist() == [[1, 2]]


def test_an_oversized_batch_grows_its_slot_once() -> None:
    pool = PinnedBufferPool(CPU, capacity_tokens=8, slots=1)
    rows = [[1] * 5, [2] * 5]
    staged = pool.stage(rows, pad_token_id=0)
    assert staged.input_ids.tolist() == rows
    grown = pool.allocations
    assert grown == 4
    for _ in range(10):
        pool.stage(rows, pad_token_id=0)
    assert pool.allocations == grown


def test_cpu_buffers_are_not_pinned() -> None:
    assert not PinnedBufferPool(CPU, capacity_tokens=8).pinned


@needs_cuda
def test_cuda_staging_is_pinned_and_lands_on_the_device() -> None:
    device = torch.device("cuda")
    pool = PinnedBufferPool(device, capacity_tokens=1024, slots=2)
    assert pool.pinned
    before = pool.allocations
    for n in range(50):
        staged = pool.stage([[n, n + 1], [n + 2]], pad_token_id=0)
        assert staged.input_ids.device.type == "cuda"
        assert staged.input_ids.tolist() == [[n, n + 1], [0, n + 2]]
    assert pool.allocations == before


@needs_cuda
def test_cuda_without_pinning_copies_synchronously() -> None:
    pool = PinnedBufferPool(torch.device("cuda"), capacity_tokens=64, pin=False)
    assert not pool.pinned
    staged = pool.stage([[1, 2, 3]], pad_token_id=9)
    assert staged.attention_mask.device.type == "cuda"
    assert staged.input_ids.tolist() == [[1, 2, 3]]
