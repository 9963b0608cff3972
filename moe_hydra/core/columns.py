"""One formula for one layout or for columns of many: the operations the step model and the memory estimate use
where a layout's numbers may be plain numbers (``stage=plan``, the step model's fit: plain Python, fast on one) or
numpy columns, one row per candidate (the layout search). A formula written with ``xp.where``, ``xp.maximum``, ...
gives each row of the columns what it gives that row's numbers alone, to the bit: the same IEEE operations in the
same order.

Pure: standard library only (numpy imported on first use of :func:`numpy_ops`: ``stage=plan`` never needs it).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Mesh:
    """What the step model and the memory estimate read of a layout and batch: one layout's numbers, or numpy columns
    of many (the layout search's candidates, one row each). ``vpp`` is 1 without virtual stages; ``m`` the
    micro-batches per step."""

    tp: Any
    cp: Any
    pp: Any
    vpp: Any
    ep: Any
    etp: Any
    sp: Any
    mbs: Any
    m: Any

    @classmethod
    def of(cls, r: Any) -> "Mesh":
        """A resolved plan's (:class:`~moe_hydra.core.resolved.Resolved`)."""
        lo, b = r.layout, r.batch
        return cls(lo.tp, lo.cp, lo.pp, lo.vpp or 1, lo.ep, lo.etp, lo.sp, b.micro_batch_size, b.micro_batches_per_step)


class _Scalars:
    """The operations on one layout's numbers."""

    maximum, minimum, not_ = staticmethod(max), staticmethod(min), staticmethod(operator.not_)

    @staticmethod
    def where(cond: bool, yes: Any, no: Any) -> Any:
        return yes if cond else no

    @staticmethod
    def and_(x: bool, y: bool) -> bool:
        return x and y

    @staticmethod
    def or_(x: bool, y: bool) -> bool:
        return x or y

    @staticmethod
    def each(fn: Any, *args: Any) -> Any:
        """``fn(*args)``: a function of a few small integers (and flags), called as it is."""
        return fn(*args)


SCALARS = _Scalars()


@functools.cache
def numpy_ops() -> Any:
    """The same operations on numpy columns."""
    import numpy as np

    class Columns:
        maximum, minimum, where = staticmethod(np.maximum), staticmethod(np.minimum), staticmethod(np.where)
        and_, or_, not_ = staticmethod(np.logical_and), staticmethod(np.logical_or), staticmethod(np.logical_not)

        @staticmethod
        def groups(*cols: Any) -> tuple[Any, Any]:
            """(the first row of each distinct row of the non-negative integer ``cols``, in the order of their values;
            each row's group): the columns as one integer per row (mixed radix); where those integers are few, each
            one's first row without sorting, else one sort (``np.unique``'s, which gives the same)."""
            n = len(cols[0])
            key, size = np.zeros(n, dtype=np.int64), 1
            for col in cols:
                top = int(col.max()) + 1 if n else 1
                if size > 2**62 // top:  # renumber before the key overflows
                    key = np.unique(key, return_inverse=True)[1].reshape(-1)
                    size = int(key.max()) + 1
                key, size = key * top + col, size * top
            if size <= max(4 * n, 1 << 16):
                first_at = np.full(size, n, dtype=np.int64)
                np.minimum.at(first_at, key, np.arange(n))
                present = first_at < n
                return first_at[present], (np.cumsum(present) - 1)[key]
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            return first, inverse.reshape(-1)

        @classmethod
        def each(cls, fn: Any, *args: Any) -> Any:
            """``fn`` of each row of the integer columns among ``args`` (the rest passed as they are), called once
            per distinct row with Python ints (``fn``'s own caches are the scalar path's)."""
            cols = [i for i, x in enumerate(args) if isinstance(x, np.ndarray)]
            first, inverse = cls.groups(*(args[i] for i in cols))
            out = []
            for row in first.tolist():
                call = list(args)
                for i in cols:
                    call[i] = int(args[i][row])
                out.append(fn(*call))
            return np.array(out, dtype=float)[inverse]

    return Columns()
