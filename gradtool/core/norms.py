"""Accurate tensor norms for every float dtype, on any Array API namespace.

All norms are returned as Python floats (float64). Sums of squares are accumulated in float64 per chunk of
``CHUNK_ELEMENTS`` elements, so float16/bfloat16 never overflow and billion-element float32 tensors keep
~1e-7 relative accuracy (a float32 ``np.dot`` loses up to 1e-3 there). Squares that would overflow or
underflow even float64 (|x| > ~1e154 or < ~1e-154, float64 inputs only) are handled by rescaling with
max|x|. A tensor holding NaN has norm NaN; one holding ±inf (and no NaN) has norm inf; a norm of finite
elements that exceeds float64's range (~1.8e308) is inf, as IEEE overflow gives, never NaN. A complex
tensor's norms are those of its moduli |z|.

Fast path for NumPy float32 (and float16/bfloat16 widened to float32) chunks: the optional compiled kernel
(:mod:`.kernels`; float32 partial sums of 32 elements per SIMD lane, added in float64, ~30 GB/s, ~1e-9
relative error), else ``np.vecdot`` over rows of ``ROW`` elements with the row sums added in float64
(~25 GB/s, ≤ 1e-7 relative error); a non-finite or tiny fast result is recomputed on the exact path.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ..backend import host_namespace, is_complex_dtype, is_floating, is_floating_dtype, namespace_of
from ..errors import UsageError
from . import kernels

CHUNK_ELEMENTS = 1 << 18  # 1 MiB of float32: the several passes over a chunk stay in L2 cache (measured best)
ROW = 4096
NORM_TYPES = (1.0, 2.0, math.inf)


def parse_norm_type(norm_type: float | int | str) -> float:
    """Validate a norm type: 1, 2 or inf (also given as the strings '1', '2', 'inf'). Returns a float."""
    try:
        value = float(norm_type)
    except (TypeError, ValueError):
        value = float("nan")
    if value not in NORM_TYPES:
        raise UsageError(f"norm_type must be 1, 2 or inf, not {norm_type!r}")
    return value


def flat_chunks(x: Any, xp: ModuleType, chunk: int = CHUNK_ELEMENTS) -> Iterable[Any]:
    flat = xp.reshape(x, (-1,))
    n = flat.shape[0]
    for start in range(0, n, chunk):
        yield flat[start : min(start + chunk, n)]


def bfloat16_bits_as_float32(bits: np.ndarray) -> np.ndarray:
    """The float32 values of bfloat16 ``bits`` (uint16), a new array: ``bits << 16`` as a float32's bits,
    exactly the values (a bfloat16 is the upper half of a float32; signs and NaN payloads kept), without
    ml_dtypes."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def as_float64(c: Any, xp: ModuleType) -> Any:
    """``c`` as float64; a complex ``c`` as its moduli |z| = hypot(Re z, Im z), taken in complex128 (no
    overflow), NaN where either part is NaN (as ``isnan`` of a complex says): the norms of a complex
    tensor are its moduli's, as ``torch.linalg.vector_norm`` defines them."""
    if is_complex_dtype(c.dtype, xp):
        z = xp.astype(c, xp.complex128)
        moduli = xp.abs(z)
        return xp.where(xp.isnan(z), xp.full_like(moduli, math.nan), moduli)
    return xp.astype(c, xp.float64)


def _size(x: Any) -> int:
    return math.prod(x.shape)


