"""Training data for the job. Today: ``data.kind=mock``, synthetic tokens (benchmark-only).

Mock samples are arithmetic token sequences, ``(start + stride * i) % vocab``, with start and
stride drawn per sample from a generator seeded by (seed, global sample index). They are cheap,
independent of the layout (sample k of step s is the same tokens whatever TP/EP/DP is), and
learnable, so the loss falls over the first steps.

The seam for a real dataset: another class with the same ``batch(step, dp_rank, microbatch)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MockData:
    vocab_size: int
    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    microbatches: int  # per data-parallel rank and step (the resolved batch's micro_batches_per_step)
    seed: int

    def sample(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start = torch.randint(0, self.vocab_size, (1,), generator=g)
        stride = torch.randint(1, 8, (1,), generator=g)
        return (start + stride * torch.arange(self.seq_length + 1)) % self.vocab_size

    def batch(self, step: int, dp_rank: int, microbatch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, labels) of shape [micro_batch_size, seq_length] for one micro-batch."""
        first = step * self.global_batch_size + (dp_rank * self.microbatches + microbatch) * self.micro_batch_size
        seqs = torch.stack([self.sample(first + i) for i in range(self.micro_batch_size)])
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()
