"""Which tokens of a sequence a context-parallel rank holds (pure). The sequence is cut into 2N
equal chunks and rank i of N holds chunks i and 2N-1-i: under a causal mask a late chunk attends to
more keys than an early one, and each rank holding one of each does the same work (the
"zig-zag" of Llama 3's and Megatron-LM's context parallelism; torch's head-tail load balancer
lays the sequence out the same way, so its ring attention takes these shards as they are)."""

from __future__ import annotations

import torch


def chunks(n: int, i: int) -> tuple[int, int]:
    """The two chunks (of 2n) rank i holds."""
    return i, 2 * n - 1 - i


def positions(seq: int, n: int, i: int) -> torch.Tensor:
    """The positions in the sequence of rank i's tokens, in the order it holds them."""
    c = seq // (2 * n)
    return torch.cat([torch.arange(k * c, (k + 1) * c) for k in chunks(n, i)])


def gathered_positions(seq: int, n: int) -> torch.Tensor:
    """The positions of a sequence gathered from the n ranks in their order (rank 0's tokens, then
    rank 1's ...): what the keys of an all-gathered K stand for."""
    return torch.cat([positions(seq, n, i) for i in range(n)])


def take(x: torch.Tensor, n: int, i: int, dim: int) -> torch.Tensor:
    """Rank i's share of `x` along `dim` (its chunks, in order)."""
    parts = x.chunk(2 * n, dim=dim)
    a, b = chunks(n, i)
    return torch.cat([parts[a], parts[b]], dim=dim)