def chunk_sum_sq_fast(c: np.ndarray) -> float:
    """Σ c² of one float32 chunk: float32 ``vecdot`` per row of ROW elements, rows summed in float64; the
    tail (and so every tensor smaller than ROW) exactly in float64."""
    full = (c.shape[0] // ROW) * ROW
    total = 0.0
    if full:
        rows = c[:full].reshape(-1, ROW)
        total = float(np.vecdot(rows, rows).sum(dtype=np.float64))
    if full < c.shape[0]:
        tail = c[full:].astype(np.float64)
        total += float(np.dot(tail, tail))
    return total


def chunk_sum_sq(c: np.ndarray) -> float:
    """Σ c² of one contiguous float32 chunk: the compiled kernel's when it was built (float32 partial sums
    of 32 elements per SIMD lane, added in float64, ~1e-9 relative error; a chunk under ROW elements in
    float64 outright), else :func:`chunk_sum_sq_fast`. :mod:`.stats` takes Σx² from the same kernel call,
    so both agree."""
    kernel = kernels.compiled_f32_summary
    if kernel is None:
        return chunk_sum_sq_fast(c)
    return kernel(c)[3]


class NormAccumulator:
    """‖x‖_p of a tensor fed as 1-D chunks, in any order (so a tensor can be streamed from disk).

    Sums of squares are kept per chunk as (scale, Σ(x/scale)²) pairs and combined at the end with
    fsum, so they neither overflow nor underflow. NumPy float32/float16/bfloat16 chunks take the fast
    row kernel; a chunk whose fast sum is not finite or suspiciously small (float32 squares overflow
    above ~1.8e19 and lose precision below ~1e-19) is redone exactly in float64, unless the kernel saw
    only zeros (a tensor clipped to nothing in float16: three float64 passes a chunk were 40 % of
    ``clip``'s time).
    """

    def __init__(self, norm_type: float | int | str = 2):
        self.p = parse_norm_type(norm_type)
        self.parts: list[tuple[float, float]] = []
        self.l1: list[float] = []
        self.amax = 0.0
        self.nan = self.inf = False

    def update(self, c: Any, xp: ModuleType | None = None) -> None:
        if c.shape[0] == 0:
            return
        if self.p == 2.0 and type(c) is np.ndarray and c.dtype.itemsize <= 4 and is_floating_dtype(c.dtype):
            kind = kernels.half_kind(c.dtype)
            if kind is not None and kernels.compiled_half_summaries is not None and c.flags.c_contiguous:
                # float16/bfloat16 widened inside the kernel: chunk_sum_sq's bits, without NumPy's cast
                if self._half_sum_taken(c.view(np.uint16), kind):
                    return
            else:
                zero = False  # every element ±0, as the kernel's min and max say (0 is then exact)
                with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                    c32 = np.ascontiguousarray(c, dtype=np.float32)
                    if kernels.compiled_f32_summary is not None:
                        lo, hi, _, total, _ = kernels.compiled_f32_summary(c32)  # (chunk_sum_sq's call)
                        zero = lo == hi == 0.0
                    else:
                        total = chunk_sum_sq(c32)
                if self._sum_taken(total, zero):
                    return
        self._exact(c, xp or (_NUMPY_XP or _numpy_xp() if type(c) is np.ndarray else namespace_of(c)))

    def _sum_taken(self, total: float, zero: bool) -> bool:
        """Add a chunk's fast float32 Σx² ``total`` where it settles the chunk (finite, and above 1e-25, or
        every element ±0: exact then); False, nothing added, where the chunk needs :meth:`_exact`."""
        if math.isfinite(total) and (total > 1e-25 or zero):
            self.parts.append((1.0, total))
            return True
        return False

    def _half_sum_taken(self, bits: np.ndarray, kind: int) -> bool:
        """:meth:`_sum_taken` of the kernel's sums of float16 or bfloat16 ``bits`` (uint16, C order) as
        one chunk."""
        lo, hi, _, total, _ = kernels.compiled_half_summaries(bits, max(bits.size, 1), kind)[0]
        return self._sum_taken(total, lo == hi == 0.0)

    def update_bfloat16_bits(self, bits: np.ndarray) -> None:
        """:meth:`update` of the bfloat16 chunk whose bits (uint16, C order) these are, without a bfloat16
        dtype (ml_dtypes): the kernel's sums of the same bits; where they do not settle the chunk (or
        there is no kernel), its float32 values, ``bits << 16``, exactly its values (measured as the
        bfloat16 chunk is: tested)."""
        if bits.shape[0] == 0:
            return
        if (self.p == 2.0 and kernels.compiled_half_summaries is not None and bits.flags.c_contiguous
                and self._half_sum_taken(bits, kernels.HALF_BF16)):
            return
        self.update(bfloat16_bits_as_float32(bits))

    def update_sum_sq(self, total: Any, c: np.ndarray) -> None:
        """Add a chunk whose Σc² the caller already took from the compiled kernel (the arithmetic
        :meth:`update` would use): the same result as ``update(c)``, one pass fewer. ``total``: Σc² of a
        float32, float16 or bfloat16 chunk; (max |c|, Σc²) of a float64 one (``compiled_f64_scale``'s)."""
        if c.dtype == _F64 and self.p == 2.0:
            self._float64_sum_sq(c, total)
            return
        if self.takes_sum_sq(total):
            self.parts.append((1.0, total))
        else:
            self.update(c)

    def takes_sum_sq(self, total: float) -> bool:
        """Whether :meth:`update_sum_sq` of a float32, float16 or bfloat16 chunk adds ``total`` as it is
        (L2, finite, above 1e-25), not what :meth:`update` makes of the chunk's values."""
        return self.p == 2.0 and math.isfinite(total) and total > 1e-25

    def _exact(self, c: Any, xp: ModuleType) -> None:
        """The chunk's part in float64: a NumPy chunk's L2 part by :meth:`_float64_sum_sq` (float64 itself,
        or the float64 values of complex moduli, integers, float32 beyond the fast sum's range: one
        arithmetic for all), the others from a float64 copy."""
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            c64 = c if type(c) is np.ndarray and c.dtype == _F64 else as_float64(c, xp)
            if self.p == 2.0 and type(c64) is np.ndarray and c64.ndim == 1:
                self._float64_sum_sq(c64)
                return
            a = xp.abs(c64)
            m = float(xp.max(a))
            if not self._took_max(m):
                return
            if self.p == 1.0:
                self.l1.append(float(xp.sum(a)))
            elif self.p == 2.0 and m > 0:
                if 1e-150 < m < 1e150:
                    self.parts.append((1.0, float(xp.sum(c64 * c64))))
                else:
                    scaled = c64 / m
                    self.parts.append((m, float(xp.sum(scaled * scaled))))

    def _took_max(self, m: float) -> bool:
        """A chunk's max |x|: NaN or ±inf flagged (False: the chunk adds nothing more), else kept in the
        running max (True)."""
        if math.isnan(m):
            self.nan = True
            return False
        if math.isinf(m):
            self.inf = True
            return False
        self.amax = max(self.amax, m)
        return True

    def _float64_sum_sq(self, c: np.ndarray, measured: tuple[float, float] | None = None) -> None:
        """The L2 part of a NumPy float64 chunk: max |c| and, when it lies in (1e-150, 1e150) (no square
        overflows, none that matters underflows), Σc² as it is; else Σ(c/max)², rescaled. Both from the
        compiled ``f64_summary`` where built (one pass, a fixed order of eight running sums; ``measured``:
        what ``f64_scale`` gave for ``c``, the same bits), else from NumPy without :meth:`_exact`'s copies:
        max |c| as max(max c, -min c) (NaN when any is NaN), and Σc² summed by NumPy over c·c in a buffer
        kept by the thread (the same pairwise sum as ``c * c``'s). The rescaled sum is NumPy's either way.
        (The float64 copy, |c| and c·c were three new arrays a chunk, ~1 ms for 2 MiB: ``clip --mode
        global-norm`` of 420 MB of float64, two norm passes: 1.28 -> 0.38 s with the changed elements
        counted by ``count_nonzero``.)"""
        if c.size == 0:
            return
        kernel = kernels.compiled_f64_summary
        if measured is None and kernel is not None and c.flags.c_contiguous:
            measured = kernel(c)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            m = max(float(c.max()), -float(c.min())) if measured is None else measured[0]
            if not self._took_max(m) or not m > 0:
                return
            if 1e-150 < m < 1e150:
                self.parts.append((1.0, measured[1] if measured is not None else
                                   float(np.add.reduce(np.multiply(c, c, out=_float64_scratch(c.size))))))
            else:
                scaled = np.divide(c, m, out=_float64_scratch(c.size))
                self.parts.append((m, float(np.add.reduce(np.multiply(scaled, scaled, out=scaled)))))

    def merge(self, other: NormAccumulator) -> None:
        """Add another accumulator's elements (from another chunk, shard or machine). Exact: the partial
        sums are kept and added with fsum, so the result does not depend on the order of merging."""
        self.parts.extend(other.parts)
        self.l1.extend(other.l1)
        self.amax = max(self.amax, other.amax)
        self.nan |= other.nan
        self.inf |= other.inf

    def result(self) -> float:
        if self.nan:
            return math.nan
        if self.inf:
            return math.inf
        if self.p == 1.0:
            return math.fsum(self.l1)
        if self.p == math.inf:
            return self.amax
        parts = [(sc, q) for sc, q in self.parts if q > 0]
        if not parts:
            return 0.0
        if all(sc == 1.0 for sc, _ in parts):
            total = math.fsum(q for _, q in parts)
            if math.isfinite(total):
                return math.sqrt(total)
        big = max(sc * math.sqrt(q) for sc, q in parts)  # the largest chunk norm: nothing overflows
        if math.isinf(big):  # a chunk's own norm is beyond float64 (finite elements near its limit)
            return math.inf
        return big * math.sqrt(math.fsum(q * (sc / big) ** 2 for sc, q in parts))


_NUMPY_XP: ModuleType | None = None
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_SCRATCH = threading.local()  # each thread's float64 buffer for NormAccumulator._float64_sum_sq


def _float64_scratch(n: int) -> np.ndarray:
    """A float64 buffer of ``n`` elements, this thread's, reused (grown when too small)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.buf = np.empty(n, np.float64)
    return buf[:n]


class NormOfPieces:
    """The L2 norm of a host tensor handed over in pieces of any length (a stream cut at other places than
    ``chunk``-element boundaries), bit for bit :func:`tensor_norm` of the whole: the elements are
    accumulated over the same ``chunk``-element chunks (a chunk's Σx² is rounded once, so another cut could
    move the last bit). Whole chunks inside a piece are taken in place; a chunk split between pieces is
    gathered in a buffer of ``chunk`` elements. ``bfloat16_bits``: the pieces are bfloat16 values' bits
    (uint16, ``dtype``), measured by :meth:`NormAccumulator.update_bfloat16_bits`."""

    def __init__(self, dtype: Any, chunk: int = CHUNK_ELEMENTS, *, bfloat16_bits: bool = False):
        self._acc = NormAccumulator(2.0)
        self._chunk = chunk
        self._buf = np.empty(chunk, np.dtype(dtype).newbyteorder("="))
        self._held = 0
        self._update = self._acc.update_bfloat16_bits if bfloat16_bits else self._acc.update

    def add(self, piece: np.ndarray) -> None:
        flat, chunk = piece.reshape(-1), self._chunk
        while flat.shape[0]:
            if self._held == 0 and flat.shape[0] >= chunk:
                self._update(flat[:chunk])
                flat = flat[chunk:]
                continue
            k = min(chunk - self._held, flat.shape[0])
            self._buf[self._held: self._held + k] = flat[:k]
            self._held += k
            flat = flat[k:]
            if self._held == chunk:
                self._update(self._buf)
                self._held = 0

    def result(self) -> float:
        if self._held:
            self._update(self._buf[: self._held])
            self._held = 0
        return self._acc.result()


def _numpy_xp() -> ModuleType:
    global _NUMPY_XP
    _NUMPY_XP = host_namespace()
    return _NUMPY_XP


def _norm(x: Any, p: float, xp: ModuleType | None, threaded: bool = True) -> float:
    if xp is None and type(x) is np.ndarray:  # skip the namespace lookup: ~10 µs a call
        xp, chunk_xp = (_NUMPY_XP or _numpy_xp()), None
    else:
        xp = namespace_of(x, xp=xp)
        chunk_xp = xp
    if _size(x) == 0:
        return 0.0
    acc = NormAccumulator(p)
    start = 0
    if p == 2.0 and chunk_xp is None and x.dtype == _F32 and x.flags.c_contiguous and x.size >= 2 * CHUNK_ELEMENTS:
        if kernels.compiled_f32_summaries is not None:
            start = _whole_chunks_compiled(x.reshape(-1), acc, threaded)
        else:
            start = _whole_chunks_at_once(x.reshape(-1), acc)
    for c in flat_chunks(x.reshape(-1)[start:] if start else x, xp):
        acc.update(c, chunk_xp)
    return acc.result()


_POOL: Any = None


def _pool() -> Any:
    """Two worker threads for big in-memory tensors (created on first use, kept for the process)."""
    global _POOL
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(2, thread_name_prefix="gradtool-norm")
    return _POOL


def _in_pool() -> bool:
    """True on one of _pool's own threads, which must not wait on the pool (that could deadlock)."""
    import threading

    return threading.current_thread().name.startswith("gradtool-norm")


def _whole_chunks_compiled(flat: np.ndarray, acc: NormAccumulator, threaded: bool = True) -> int:
    """Every whole chunk of a big float32 tensor through the compiled kernel, in one GIL-free call per half
    of the tensor on two threads (so no Python runs per chunk and both cores read memory): the same chunk
    boundaries and the same per-chunk sums as chunk by chunk, so the same bits. A chunk whose sum is not
    finite, or is tiny, is redone by ``acc.update`` (the exact path). Returns the elements done."""
    kernel = kernels.compiled_f32_summaries
    chunks = flat.shape[0] // CHUNK_ELEMENTS
    whole = chunks * CHUNK_ELEMENTS
    if chunks >= 8 and threaded and not _in_pool():
        mid = (chunks // 2) * CHUNK_ELEMENTS
        halves = [flat[:mid], flat[mid:whole]]
        results = [r for part in _pool().map(lambda h: kernel(h, CHUNK_ELEMENTS), halves) for r in part]
    else:
        results = kernel(flat[:whole], CHUNK_ELEMENTS)
    for i, r in enumerate(results):
        total = r[3]
        if math.isfinite(total) and total > 1e-25:
            acc.parts.append((1.0, total))
        else:
            acc.update(flat[i * CHUNK_ELEMENTS:(i + 1) * CHUNK_ELEMENTS])
    return whole


def _whole_chunks_at_once(flat: np.ndarray, acc: NormAccumulator) -> int:
    """The chunk kernel's partial sums for every whole chunk of a big float32 tensor from one ``vecdot``
    over all its rows (one pass at memory speed, no per-chunk Python work): the same rows, and the same
    float64 sum over each chunk's rows, so the same bits as chunk by chunk. Returns how many elements
    were done (0 when a partial sum is not finite or is tiny: the per-chunk path then decides)."""
    whole = (flat.shape[0] // CHUNK_ELEMENTS) * CHUNK_ELEMENTS
    rows = flat[:whole].reshape(-1, ROW)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        per_chunk = np.vecdot(rows, rows).reshape(-1, CHUNK_ELEMENTS // ROW).sum(axis=1, dtype=np.float64)
    if not (np.all(np.isfinite(per_chunk)) and np.all(per_chunk > 1e-25)):
        return 0
    acc.parts.extend((1.0, float(v)) for v in per_chunk)
    return whole


def l2_norm(x: Any, /, *, xp: ModuleType | None = None) -> float:
    """Euclidean norm ‖x‖₂ = sqrt(Σ xᵢ²), accumulated in float64 (see module doc). 0.0 for empty x."""
    return _norm(x, 2.0, xp)


def l1_norm(x: Any, /, *, xp: ModuleType | None = None) -> float:
    """‖x‖₁ = Σ |xᵢ| in float64. 0.0 for empty x."""
    return _norm(x, 1.0, xp)


def max_abs(x: Any, /, *, xp: ModuleType | None = None) -> float:
    """max |x| over all elements (NaN if any NaN); 0.0 for an empty tensor."""
    return _norm(x, math.inf, xp)


def tensor_norm(x: Any, /, norm_type: float | int | str = 2, *, xp: ModuleType | None = None) -> float:
    """‖x‖_p for p in {1, 2, inf} (inf = max |xᵢ|), as a float64 Python float."""
    p = parse_norm_type(norm_type)
    if p == 2.0:
        return l2_norm(x, xp=xp)
    if p == 1.0:
        return l1_norm(x, xp=xp)
    return max_abs(x, xp=xp)


def combine_norms(norms: Iterable[float], norm_type: float | int | str = 2) -> float:
    """Total norm of a list from its members' norms: ‖(n₁, …, n_k)‖_p (PyTorch's total-norm definition).

    p=2: sqrt(Σ nᵢ²), computed as M·sqrt(Σ (nᵢ/M)²) with M = max nᵢ so it cannot overflow;
    p=1: Σ nᵢ; p=inf: max nᵢ. NaN if any nᵢ is NaN, else inf if any is inf; 0.0 for an empty list.
    """
    p = parse_norm_type(norm_type)
    values = [float(n) for n in norms]
    if not values:
        return 0.0
    if any(math.isnan(v) for v in values):
        return math.nan
    if any(math.isinf(v) for v in values):
        return math.inf
    if p == 1.0:
        return math.fsum(values)
    big = max(values)
    if p == math.inf or big == 0.0:
        return big
    return big * math.sqrt(math.fsum((v / big) ** 2 for v in values))


def global_norm(t_list: Sequence[Any], norm_type: float | int | str = 2, *, xp: ModuleType | None = None) -> float:
    """Global norm of a list of tensors, TF's ``tf.linalg.global_norm`` for p=2: sqrt(Σᵢ ‖tᵢ‖²).

    ``None`` entries and non-float tensors (ints, bools) are skipped; an empty list gives 0.0. Accurate in
    float64 whatever the dtypes (TF squares in the tensors' dtype and requires one dtype for all).
    NumPy fast path for p=2: a float32 tensor of at most 4·ROW elements is reduced in float32 as one
    piece (the compiled kernel on two threads, else ``np.vdot`` mapped over the list; no Python runs per
    tensor), ~1e-7 relative error per tensor, independent between tensors, summed in float64 (see
    benchmarks/); bigger tensors as by ``tensor_norm``, on two threads.
    """
    p = parse_norm_type(norm_type)
    if p == 2.0 and xp is None:
        ndarray, f32, limit = np.ndarray, _F32, 4 * ROW  # locals: these comprehensions are the hot path
        items = [t for t in t_list if t is not None]
        small = [t for t in items if type(t) is ndarray and t.dtype is f32 and t.size <= limit]
        if small:
            packed = _small_sum_sq(small)
            if not math.isfinite(packed) or packed < 1e-25:  # NaN/Inf/overflow/underflow: the exact path
                return combine_norms((tensor_norm(t, 2) for t in items if is_floating(t)), 2)
            if len(small) == len(items):
                return math.sqrt(packed)
            chosen = {id(t) for t in small}
            rest = _l2_norms([t for t in items if id(t) not in chosen and is_floating(t)])
            return combine_norms([math.sqrt(packed), *rest], 2)
        return combine_norms(_l2_norms([t for t in items if is_floating(t)]), 2)
    return combine_norms((tensor_norm(t, p, xp=xp) for t in t_list if t is not None and is_floating(t)), p)


def _small_sum_sq(small: list[np.ndarray]) -> float:
    """Σ over tensors of Σx² for many small float32 tensors, each reduced in float32 and the results added
    with fsum: the compiled kernel on two threads (half the list each, no Python per tensor), else one
    ``np.vdot`` per tensor mapped over the list. 20,000 tensors of 1-5 k elements: ~32 ms one thread."""
    kernel = kernels.compiled_f32_sumsq_each
    if kernel is None:
        with np.errstate(over="ignore", invalid="ignore"):
            return math.fsum(map(np.vdot, small, small))  # one C call per tensor, no Python per tensor
    if len(small) < 64 or _in_pool():
        return math.fsum(kernel(small))
    mid = len(small) // 2
    return math.fsum(v for part in _pool().map(kernel, [small[:mid], small[mid:]]) for v in part)


def _l2_norms(tensors: list[Any]) -> list[float]:
    """``tensor_norm(t, 2)`` of each tensor (the same bits), the NumPy float32 ones on two threads when the
    compiled kernel is built: the tensors are dealt to two threads by size (largest first, to the less
    loaded), each reducing its tensors with one GIL-free kernel call apiece, so both cores stream memory
    (GPT-2-sized set: 0.056 -> 0.036-0.043 s, torch foreach 0.042-0.052 s)."""
    big = [k for k, t in enumerate(tensors) if type(t) is np.ndarray and t.dtype == _F32 and t.flags.c_contiguous
           and t.size >= ROW]
    if kernels.compiled_f32_summaries is None or len(big) < 2 or sum(tensors[k].nbytes for k in big) < 16 << 20:
        return [tensor_norm(t, 2) for t in tensors]
    groups: list[list[int]] = [[], []]
    load = [0, 0]
    for k in sorted(big, key=lambda k: -tensors[k].nbytes):
        g = 0 if load[0] <= load[1] else 1
        groups[g].append(k)
        load[g] += tensors[k].nbytes
    out: list[float | None] = [None] * len(tensors)

    def run(group: list[int]) -> list[tuple[int, float]]:
        return [(k, _norm(tensors[k], 2.0, None, threaded=False)) for k in group]

    for part in _pool().map(run, groups):
        for k, v in part:
            out[k] = v
    return [v if v is not None else tensor_norm(t, 2) for v, t in zip(out, tensors)]


def slice_l2_norms(x: Any, axes: tuple[int, ...], xp: ModuleType) -> Any:
    """‖x‖₂ over ``axes`` with keepdims, in float64 (rescaled by the slice max |x| for float64 inputs).
    The squares are taken in place in the one float64 array made (x widened, or x scaled): a tensor's
    worth of float64 less at the peak than squaring into a second array, the same bits."""
    if x.dtype != xp.float64:
        sq = as_float64(x, xp)  # a new array (astype copies; complex: the moduli)
        sq *= sq
        return xp.sqrt(xp.sum(sq, axis=axes, keepdims=True))
    m = xp.max(xp.abs(x), axis=axes, keepdims=True)
    safe = xp.where((m > 0) & xp.isfinite(m), m, xp.ones_like(m))
    scaled = x / safe
    scaled *= scaled
    return safe * xp.sqrt(xp.sum(scaled, axis=axes, keepdims=True))
