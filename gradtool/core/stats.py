"""Per-tensor statistics in one chunked pass, accumulated in float64.

Definitions (x = the tensor, n = its element count):

* ``norm``: ‖x‖_p for the requested norm type (p = 2 by default; see :mod:`gradtool.core.norms`);
  ``l2_norm`` is always ‖x‖₂. NaN if x holds NaN, else inf if it holds ±inf.
* ``avg_norm``: TF's average norm ‖x‖₂ / n (not the RMS ‖x‖₂/√n).
* ``max_abs``, ``min``, ``max``: over the non-NaN elements (so ±inf show up here).
* ``mean``, ``std``: over the finite elements only (population std, Chan's pairwise combination of
  per-chunk two-pass moments, so no catastrophic cancellation).
* ``nan_count``, ``inf_count``, ``zero_count``: element counts.

For an empty tensor (n = 0) the norms are 0 and every other statistic is None.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any

from ..backend import dtype_name, is_floating, namespace_of
from .norms import _flat_chunks, l2_norm, parse_norm_type, tensor_norm


@dataclass(frozen=True)
class TensorStats:
    shape: tuple[int, ...]
    dtype: str
    size: int
    is_float: bool
    norm_type: float
    norm: float
    l2_norm: float
    avg_norm: float | None
    max_abs: float | None
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan_count: int
    inf_count: int
    zero_count: int

    @property
    def nonfinite_count(self) -> int:
        return self.nan_count + self.inf_count

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _moments(c64: Any, xp: ModuleType) -> tuple[int, float, float]:
    """(count, mean, M2) of the finite elements of a float64 chunk."""
    finite = xp.isfinite(c64)
    count = int(xp.sum(xp.astype(finite, xp.int64)))
    if count == 0:
        return 0, 0.0, 0.0
    vals = xp.where(finite, c64, xp.zeros_like(c64))
    mean = float(xp.sum(vals)) / count
    dev = xp.where(finite, c64 - mean, xp.zeros_like(c64))
    return count, mean, float(xp.sum(dev * dev))


def _combine(a: tuple[int, float, float], b: tuple[int, float, float]) -> tuple[int, float, float]:
    """Chan et al.'s parallel combination of (count, mean, M2)."""
    na, ma, m2a = a
    nb, mb, m2b = b
    n = na + nb
    if n == 0:
        return 0, 0.0, 0.0
    delta = mb - ma
    return n, ma + delta * nb / n, m2a + m2b + delta * delta * na * nb / n


def tensor_stats(x: Any, /, norm_type: float | int | str = 2, *, xp: ModuleType | None = None) -> TensorStats:
    """Statistics of one tensor (see module doc for exact definitions). Works for ints and bools too."""
    xp = namespace_of(x, xp=xp)
    p = parse_norm_type(norm_type)
    size = math.prod(x.shape)
    shape = tuple(int(d) for d in x.shape)
    floating = is_floating(x)
    name = dtype_name(x.dtype)
    if size == 0:
        return TensorStats(shape, name, 0, floating, p, 0.0, 0.0, None, None, None, None, None, None, 0, 0, 0)
    src = x if floating or x.dtype != xp.bool else xp.astype(x, xp.int8)
    l2 = l2_norm(src, xp=xp)
    norm = l2 if p == 2.0 else tensor_norm(src, p, xp=xp)
    nan_count = inf_count = zero_count = 0
    lo, hi, amax = math.inf, -math.inf, 0.0
    moments = (0, 0.0, 0.0)
    for c in _flat_chunks(src, xp):
        c64 = xp.astype(c, xp.float64)
        isnan = xp.isnan(c64)
        nan_count += int(xp.sum(xp.astype(isnan, xp.int64)))
        inf_count += int(xp.sum(xp.astype(xp.isinf(c64), xp.int64)))
        zero_count += int(xp.sum(xp.astype(c64 == 0, xp.int64)))
        notnan = xp.where(isnan, xp.zeros_like(c64), c64)
        if not bool(xp.all(isnan)):
            lo = min(lo, float(xp.min(xp.where(isnan, xp.full_like(c64, math.inf), c64))))
            hi = max(hi, float(xp.max(xp.where(isnan, xp.full_like(c64, -math.inf), c64))))
            amax = max(amax, float(xp.max(xp.abs(notnan))))
        moments = _combine(moments, _moments(c64, xp))
    all_nan = nan_count == size
    count, mean, m2 = moments
    return TensorStats(
        shape=shape, dtype=name, size=size, is_float=floating, norm_type=p, norm=norm, l2_norm=l2,
        avg_norm=l2 / size,
        max_abs=None if all_nan else amax,
        min=None if all_nan else lo,
        max=None if all_nan else hi,
        mean=mean if count else None,
        std=math.sqrt(m2 / count) if count else None,
        nan_count=nan_count, inf_count=inf_count, zero_count=zero_count,
    )
