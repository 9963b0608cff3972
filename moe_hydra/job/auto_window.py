"""``contract.window=auto`` on every rank: step until the step times have a steady segment, then measure it.

After each step from ``contract.warmup_steps + 2 x contract.steady_steps`` on, rank 0 judges the step times so far
(:func:`moe_hydra.core.steady.judge`: every rank holds the same times, the slowest rank's, but one decides) and
broadcasts whether it found the steady segment it stops on (:func:`moe_hydra.core.steady.settled`: at least
``steady_steps`` steps after the last change of level, and at least half of the steps judged), and where; every rank
follows, so none waits on another. The window measured is that segment. A run that reaches ``train.train_iters``
without one measures its last ``steady_steps`` steps, and its judgment says it found none.

The judging is rank 0's and outside the timed steps; its seconds (with the broadcast) are recorded
(``results.json``: ``steady.seconds``).
"""

from __future__ import annotations

import time
from typing import Any

from moe_hydra.core import steady


class AutoWindow:
    """The window of a ``contract.window=auto`` run, found while it steps."""

    def __init__(self, contract: Any, cap: int, rank: int, device: Any):
        self.warmup_steps, self.steady_steps = contract.warmup_steps, contract.steady_steps
        self.cap, self.rank, self.device = cap, rank, device
        self.found: tuple[int, int] | None = None  # the steady segment, once found
        self.seconds = 0.0  # rank 0's judging and the broadcast, over the run

    def after(self, times_ms: list[float]) -> bool:
        """After the step ``len(times_ms)`` on every rank: whether the steady segment is found now (then
        :attr:`found`). The same steps on every rank call it (a broadcast)."""
        step = len(times_ms)
        if self.found is not None or step < self.warmup_steps + steady.AUTO_HISTORY * self.steady_steps:
            return False
        import torch
        import torch.distributed as dist

        start = time.perf_counter()
        decision = torch.zeros(3, dtype=torch.int64, device=self.device)
        if self.rank == 0:
            j = steady.judge(times_ms, warmup_steps=self.warmup_steps, steady_steps=self.steady_steps)
            if steady.settled(j):
                decision[:] = torch.tensor([1, *j.segment], dtype=torch.int64)
        dist.broadcast(decision, src=0)
        found, first, last = (int(x) for x in decision.tolist())
        self.seconds += time.perf_counter() - start
        if found:
            self.found = (first, last)
        return bool(found)

    def window(self, steps: int) -> list[int]:
        """The window measured after ``steps`` steps: the segment found, else the last ``steady_steps`` steps after
        the warmup (judged not steady: the run found none)."""
        if self.found is not None:
            return list(self.found)
        return [max(self.warmup_steps + 1, steps - self.steady_steps + 1), max(steps, 1)]
