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
from typing import Any


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
    def each(fn: Any, *args: Any) -> Any:
        """``fn(*args)``: a function of a few small numbers (and a flag), called as it is."""
        return fn(*args)


SCALARS = _Scalars()


@functools.cache
def numpy_ops() -> Any:
    """The same operations on numpy columns. ``each(fn, *columns, flag)`` calls ``fn`` once per distinct row of the
    integer columns (as Python ints, so ``fn``'s own caches are shared with the scalar path) and spreads the results
    back over the rows."""
    import numpy as np

    class Columns:
        maximum, minimum, where = staticmethod(np.maximum), staticmethod(np.minimum), staticmethod(np.where)
        and_, not_ = staticmethod(np.logical_and), staticmethod(np.logical_not)

        @staticmethod
        def groups(*cols: Any) -> tuple[Any, Any]:
            """(the first row of each distinct row of the integer ``cols``, each row's group): each column as the
            index of its value among its values, the columns then one integer per row (sorting a 1-D key, not
            rows)."""
            key = np.zeros(len(cols[0]), dtype=np.int64)
            for col in cols:
                values, index = np.unique(col, return_inverse=True)
                key = key * len(values) + index.reshape(-1)
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            return first, inverse.reshape(-1)

        @classmethod
        def each(cls, fn: Any, *args: Any) -> Any:
            *cols, flag = args
            first, inverse = cls.groups(*cols)
            return np.array([fn(*(int(c[i]) for c in cols), flag) for i in first.tolist()], dtype=float)[inverse]

    return Columns()
