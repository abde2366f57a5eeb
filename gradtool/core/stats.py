"""Per-tensor statistics, streamed chunk by chunk and accumulated in float64.

Definitions (x = the tensor, n = its element count):

* ``norm``: ‖x‖_p for the requested norm type (p = 2 by default; see :mod:`gradtool.core.norms`);
  ``l2_norm`` is always ‖x‖₂. NaN if x holds NaN, else inf if it holds ±inf.
* ``avg_norm``: TF's average norm ‖x‖₂ / n (not the RMS ‖x‖₂/√n).
* ``max_abs``, ``min``, ``max``: over the non-NaN elements (so ±inf show up here).
* ``mean``, ``std``: over the finite elements only (population std; per-chunk moments combined with
  Chan et al.'s pairwise formula, so there is no catastrophic cancellation across chunks). A float64
  chunk whose max |x| lies outside [1e-100, 1e100] has its moments taken on x/s, s a power of two near
  max |x|, so squared deviations neither overflow (|x| up to float64's limit) nor underflow (|x| down
  to its subnormals): mean and std stay accurate there too.
* ``nan_count``, ``inf_count``, ``zero_count``: element counts.
* A complex tensor: every statistic of its moduli |z| (NaN where a part is NaN, inf where a part is
  ±inf), except ``min``, ``max``, ``mean`` and ``std``, which are None.

For an empty tensor (n = 0) the norms are 0 and every other statistic is None.

:class:`StatsAccumulator` takes the elements in chunks (in any order: every statistic is order-free), so
a reader can stream a tensor from disk through a small reused buffer and memory stays bounded whatever
the tensor's size. :func:`tensor_stats` feeds it an in-memory array; both are one code path.

NumPy fast path, for a chunk with no NaN/Inf: sums of squares by row-blocked float32 ``vecdot`` summed in
float64 (as in :mod:`gradtool.core.norms`); min, max, Σx and the zero count in one pass of the optional
compiled kernel (``_kernels.c``; else four NumPy passes), Σx as float32 partial sums added in float64;
float16/bfloat16 chunks are widened to float32 first. Sums of
squares go to a :class:`~gradtool.core.norms.NormAccumulator`, so they can neither overflow nor underflow.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

import numpy as np

from ..backend import (dtype_name, is_complex_dtype, is_floating, is_floating_dtype, is_numpy_namespace,
                       namespace_of)
from . import kernels
from .kernels import half_kind
from .norms import (CHUNK_ELEMENTS, ROW, NormAccumulator, as_float64, chunk_sum_sq_fast, flat_chunks,
                    parse_norm_type)

STREAM_CHUNK = CHUNK_ELEMENTS  # 1 MiB of float32 stays in L2 cache for the several passes
_ONES = np.ones(ROW, np.float32)

COMPILED_KERNELS = kernels.BUILT


def f32_summary_numpy(c: np.ndarray) -> tuple[float, float, float, float, int] | None:
    """(min, max, Σx, Σx², #zeros) of a contiguous float32 chunk in five NumPy passes; None when it holds
    NaN or ±inf (or values so near float32's limit that a float32 partial sum overflows). Σx: a float32
    matrix-vector product per row of ROW elements, rows summed in float64; Σx²: :func:`chunk_sum_sq_fast`."""
    lo, hi = float(c.min()), float(c.max())
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    n = c.shape[0]
    full = (n // ROW) * ROW
    with np.errstate(over="ignore", invalid="ignore"):
        s1 = float((c[:full].reshape(-1, ROW) @ _ONES).sum(dtype=np.float64)) if full else 0.0
        s2 = chunk_sum_sq_fast(c)
    if full < n:
        s1 += float(c[full:].astype(np.float64).sum())
    if not (math.isfinite(s1) and math.isfinite(s2)):
        return None  # float32 partial sums overflowed (|x| near float32's limit): the exact path
    return lo, hi, s1, s2, int(np.count_nonzero(c == 0))


def f32_summary(c: np.ndarray) -> tuple[float, float, float, float, int] | None:
    """(min, max, Σx, Σx², #zeros) of a contiguous float32 chunk, or None when it holds NaN or ±inf: the
    compiled kernel's one pass when it was built (float32 partial sums of 32 elements per SIMD lane, added
    in float64; a chunk under ROW elements summed in float64 outright, as NumPy's passes sum it), else
    :func:`f32_summary_numpy`. Σx² is the same bits as :func:`gradtool.core.norms.chunk_sum_sq` gives for
    the chunk, so streamed statistics and ``tensor_norm`` agree exactly. Both paths are tested against a
    float64 reference."""
    kernel = kernels.compiled_f32_summary
    if kernel is None:
        return f32_summary_numpy(c)
    lo, hi, s1, s2, zeros = kernel(c)
    if not (math.isfinite(s1) and math.isfinite(s2) and math.isfinite(lo) and math.isfinite(hi)):
        return None  # a NaN makes the sums NaN; an infinity (or a float32 partial sum overflowing) infinite
    return lo, hi, s1, s2, zeros


@dataclass(frozen=True, slots=True, weakref_slot=True)
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
        """The fields as a dict (shallow: every value is immutable; dataclasses.asdict deep-copies, which
        was a tenth of a second for an 8-step history's JSON)."""
        return {name: getattr(self, name) for name in _TENSOR_STATS_FIELDS}


_TENSOR_STATS_FIELDS = tuple(f.name for f in fields(TensorStats))
_SCRATCH = threading.local()  # each thread's buffers for StatsAccumulator._numpy_chunk


def _scratch(role: str, n: int, dtype: Any) -> np.ndarray:
    """This thread's buffer of ``n`` elements of ``dtype`` for ``role``, reused (grown when too small): a
    new array of a chunk's size a pass is fresh pages of memory, each faulted in (a chunk with NaN took
    2.2 ms, its passes ~1)."""
    buf = getattr(_SCRATCH, role, None)
    if buf is None or buf.size < n:
        buf = np.empty(n, dtype)
        setattr(_SCRATCH, role, buf)
    return buf[:n]


Moments = tuple[int, float, float, float]  # (count, m, m2, s): mean = m · s, M2 = Σ(x − mean)² = m2 · s²
NO_MOMENTS: Moments = (0, 0.0, 0.0, 1.0)
UNSCALED_MOMENTS_RANGE = 1e100  # max |x| within [1/this, this]: (x − mean)² cannot overflow or underflow


def chunk_moments(fin: Any, count: int, amax: float, xp: ModuleType, finite: Any = None,
                  out: np.ndarray | None = None) -> Moments:
    """(count, m, m2, s) of a float64 chunk's ``count`` finite elements (``fin``: the chunk with zeros
    where ``finite`` is False; all finite when it is None), amax = their max |x|. s = 1 when amax is
    within [1e-100, 1e100]: m = mean = Σx / count, m2 = Σ(x − mean)². Otherwise s = 2^(e−1) for amax =
    f·2^e (f in [0.5, 1)), and the same formulas run on x/s (exact: s is a power of two): mean = m·s and
    M2 = m2·s² are kept without overflowing or underflowing (nor rounding to subnormals until the end).
    ``out``: a NumPy float64 buffer of fin's size for the deviations and their squares (else new arrays;
    NumPy's own namespace then takes m2 by ``np.dot``)."""
    s = 1.0
    if amax > UNSCALED_MOMENTS_RANGE or 0.0 < amax < 1.0 / UNSCALED_MOMENTS_RANGE:
        s = math.ldexp(1.0, math.frexp(amax)[1] - 1)
        fin = fin / s
    mean = float(xp.sum(fin)) / count
    if out is not None:  # in place, m2 summed as the Array API path below sums it (the same bits)
        dev = np.subtract(fin, mean, out=out)
        if finite is not None:
            np.copyto(dev, 0.0, where=~finite)
        return count, mean, float(np.sum(np.multiply(dev, dev, out=dev))), s
    dev = fin - mean
    if finite is not None:
        dev = xp.where(finite, dev, xp.zeros_like(dev))
    m2 = float(np.dot(dev, dev)) if xp is np else float(xp.sum(dev * dev))
    return count, mean, m2, s


def _combine(a: Moments, b: Moments) -> Moments:
    """Chan et al.'s parallel combination of (count, m, m2, s), mean = m·s, M2 = m2·s²:
    n = na + nb, δ = mb − ma, mean = ma + δ·nb/n, M2 = M2a + M2b + δ²·na·nb/n. Unscaled (s = 1) on both
    sides, exactly that arithmetic; otherwise computed in units of the larger scale of the two sides that
    hold anything (a side of zeros has none), so neither δ² nor the M2s overflow or underflow."""
    na, ma, m2a, sa = a
    nb, mb, m2b, sb = b
    n = na + nb
    if n == 0:
        return NO_MOMENTS
    if na == 0:
        return b
    if nb == 0:
        return a
    if sa == sb == 1.0:
        delta = mb - ma
        return n, ma + delta * nb / n, m2a + m2b + delta * delta * na * nb / n, 1.0
    s = max(sa if (m2a or ma) else 0.0, sb if (m2b or mb) else 0.0) or 1.0
    ma = ma * (sa / s) if ma else 0.0  # in units of s (a power-of-two ratio: exact unless negligible)
    mb = mb * (sb / s) if mb else 0.0
    delta = mb - ma
    m2 = delta * delta * na * nb / n
    if m2a:
        m2 += m2a * (sa / s) ** 2
    if m2b:
        m2 += m2b * (sb / s) ** 2
    return n, ma + delta * nb / n, m2, s


class StatsAccumulator:
    """Streaming statistics of one tensor: ``update`` with 1-D chunks, then ``result``."""

    def __init__(self, norm_type: float | int | str = 2, *, xp: ModuleType | None = None):
        self.p = parse_norm_type(norm_type)
        self.xp = xp
        self.n = 0
        self.sumsq = NormAccumulator(2)  # the L2 norm of the finite elements, overflow-safe
        self.l1: list[float] = []
        self.nan = self.inf = self.zeros = 0
        self.pos_inf = self.neg_inf = False
        self.lo, self.hi, self.amax = math.inf, -math.inf, 0.0
        self.moments = NO_MOMENTS
        self.moduli = False  # complex elements: taken as their moduli |z|, so no min, max, mean or std

    # --------------------------------------------------------------------------------- chunk kernels
    def update(self, chunk: Any) -> None:
        size = int(chunk.shape[0])
        if size == 0:
            return
        self.n += size
        xp = namespace_of(chunk, xp=self.xp) if not isinstance(chunk, np.ndarray) else None
        if xp is None and self._numpy_fast(chunk):
            return
        self._generic(chunk, xp or namespace_of(chunk))

    def _numpy_fast(self, c: np.ndarray) -> bool:
        """The common case in one set of cache-resident passes; False sends the chunk to the exact path."""
        if not is_floating_dtype(c.dtype):
            if c.dtype.kind == "c":
                return False  # complex: the exact path takes the moduli
            c = c.astype(np.float64)  # ints and bools: exact in float64 up to 2^53
        if c.dtype == np.float64:
            return self._numpy_float64(c)
        if c.dtype.itemsize > 4:
            return False
        if c.dtype != np.float32 or not c.flags.c_contiguous:
            c = np.ascontiguousarray(c, dtype=np.float32)
        return self._accept(c.shape[0], f32_summary(c), lambda: c)

    def update_window(self, window: np.ndarray, chunk_elements: int = STREAM_CHUNK) -> None:
        """``update`` with every ``chunk_elements`` slice of a 1-D window, in order: the same result, but a
        float32, float16 or bfloat16 window's chunks are summarised by one call of the compiled kernel (no
        GIL held; half precision widened to float32 there), so two threads summarising two windows use
        two cores."""
        n = window.shape[0]
        summaries = None
        if type(window) is np.ndarray and window.flags.c_contiguous:
            if window.dtype == np.float32 and kernels.compiled_f32_summaries is not None:
                summaries = kernels.compiled_f32_summaries(window, chunk_elements)
            elif (kind := half_kind(window.dtype)) is not None and kernels.compiled_half_summaries is not None:
                # float16/bfloat16: widened to float32 inside the call, as _numpy_fast widens them
                summaries = kernels.compiled_half_summaries(window.view(np.uint16), chunk_elements, kind)
        if summaries is None:
            for start in range(0, n, chunk_elements):
                self.update(window[start:start + chunk_elements])
            return
        self.update_summaries(summaries, chunk_elements, n,
                              lambda i: window[i * chunk_elements:(i + 1) * chunk_elements])

    def update_summaries(self, summaries: Sequence[tuple[float, float, float, float, int]], chunk_elements: int,
                         total: int, chunk_at: Callable[[int], np.ndarray]) -> None:
        """``update`` with ``total`` float32 elements in chunks of ``chunk_elements`` whose compiled-kernel
        summaries are given; ``chunk_at(i)`` fetches chunk i's data when it is needed after all (a
        non-finite or extreme chunk, a mean that dominates, every chunk for the L1 norm). The same result as
        ``update`` chunk by chunk (the kernel sums a chunk under ROW elements in float64, as ``update``
        does)."""
        for i, summary in enumerate(summaries):
            size = min(chunk_elements, total - i * chunk_elements)
            if self.p == 1.0:  # L1 needs the data
                self.update(chunk_at(i))
                continue
            self.n += size
            lo, hi, s1, s2 = summary[:4]
            finite = math.isfinite(s1) and math.isfinite(s2) and math.isfinite(lo) and math.isfinite(hi)
            if not self._accept(size, summary if finite else None, lambda i=i: chunk_at(i)):
                c = chunk_at(i)
                self._generic(c, namespace_of(c))

    def _accept(self, n: int, summary: tuple[float, float, float, float, int] | None,
                chunk: Callable[[], np.ndarray]) -> bool:
        """Take the (min, max, Σx, Σx², #zeros) of a float32 chunk of n elements; False sends it to the exact
        path. ``chunk()`` gives its data, read only in the rare cases that need it. The sum of squares is
        taken by :class:`NormAccumulator`'s rule, so that a norm has the bits ``tensor_norm`` (and
        ``clip``'s serial pass) gives it: Σx² as the kernel took it unless it is under 1e-25 (and the
        chunk not all zeros), then in float64; the rest (extremes, moments) goes to the exact path when
        max |x| is over 1e18 or under 1e-18 (float32 squares overflow or lose their digits there)."""
        if summary is None:
            return False  # NaN or ±inf somewhere
        lo, hi, s1, s2, zeros = summary  # s2: the same bits as tensor_norm's chunk_sum_sq
        amax = max(-lo, hi)
        if amax > 1e18 or (0.0 < amax < 1e-18):  # float32 squares would overflow or underflow: exact path
            with np.errstate(over="ignore", invalid="ignore", under="ignore"):
                self._generic_chunk(chunk(), np, sumsq=False)
            self._add_sum_sq(s2, lo, hi, chunk)
            return True
        self._add_sum_sq(s2, lo, hi, chunk)
        self.zeros += zeros
        self.lo, self.hi, self.amax = min(self.lo, lo), max(self.hi, hi), max(self.amax, amax)
        mean = s1 / n
        m2 = s2 - n * mean * mean
        if not m2 > 1e-3 * s2:  # mean dominates: recentre exactly instead of cancelling
            d = chunk().astype(np.float64) - mean
            m2 = float(np.dot(d, d))
        self.moments = _combine(self.moments, (n, mean, max(m2, 0.0), 1.0))
        if self.p == 1.0:
            self.l1.append(float(np.abs(chunk()).sum(dtype=np.float64)))
        return True

    def _add_sum_sq(self, s2: float, lo: float, hi: float, chunk: Callable[[], np.ndarray]) -> None:
        """A finite float32 chunk's part of the norm, as ``NormAccumulator.update`` takes it (see
        :meth:`_accept`)."""
        if s2 > 1e-25 or lo == hi == 0.0:
            self.sumsq.parts.append((1.0, s2))
        else:
            self.sumsq._exact(chunk(), np)

    def _numpy_float64(self, c: np.ndarray) -> bool:
        lo, hi = float(c.min()), float(c.max())
        amax = max(-lo, hi)
        if not (math.isfinite(lo) and math.isfinite(hi)) or amax > 1e150 or 0.0 < amax < 1e-150:
            return False
        s2 = float(np.dot(c, c))
        self.sumsq.parts.append((1.0, s2))
        self.zeros += int(np.count_nonzero(c == 0))
        self.lo, self.hi, self.amax = min(self.lo, lo), max(self.hi, hi), max(self.amax, amax)
        self.moments = _combine(self.moments, chunk_moments(c, c.shape[0], amax, np))
        if self.p == 1.0:
            self.l1.append(float(np.abs(c).sum()))
        return True

    def _generic(self, c: Any, xp: ModuleType) -> None:
        """Any namespace, any dtype, NaN/Inf included: float64 per chunk, rescaled sums of squares and
        moments (see :func:`chunk_moments`)."""
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            self._generic_chunk(c, xp)

    def _generic_chunk(self, c: Any, xp: ModuleType, sumsq: bool = True) -> None:
        """(``sumsq`` False: the chunk's part of the norm is the caller's to add.)"""
        self.moduli |= is_complex_dtype(c.dtype, xp)
        if type(c) is np.ndarray and not self.moduli:  # (into this thread's buffer: no new pages a chunk)
            c64 = _scratch("c64", c.size, np.float64)
            np.copyto(c64, c.reshape(-1), casting="unsafe")  # (astype's values)
            self._numpy_chunk(c64, sumsq)
            return
        c64 = as_float64(c, xp)  # complex: the moduli, NaN where a part is NaN
        if type(c64) is np.ndarray:
            self._numpy_chunk(c64.reshape(-1), sumsq)
            return
        isnan = xp.isnan(c64)
        isinf = xp.isinf(c64)
        finite = ~(isnan | isinf)
        self.nan += int(xp.sum(xp.astype(isnan, xp.int64)))
        n_inf = int(xp.sum(xp.astype(isinf, xp.int64)))
        self.inf += n_inf
        if n_inf:
            self.pos_inf |= bool(xp.any(isinf & (c64 > 0)))
            self.neg_inf |= bool(xp.any(isinf & (c64 < 0)))
        self.zeros += int(xp.sum(xp.astype(c64 == 0, xp.int64)))
        zero = xp.zeros_like(c64)
        fin = xp.where(finite, c64, zero)
        count = int(xp.sum(xp.astype(finite, xp.int64)))
        if count:
            self.lo = min(self.lo, float(xp.min(xp.where(finite, c64, xp.full_like(c64, math.inf)))))
            self.hi = max(self.hi, float(xp.max(xp.where(finite, c64, xp.full_like(c64, -math.inf)))))
            amax = float(xp.max(xp.abs(fin)))
            self.amax = max(self.amax, amax)
            if sumsq:
                self.sumsq._exact(fin, xp)
            self.moments = _combine(self.moments, chunk_moments(fin, count, amax, xp, finite))
            if self.p == 1.0:
                self.l1.append(float(xp.sum(xp.abs(fin))))

    def _numpy_chunk(self, c64: np.ndarray, sumsq: bool) -> None:
        """:meth:`_generic_chunk` of a NumPy float64 chunk (a copy of the chunk: changed here), with the same
        results in fewer passes: the counts
        by ``count_nonzero``, NaN told from ±inf only where ``isfinite`` finds either, the finite extremes
        by reductions ``where`` they are finite, max |x| from them; and a chunk with NaN or ±inf has no
        squares (nor L1 part) summed, which the tensor's norms are NaN or inf without (:meth:`l2`,
        :meth:`norm`). Such chunks are every chunk of a step whose training went NaN: ~1.8 ms each of
        2^18 elements, the GPT-2 set with a NaN in each tensor read in-process in 0.34 s against 0.07 s."""
        n = c64.shape[0]
        finite = np.isfinite(c64, out=_scratch("finite", n, np.bool_))
        count = int(np.count_nonzero(finite))
        odd = n - count
        mask = _scratch("mask", n, np.bool_)
        if odd:
            isnan = np.isnan(c64, out=_scratch("isnan", n, np.bool_))
            n_nan = int(np.count_nonzero(isnan))
            self.nan += n_nan
            if odd > n_nan:
                self.inf += odd - n_nan
                isinf = ~(finite | isnan)
                self.pos_inf |= bool(np.any(isinf & (c64 > 0)))
                self.neg_inf |= bool(np.any(isinf & (c64 < 0)))
        self.zeros += int(np.count_nonzero(np.equal(c64, 0, out=mask)))
        if not count:
            return
        if odd:
            lo = float(np.min(c64, where=finite, initial=math.inf))
            hi = float(np.max(c64, where=finite, initial=-math.inf))
            np.copyto(c64, 0.0, where=np.logical_not(finite, out=mask))
            fin = c64
        else:
            fin, lo, hi = c64, float(np.min(c64)), float(np.max(c64))
        amax = max(abs(lo), abs(hi))
        self.lo, self.hi, self.amax = min(self.lo, lo), max(self.hi, hi), max(self.amax, amax)
        if sumsq and not odd:
            self.sumsq._exact(fin, np)
        self.moments = _combine(self.moments, chunk_moments(fin, count, amax, np, finite if odd else None,
                                                            _scratch("dev", n, np.float64)))
        if self.p == 1.0 and not odd:
            self.l1.append(float(np.sum(np.abs(fin))))

    def merge(self, other: StatsAccumulator) -> None:
        """Add another accumulator's elements (another shard of the tensor, or a worker's partial result).
        Counts, extremes and sums of squares merge exactly; mean and variance with Chan's formula."""
        self.n += other.n
        self.sumsq.merge(other.sumsq)
        self.l1.extend(other.l1)
        self.nan += other.nan
        self.inf += other.inf
        self.zeros += other.zeros
        self.moduli |= other.moduli
        self.pos_inf |= other.pos_inf
        self.neg_inf |= other.neg_inf
        self.lo, self.hi, self.amax = min(self.lo, other.lo), max(self.hi, other.hi), max(self.amax, other.amax)
        self.moments = _combine(self.moments, other.moments)

    # ---------------------------------------------------------------------------------------- result
    def l2(self) -> float:
        if self.nan:
            return math.nan
        if self.inf:
            return math.inf
        return self.sumsq.result()

    def norm(self, l2: float) -> float:
        if self.p == 2.0:
            return l2
        if self.nan:
            return math.nan
        if self.inf:
            return math.inf
        return math.fsum(self.l1) if self.p == 1.0 else self.amax

    def result(self, shape: tuple[int, ...], dtype: str, floating: bool) -> TensorStats:
        if self.n == 0:
            return TensorStats(shape, dtype, 0, floating, self.p, 0.0, 0.0, None, None, None, None, None, None, 0, 0, 0)
        l2 = self.l2()
        all_nan = self.nan == self.n
        count, mean, m2, scale = self.moments
        lo = -math.inf if self.neg_inf else self.lo
        hi = math.inf if self.pos_inf else self.hi
        amax = math.inf if (self.pos_inf or self.neg_inf) else self.amax
        signed = not all_nan and not self.moduli  # min, max, mean and std: not of complex values' moduli
        return TensorStats(
            shape=shape, dtype=dtype, size=self.n, is_float=floating, norm_type=self.p, norm=self.norm(l2),
            l2_norm=l2, avg_norm=l2 / self.n,
            max_abs=None if all_nan else amax,
            min=lo if signed else None,
            max=hi if signed else None,
            mean=mean * scale if count and signed else None,
            std=scale * math.sqrt(m2 / count) if count and signed else None,
            nan_count=self.nan, inf_count=self.inf, zero_count=self.zeros,
        )


def one_chunk_stats(summaries: np.ndarray, sizes: Sequence[int], shapes: Sequence[tuple[int, ...]],
                    dtypes: Sequence[str], norm_type: float = 2.0) -> list[TensorStats | None]:
    """The :class:`TensorStats` of float tensors of 1 to STREAM_CHUNK elements (float32, or float16/bfloat16
    widened) from their one-chunk kernel summaries, rows of (min, max, Σx, Σx², #zeros): with
    amax = max(−min, max), n the size, mean = Σx/n and m2 = Σx² − n·mean·mean, norm = √Σx² (amax for
    the max norm), avg_norm = norm/n, std = √(m2/n): the arithmetic :class:`StatsAccumulator` does for one
    chunk, done for all rows at once, so the same bits. None for a row that its summary alone does not
    decide (the accumulator reads the data there): NaN or ±inf, max |x| above 1e18 or below 1e-18 (float32
    squares overflow or underflow), a mean that dominates (m2 ≤ 1e-3·Σx², recentred exactly), the L1
    norm."""
    lo, hi, s1, s2, zeros = summaries.T
    n = np.asarray(sizes, np.float64)
    with np.errstate(all="ignore"):
        amax = np.maximum(-lo, hi)
        mean = s1 / n
        m2 = s2 - n * mean * mean
        ok = (np.isfinite(lo) & np.isfinite(hi) & np.isfinite(s1) & np.isfinite(s2) & (amax <= 1e18)
              & ~((amax > 0.0) & (amax < 1e-18)) & (m2 > 1e-3 * s2))
        l2 = np.sqrt(s2)
        std = np.sqrt(m2 / n)
        zero_counts = np.where(ok, zeros, 0).astype(np.int64)
    p = parse_norm_type(norm_type)
    if p == 1.0:
        return [None] * len(sizes)
    l2s = l2.tolist()  # (the L2 norm and the norm one float object each where they are the same: 20,000
    # tensors' statistics held 0.5 MB less)
    rows = zip(ok.tolist(), sizes, shapes, dtypes, l2s, amax.tolist() if p == math.inf else l2s,
               (l2 / n).tolist(), amax.tolist(), lo.tolist(), hi.tolist(), mean.tolist(), std.tolist(),
               zero_counts.tolist())
    return [TensorStats(shape, dtype, size, True, p, norm, l2n, avg, am, mn, mx, mu, sd, 0, 0, z) if good
            else None for good, size, shape, dtype, l2n, norm, avg, am, mn, mx, mu, sd, z in rows]


def tensor_stats(x: Any, /, norm_type: float | int | str = 2, *, xp: ModuleType | None = None) -> TensorStats:
    """Statistics of one in-memory tensor (see module doc for the exact definitions). Ints and bools too."""
    xp = namespace_of(x, xp=xp)
    floating = is_floating(x)
    name = dtype_name(x.dtype)  # a bool tensor is reported as bool, though summed as int8
    if not floating and x.dtype == xp.bool:
        x = xp.astype(x, xp.int8)
    acc = StatsAccumulator(norm_type, xp=None if is_numpy_namespace(xp) else xp)
    on_host = type(x) is np.ndarray  # (another namespace's dtype is not compared with NumPy's)
    if on_host and x.flags.c_contiguous and kernels.kernel_kind(x.dtype) is not None:
        acc.update_window(x.reshape(-1), STREAM_CHUNK)  # the same chunks, one kernel call for all of them
    else:
        for c in flat_chunks(x, xp, STREAM_CHUNK):
            acc.update(c)
    return acc.result(tuple(int(d) for d in x.shape), name, floating)
