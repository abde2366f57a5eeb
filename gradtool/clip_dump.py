"""Clip whole dumps tensor by tensor (the library behind `gradtool clip`).

Memory holds one chunk at a time (one tensor for the whole-tensor cases: --axes that are neither a
tensor's leading nor its trailing ones, Fortran order, device backends). Global-norm clipping makes two
streaming passes: the norms first, then scale-and-write. Every tensor goes through the same library functions a user would call
(:mod:`gradtool.core.clipping`), so the command and the library cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import numpy as np

from .backend import to_device, to_host
from .core import clipping
from .core.norms import (NormAccumulator, NormOfPieces, as_float64, bfloat16_bits_as_float32, combine_norms,
                         parse_norm_type, tensor_norm)
from .core.kernels import half_kind, kernel_kind
from .core.stats import STREAM_CHUNK
from .errors import NonFiniteError, UsageError
from .io.base import (PAGE, DumpReader, DumpWriter, PhasedBuffer, TensorInfo, WorkAhead, bits_view,
                      buffer_phase, kept_thread_pool, pread_at)
from .summarize import name_selected

MODES = ("value", "norm", "average-norm", "global-norm")


@dataclass
class ClipSpec:
    """What to clip and how. ``thresholds`` maps tensor names to per-tensor maxima (per-tensor modes)."""

    mode: str
    max: float | None = None
    min: float | None = None
    axes: tuple[int, ...] | None = None
    use_norm: float | None = None
    norm_type: float = 2.0
    nonfinite: str = "error"
    select: Sequence[str] = ()
    exclude: Sequence[str] = ()
    thresholds: Mapping[str, float] | None = None

    def validate(self) -> ClipSpec:
        """Usage errors for combinations that make no sense (exit 2), with what to do instead."""
        if self.mode not in MODES:
            raise UsageError(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        clipping.check_nonfinite_policy(self.nonfinite)
        self.norm_type = parse_norm_type(self.norm_type)
        if self.max is None and not self.thresholds:
            raise UsageError("give a threshold with --max (or per-tensor ones with --thresholds FILE)")
        if self.use_norm is not None and self.mode != "global-norm":
            raise UsageError("--use-norm only applies to --mode global-norm")
        if self.norm_type != 2.0 and self.mode != "global-norm":
            raise UsageError("--norm-type only applies to --mode global-norm (per-tensor modes use L2, as TF does)")
        if self.axes is not None and self.mode != "norm":
            raise UsageError("--axes only applies to --mode norm")
        if self.thresholds and self.mode == "global-norm":
            raise UsageError("--thresholds holds per-tensor thresholds; they do not apply to --mode global-norm")
        if self.mode == "value":
            if self.min is not None and self.max is None:
                raise UsageError("--min needs --max in value mode")
            if self.max is not None:
                if not math.isfinite(self.max) and not math.isinf(self.max):
                    raise UsageError("--max must be a number")
                lo = -self.max if self.min is None else self.min
                if math.isnan(lo) or lo > self.max:
                    raise UsageError(f"--min ({lo!r}) must be <= --max ({self.max!r}); with --max alone the "
                                     "bounds are [-max, max], so --max must be >= 0")
        else:
            if self.min is not None:
                raise UsageError("--min only applies to --mode value")
            if self.max is not None:
                clipping.check_clip_norm(self.max, "--max")
        if self.use_norm is not None and (math.isnan(self.use_norm) or self.use_norm < 0):
            raise UsageError("--use-norm must be >= 0")
        for name, value in (self.thresholds or {}).items():
            clipping.check_clip_norm(value, f"threshold for {name!r}") if self.mode != "value" else None
        return self

    def bounds(self) -> tuple[float | None, float | None]:
        lo = (-self.max if self.min is None else self.min) if self.max is not None else None
        return lo, self.max

    def threshold_for(self, name: str) -> float | None:
        """The maximum for one tensor: its entry in ``thresholds``, else ``max``."""
        return (self.thresholds or {}).get(name, self.max)

    def lower_bound_for(self, name: str, threshold: float) -> float:
        """Value mode's minimum for one tensor: ``min``, else −threshold (per-tensor thresholds are ±)."""
        return -threshold if self.min is None or name in (self.thresholds or {}) else self.min


@dataclass(slots=True, weakref_slot=True)
class TensorClip:
    name: str
    norm_before: float | None
    norm_after: float | None
    clipped: bool
    clipped_elements: int
    threshold: float | None = None
    skipped: str | None = None  # why the tensor was not considered (not selected, not float)


@dataclass
class DumpClip:
    input: str
    group: str | None
    step: int | None
    spec: ClipSpec
    global_norm_before: float = 0.0
    global_norm_after: float = 0.0
    scale: float | None = None
    tensors: list[TensorClip] = field(default_factory=list)

    @property
    def clipped_tensors(self) -> int:
        return sum(t.clipped for t in self.tensors)

    @property
    def clipped_elements(self) -> int:
        return sum(t.clipped_elements for t in self.tensors)


def _changed(before: Any, after: Any, xp: ModuleType, may_nan: bool = True) -> int:
    """Number of elements whose value changed (NaN -> NaN counts as unchanged; -0.0 vs 0.0 too).
    ``may_nan=False`` skips the NaN test when the tensor is known to be finite (the streamed hot path)."""
    if after is before:
        return 0
    with np.errstate(invalid="ignore"):
        diff = before != after
        if may_nan:
            diff = diff & ~(xp.isnan(before) & xp.isnan(after))
    if type(diff) is np.ndarray:  # (no int64 copy of the mask)
        return int(np.count_nonzero(diff))
    return int(xp.sum(xp.astype(diff, xp.int64)))


def _check_axes(reader: DumpReader, spec: ClipSpec, names: list[str]) -> None:
    if spec.axes is None:
        return
    for name in names:
        info = reader.info(name)
        try:
            clipping.normalize_axes(spec.axes, len(info.shape))
        except UsageError as exc:
            raise UsageError(f"{reader.display_path}: tensor {name!r} of shape {list(info.shape)}: {exc}; "
                             "use --select/--exclude to clip only tensors of a suitable rank") from None


@dataclass
class SharedNorms:
    """Norms of logical tensors that span several shard files: every shard is clipped by the factor of
    the whole (global norm and scale for global-norm; each logical tensor's L2 norm for per-tensor modes).
    ``piece_norms``: each shard's own norms of its pieces (by the shard's display path), taken in the same
    pass, which :func:`clip_dump` reports as the norms before instead of reading the shard once more."""

    global_norm: float
    scale: float | None
    tensor_norms: dict[str, float]
    tensor_sizes: dict[str, int]
    piece_norms: dict[str, dict[str, float]] = field(default_factory=dict)


def shared_norms(reader: DumpReader, spec: ClipSpec) -> SharedNorms:
    """Pass 1 over a (sharded) reader: the norms every shard's clipping must agree on. Each shard's
    pieces are measured once: a piece's norm is its own accumulator's result, a logical tensor's the
    merge of its pieces' accumulators (the same per-chunk partial sums, added by fsum: the same bits as
    streaming the logical tensor whole)."""
    spec.validate()
    if spec.axes is not None:
        raise UsageError("--axes is not supported for sharded steps (a slice may span shards)")
    p = spec.norm_type if spec.mode == "global-norm" else 2.0
    logical: dict[str, NormAccumulator] = {}
    pieces: dict[str, dict[str, float]] = {}
    for shard in _files_of(reader):
        own = pieces.setdefault(shard.display_path, {})
        for info in shard.tensors:
            if name_selected(info.name, spec.select, spec.exclude) and _float_info(info):
                acc = _norm_accumulator(shard, info, p, spec.nonfinite)
                own[info.name] = acc.result()
                logical.setdefault(info.name, NormAccumulator(p)).merge(acc)
    norms = {name: acc.result() for name, acc in logical.items()}
    bad = [n for n, v in norms.items() if not math.isfinite(v)]
    if bad and spec.nonfinite == "error":
        raise _refusal(reader, bad)
    n = combine_norms(norms.values(), p)
    scale = None
    if spec.mode == "global-norm":
        scale = clipping.global_clip_scale(spec.use_norm if spec.use_norm is not None else n, float(spec.max))
    return SharedNorms(n, scale, norms, {i.name: i.size for i in reader.tensors if i.name in norms}, pieces)


def clip_dump(reader: DumpReader, writer: DumpWriter | None, spec: ClipSpec, *, step: int | None = None,
              xp: ModuleType | None = None, on_tensor: Callable[[int], None] | None = None,
              shared: SharedNorms | None = None) -> DumpClip:
    """Clip one dump into ``writer`` (None = dry run) and report what changed, per tensor.

    On the host (``xp`` None) elementwise clipping streams every tensor through a small buffer: read a
    chunk, clip it with the library function, write it, so memory does not grow with the tensor and an
    unclipped tensor is copied byte for byte. Norm clipping over a tensor's trailing ``axes`` (``-1``,
    ``1,2`` of a 3-D tensor: rows) or leading ones (``0``: columns) streams blocks of whole rows
    (:func:`_clip_slices`). Other axes, Fortran-ordered arrays and device backends take the whole tensor
    at once. The paths sum the same squares in the same order and scale elementwise: the same bits.
    """
    spec.validate()
    result = DumpClip(reader.display_path, reader.group, step if step is not None else reader.step, spec)
    p = spec.norm_type if spec.mode == "global-norm" else 2.0
    chosen = [i.name for i in reader.tensors if name_selected(i.name, spec.select, spec.exclude)
              and _float_info(i)]
    _check_axes(reader, spec, chosen)
    chosen_set = set(chosen)

    norms_before: dict[str, float] = {}
    used: float | None = None
    measured = shared is not None and reader.display_path in shared.piece_norms  # in pass 1 (shared_norms)
    if measured:
        own = shared.piece_norms[reader.display_path]  # type: ignore[union-attr]
        norms_before = {name: v for name, v in own.items() if name in chosen_set}
    holding: set[str] | None = None  # under "zero", the tensors that held NaN/±inf (None: not known)
    if spec.mode == "global-norm":
        if not measured and spec.nonfinite == "zero" and xp is None:
            norms_before, holding = _zeroed_norms(reader, chosen, p, on_tensor)
        elif not measured:
            fast = _norms_in_parallel(reader, chosen, p, xp, on_tensor)
            for name in chosen:
                if name in fast:
                    norms_before[name] = fast[name]
                    continue
                norms_before[name] = _norm_of(reader, reader.info(name), p, spec.nonfinite, xp)
                if on_tensor:
                    on_tensor(1)
        bad = [n for n, v in norms_before.items() if not math.isfinite(v)]
        if bad and spec.nonfinite == "error":
            raise _refusal(reader, bad)
        n = combine_norms(norms_before.values(), p)
        used = spec.use_norm if spec.use_norm is not None else n
        result.global_norm_before = n
        result.scale = clipping.global_clip_scale(used, float(spec.max))
        if shared is not None:  # a shard of a larger step: the whole step's norm decides
            result.global_norm_before, result.scale = shared.global_norm, shared.scale
            used = spec.use_norm if spec.use_norm is not None else shared.global_norm
    elif xp is None and not measured:
        # per-tensor modes: the streamed tensors' L2 norms before (scale and report) on two cores where
        # that applies, the same bits as the serial pass that _clip_streamed takes for the others
        streamed = [name for name in chosen if not reader.info(name).fortran
                    and (spec.axes is None or _slice_layout(spec, reader.info(name)) is not None)]
        if spec.nonfinite == "zero":
            norms_before, holding = _zeroed_norms(reader, streamed, 2.0, None)
        else:
            norms_before = _norms_in_parallel(reader, streamed, 2.0, None, None)

    if writer is not None:
        writer.plan(list(reader.tensors) + reader.metadata_members, data_phase=_data_phase(reader))
    norms_after: dict[str, float] = {}
    out_buffer = PhasedBuffer()  # the streamed tensors' output buffer, reused
    ahead = WorkAhead()  # the scaled tensors' chunks (see _scaled_in_place)
    # under "zero", the tensors found without NaN/±inf are clipped as finite ones (see _zeroed_norms)
    finite_spec = replace(spec, nonfinite="error") if holding is not None else spec
    clean = chosen_set if holding is None else {n for n in norms_before if n not in holding}
    runs = {} if xp is not None else _small_runs(reader, clean, finite_spec, result.scale, p,
                                                 norms_before if shared is None else {})  # (a shard's
    # tensors are clipped by their whole tensors' norms: not in per-tensor runs)
    inflated_ahead = _RunsInflatedAhead(reader, runs)
    after_run = 0
    for k, info in enumerate(reader.tensors):
        if k < after_run:  # clipped in a run
            continue
        data = inflated_ahead.bytes_of(k, runs[k], out_buffer) if k in runs else None
        clips = _clip_run(writer, runs[k], data, norms_before) if data is not None else None
        if clips is not None:
            for tc in clips:
                norms_after[tc.name] = tc.norm_after  # type: ignore[assignment]
                result.tensors.append(tc)
                if on_tensor:
                    on_tensor(1)
            after_run = k + len(runs[k].tensors)
            continue
        if info.name not in chosen_set:
            if writer is not None and not _copied(reader, writer, info):
                if info.fortran:
                    writer.add(info, reader._read(info))
                else:
                    writer.add_chunks(info, reader.iter_chunks_ahead(info))
            why = "not selected" if _float_info(info) else "not floating point"
            result.tensors.append(TensorClip(info.name, None, None, False, 0, skipped=why))
            continue
        tensor_spec = finite_spec if info.name in clean else spec
        try:
            layout = _slice_layout(spec, info) if xp is None and not info.fortran else None
            if xp is None and not info.fortran and (spec.mode != "norm" or spec.axes is None
                                                    or (layout is not None and layout[0] == "all")):
                logical = None
                if shared is not None and info.name in shared.tensor_norms:
                    logical = (shared.tensor_norms[info.name], shared.tensor_sizes[info.name])
                tc = _clip_streamed(reader, writer, info, tensor_spec, norms_before, result.scale, p, logical,
                                    out_buffer, ahead)
            elif layout and (by_slice := _clip_slices(reader, writer, info, tensor_spec, norms_before,
                                                      layout)):
                tc = by_slice
            elif shared is not None:
                raise UsageError("sharded steps are clipped on the NumPy backend, without --axes")
            else:
                tc = _clip_whole(reader, writer, info, tensor_spec, norms_before, used, xp, p)
        except NonFiniteError:
            bad = [info.name] + [c for c in chosen if c != info.name
                                 and not math.isfinite(_norm_of(reader, reader.info(c), 2.0, "propagate", xp))]
            raise _refusal(reader, bad) from None
        norms_after[info.name] = tc.norm_after  # type: ignore[assignment]
        result.tensors.append(tc)
        if on_tensor:
            on_tensor(1)
    if writer is not None:
        for info in reader.metadata_members:  # step, loss, lr saved beside the gradients: kept as they were
            if not _copied(reader, writer, info):
                writer.add(info, reader._read(info))
        for group, attrs in reader.group_attrs.items():
            writer.set_group_attrs(group, attrs)
        for name, target in reader.soft_links.items():  # HDF5 aliases, to the clipped data as before
            writer.add_soft_link(name, target)
        for name, existing in reader.hard_links.items():  # a tensor (or group) under a second name
            writer.add_hard_link(name, existing)
    if spec.mode != "global-norm":
        result.global_norm_before = combine_norms(
            (t.norm_before for t in result.tensors if t.norm_before is not None), p)
    result.global_norm_after = combine_norms(norms_after.values(), p)
    return result


def _files_of(reader: DumpReader) -> list[DumpReader]:
    """The one-file readers behind ``reader``: a sharded step's shards, else the reader itself."""
    return getattr(reader, "shards", None) or [reader]


def _refusal(reader: DumpReader, bad: list[str]) -> NonFiniteError:
    """The error of the "error" policy for tensors whose norm is not finite: those holding NaN/Inf, and
    apart from them those whose finite elements only make a norm beyond float64's range (float64 values
    near its limit). Tells them apart by one more read of each (an error path: the norms did not keep
    the element flags)."""
    flagged = set()
    for shard in _files_of(reader):
        for info in shard.tensors:
            if info.name in bad and info.name not in flagged:
                acc = _norm_accumulator(shard, info, 2.0, "propagate")
                if acc.nan or acc.inf:
                    flagged.add(info.name)
    holding = [n for n in bad if n in flagged]
    overflowing = [n for n in bad if n not in flagged]
    what = []
    if holding:
        what.append(f"NaN/Inf in {', '.join(holding)}")
    if overflowing:
        what.append(f"the norm of {', '.join(overflowing)} is beyond float64's range (values near 1.8e308)")
    hint = "--nonfinite zero or propagate to go on" if holding else "--nonfinite propagate for TF's result"
    return NonFiniteError(f"{reader.display_path}: {'; '.join(what)}; nothing written ({hint})", bad)


def _norms_in_parallel(reader: DumpReader, names: list[str], p: float, xp: ModuleType | None,
                       on_tensor: Callable[[int], None] | None) -> dict[str, float]:
    """The L2 norms of pass 1 for the float32, float16 and bfloat16 tensors, on two cores, from the
    statistics path (the same per-chunk kernel sums, sent to float64 by the same rule, so the same bits as
    :func:`_norm_of`); in a dump too small for two cores, those of its small tensors many to a kernel
    call, as ``stats`` takes them (:func:`small_tensor_batches`: a dump of 20,000 tensors of 64 elements
    was read a tensor at a time, ~25 us each). The float16 GPT-2 set's pass 0.051 -> 0.025 s, bfloat16's
    0.031 -> 0.016 s, from a process's second dump on (the first starts the threads). float64 tensors by
    :func:`_float64_norms_in_parallel` (the statistics path sums their squares by ``np.dot``, the serial
    pass by NumPy's sum of products). Missing where neither applies (the caller streams those tensors):
    other norms, other dtypes, device backends, tensors whose summary does not decide (NaN/inf). The
    norms of the tensors as they are (under the "zero" policy: :func:`_zeroed_norms`)."""
    if xp is not None or p != 2.0:
        return {}
    from .summarize import batch_stats, small_tensor_batches, stats_in_parallel

    wide = _float64_norms_in_parallel(reader, names, on_tensor)
    infos = [i for i in map(reader.info, names) if i.dtype == np.float32 or half_kind(i.dtype) is not None]
    stats = stats_in_parallel(reader, infos, p, on_tensor) if infos else None
    if stats is not None:
        return {**wide, **{name: s.norm for name, s in stats}}
    norms: dict[str, float] = wide
    for batch in small_tensor_batches(reader, infos, p):
        for k, s in batch_stats(reader, batch, p).items():
            if s is not None:
                norms[infos[k].name] = s.norm
    if on_tensor and norms:
        on_tensor(len(norms))
    return norms


FLOAT64_PIECE_CHUNKS = 8  # STREAM_CHUNK chunks a task of _norms_in_pieces (16 MiB of float64)


def _float64_norms_in_parallel(reader: DumpReader, names: list[str],
                               on_tensor: Callable[[int], None] | None) -> dict[str, float]:
    """The L2 norms of the float64 tensors among ``names`` whose bytes lie at a file offset, on two cores
    (:func:`_norms_in_pieces`; the statistics path sums their squares by ``np.dot``, the serial pass by
    NumPy's sum of products). 420 MB of float64: 0.090 -> 0.058 s (``clip --mode global-norm`` 0.36 ->
    0.34 s). Empty on one core and for dumps under the statistics path's PARALLEL_MIN_BYTES."""
    infos = [i for i in map(reader.info, names) if i.dtype == np.float64]  # (native: ">f8" is not float64)
    accs = _norms_in_pieces(reader, infos, 2.0, False)
    if on_tensor and accs:
        on_tensor(len(accs))
    return {name: acc.result() for name, (acc, _) in accs.items()}


def _norms_in_pieces(reader: DumpReader, infos: list[TensorInfo], p: float,
                     zero: bool) -> dict[str, tuple[NormAccumulator, bool]]:
    """(the :class:`NormAccumulator` :func:`_norm_accumulator` makes of it, whether NaN or ±inf were zeroed)
    by name, for the tensors of ``infos`` whose bytes lie at a file offset, on two cores: each tensor cut
    into pieces of FLOAT64_PIECE_CHUNKS whole STREAM_CHUNK chunks, each piece read as one window (a memory
    map, or a ``pread`` into the thread's buffer where unaligned; bfloat16 as its bits) and its chunks fed
    (``zero``: NaN and ±inf zeroed first, in a copy) to an accumulator of the piece, the pieces'
    accumulators merged: the chunks :func:`_norm_accumulator` feeds one accumulator, so the same parts,
    summed by fsum (in any order: the same bits). Empty on one core and for dumps under the statistics
    path's PARALLEL_MIN_BYTES (thread start-up costs more than a core gains)."""
    import os
    import threading

    from .core.norms import _in_pool, _pool
    from .summarize import PARALLEL_MIN_BYTES

    if _in_pool():  # (a task of the pool must not wait on it)
        return {}
    tensors = []
    for info in infos:
        if not info.fortran and info.size:
            location = reader.raw_location(info)
            if location is not None:
                tensors.append((info, location, bits_view(info)))
    if (os.cpu_count() or 1) < 2 or sum(i.nbytes for i, _, _ in tensors) < PARALLEL_MIN_BYTES:
        return {}
    step = FLOAT64_PIECE_CHUNKS * STREAM_CHUNK
    pieces = [(k, start, min(start + step, info.size)) for k, (info, _, _) in enumerate(tensors)
              for start in range(0, info.size, step)]
    local = threading.local()

    def piece_norm(piece: tuple[int, int, int]) -> tuple[NormAccumulator, bool]:
        k, start, stop = piece
        info, location, bits = tensors[k]
        buffer = getattr(local, "buffer", None)
        if buffer is None:
            buffer = local.buffer = PhasedBuffer()
        acc, zeroed = NormAccumulator(p), False
        for window in reader.range_window(location, info, start, stop, buffer, view_as=bits):
            for a in range(0, stop - start, STREAM_CHUNK):
                c = window[a:a + STREAM_CHUNK]
                if zero:
                    c, found = _zeroed(c, bits)
                    zeroed |= found
                if bits is None:
                    acc.update(c)
                else:
                    acc.update_bfloat16_bits(c)
            del window, c
        return acc, zeroed

    accs = [(NormAccumulator(p), False) for _ in tensors]
    for (k, _, _), (acc, zeroed) in zip(pieces, _pool().map(piece_norm, pieces)):
        accs[k][0].merge(acc)
        accs[k] = accs[k][0], accs[k][1] or zeroed
    return {info.name: got for (info, _, _), got in zip(tensors, accs)}


def _zeroed(c: np.ndarray, bits: np.dtype | None) -> tuple[np.ndarray, bool]:
    """(``c`` with its NaN and ±inf set to +0.0, in a new array, or ``c`` itself when it holds none; whether
    it held any), for a chunk of bfloat16 bits too (``bits``: see :func:`~.io.base.bits_view`)."""
    if bits is None:
        z = clipping.zero_nonfinite(c, xp=np)
        return z, z is not c
    if not ((c & 0x7F80) == 0x7F80).any():
        return c, False
    z = c.copy()
    clipping.zero_nonfinite_in_place(z, bfloat16_bits=True)
    return z, True


def _zeroed_norms(reader: DumpReader, names: list[str], p: float,
                  on_tensor: Callable[[int], None] | None) -> tuple[dict[str, float], set[str]]:
    """Pass 1 under the "zero" policy: (each tensor's norm after its NaN and ±inf are zeroed, the tensors
    that held any). A tensor without them is left as it is by zeroing, so the caller clips it as a finite
    tensor (in runs, in place, copied whole); before, a zeroed copy of each chunk took every tensor
    through NumPy (the float16 GPT-2 set's ``clip --nonfinite zero`` 0.60 s against 0.36 s, bfloat16's
    1.13 s: ml_dtypes imported). One read of each: tensors of several chunks at a file offset on two
    cores (:func:`_norms_in_pieces`); small float32, float16 and bfloat16 ones many to a kernel call
    (:func:`~.summarize.batch_stats`, whose summary decides only a tensor without NaN/±inf: the others
    are read again); the rest chunk by chunk (:func:`_norm_accumulator`). The same norms as that serial
    pass."""
    from .summarize import batch_stats, small_tensor_batches

    infos = list(map(reader.info, names))
    found: dict[str, float] = {}
    holding: set[str] = set()
    for name, (acc, zeroed) in _norms_in_pieces(reader, [i for i in infos if i.size > STREAM_CHUNK
                                                         and (i.dtype in (np.float32, np.float64, np.float16)
                                                              or bits_view(i) is not None)], p, True).items():
        found[name] = acc.result()
        if zeroed:
            holding.add(name)
    rest = [i for i in infos if i.name not in found]
    for batch in small_tensor_batches(reader, rest, p):
        for k, s in batch_stats(reader, batch, p).items():
            if s is not None and math.isfinite(s.norm) and not s.nonfinite_count:
                found[rest[k].name] = s.norm
    if on_tensor and found:
        on_tensor(len(found))
    norms = {}
    for info in infos:
        if info.name in found:
            norms[info.name] = found[info.name]
            continue
        zeroed: list[int] = []
        norms[info.name] = _norm_accumulator(reader, info, p, "zero", zeroed).result()
        if sum(zeroed):
            holding.add(info.name)
        if on_tensor:
            on_tensor(1)
    return norms, holding


def _norm_of(reader: DumpReader, info: TensorInfo, p: float, nonfinite: str, xp: ModuleType | None) -> float:
    """‖tensor‖_p read chunk by chunk (after zeroing NaN/Inf under the "zero" policy)."""
    if xp is not None:
        x = _prepare(to_device(reader.read(info.name), xp), nonfinite, xp)
        return tensor_norm(x, p, xp=xp)
    return _norm_accumulator(reader, info, p, nonfinite).result()


def _norm_accumulator(reader: DumpReader, info: TensorInfo, p: float, nonfinite: str,
                      zeroed: list[int] | None = None) -> NormAccumulator:
    """The tensor's chunks, read one by one (NaN/Inf zeroed first under the "zero" policy, a chunk without
    them as it is; how many, or whether any, appended to ``zeroed`` a chunk), in a
    :class:`NormAccumulator`. STREAM_CHUNK chunks, as the statistics path and pass B cut the tensor: a
    chunk's Σx² is rounded once, so other cuts could differ from their norms in the last bit. A bfloat16
    tensor taken as its bits (:func:`~.io.base.bits_view`) is measured by
    :meth:`NormAccumulator.update_bfloat16_bits`, chunk by chunk."""
    acc = NormAccumulator(p)
    found = [] if zeroed is None else zeroed
    bits = bits_view(info)
    location = reader.raw_location(info) if bits is not None else None
    if location is not None:
        work = PhasedBuffer().get(min(info.size, STREAM_CHUNK) * info.dtype.itemsize,
                                  buffer_phase(reads=[location[1]]))
        for c in reader.chunks_into(location, info, work, STREAM_CHUNK, bits):
            if nonfinite == "zero":
                found.append(clipping.zero_nonfinite_in_place(c, bfloat16_bits=True))
            acc.update_bfloat16_bits(c)
        return acc
    for c in reader.iter_chunks(info, STREAM_CHUNK):
        x = _prepare(c, nonfinite, None)
        found.append(x is not c)
        acc.update(x)
    return acc


def _clip_streamed(reader: DumpReader, writer: DumpWriter | None, info: TensorInfo, spec: ClipSpec,
                   norms_before: dict[str, float], scale: float | None, p: float,
                   logical: tuple[float, int] | None = None, buffer: PhasedBuffer | None = None,
                   ahead: WorkAhead | None = None) -> TensorClip:
    """One tensor, elementwise, chunk by chunk: pass A for its norm (per-tensor modes), pass B to clip
    and write. Raises NonFiniteError under the "error" policy before anything of it is written.
    ``logical``: (L2 norm, size) of the whole logical tensor when this is one shard's piece of it.
    ``buffer``: where the output chunks are made (a new one if None); ``ahead``: where a tensor of several
    chunks is read and scaled while its chunks are written (see :func:`_scaled_in_place`)."""
    from .backend import host_namespace

    np_xp = host_namespace()
    name = info.name
    threshold = spec.threshold_for(name)
    policy = spec.nonfinite
    if spec.mode == "global-norm":
        before, threshold = norms_before[name], spec.max
    else:
        before = norms_before[name] if name in norms_before else _norm_of(reader, info, 2.0, policy, None)
        if policy == "error" and not math.isfinite(before):
            raise NonFiniteError(f"tensor {name!r} holds NaN/Inf", [name])
        if threshold is None or spec.mode == "value":
            scale = 1.0
        else:
            whole, size = (before, info.size) if logical is None else logical
            c = threshold * (size if spec.mode == "average-norm" else 1)
            scale = 1.0 if whole <= c else c / whole  # c/NaN and c/inf give TF's results
    lo = None
    if spec.mode == "value" and threshold is not None:
        lo = spec.lower_bound_for(name, threshold)
    may_nan = not math.isfinite(before)
    if lo is None and scale == 1.0 and policy != "zero" and _copied(reader, writer, info):
        # unchanged, and its norm after is the norm before: the same accumulator over the same bytes
        # (not under "zero": the norm before is taken after zeroing, so NaN/Inf may be there to zero)
        return TensorClip(name, before, before, False, 0, threshold)
    acc = NormAccumulator(p)
    changed = 0
    fused = _fused_scale(info, scale, p) if lo is None else None
    clip_values = None if lo is None else _fused_clip_values(info, lo, threshold)

    def clipped_chunks() -> Any:
        nonlocal changed
        where = getattr(writer, "data_offset", None)  # known once the writer asks for the first chunk
        if policy == "zero" and (how := _in_place_op(info, lo, scale, fused, clip_values)) is not None \
                and (location := reader.raw_location(info)) is not None:
            changed += yield from _zeroed_in_place(reader, info, location, where, how, acc, buffer)
            return
        location = reader.raw_location(info) if fused is not None and policy != "zero" else None
        if location is not None:  # float32 at a file offset, to be scaled: see _scaled_in_place
            changed += yield from _scaled_in_place(reader, info, location, where, scale, fused, acc, buffer,
                                                   ahead)
            return
        bits = bits_view(info)
        in_place = clip_values is not None and policy != "zero" and (
            bits is not None or (ahead is not None and info.size > STREAM_CHUNK))
        location = reader.raw_location(info) if in_place else None
        if location is not None and ahead is not None and info.size > STREAM_CHUNK:
            # clipped in place on the second thread while written (see there)
            def clipped(chunk: np.ndarray) -> tuple[int, NormAccumulator, int]:
                n_changed, nonfinite = clip_values(chunk, chunk)  # (the kernel reads each element first)
                part = NormAccumulator(p)
                if bits is None:
                    part.update(chunk)
                else:
                    part.update_bfloat16_bits(chunk)
                return n_changed, part, nonfinite

            phase = buffer_phase(reads=[location[1]], writes=[] if where is None else [where])
            changed += yield from _changed_ahead(reader, info, location, phase, clipped, acc, ahead, policy,
                                                 bits)
            return
        if location is not None and bits is not None:  # (bfloat16 as its bits: without ml_dtypes)
            changed += yield from _clipped_bits_in_place(reader, info, location, where, clip_values, acc,
                                                         buffer, policy, bits)
            return
        # the output buffer, placed in a page where the write out of it runs at full speed (buffer_phase:
        # up to 2.1x faster)
        dtype = info.dtype.newbyteorder("=")
        phase = 0 if where is None else buffer_phase(writes=[where])
        out_buf = (buffer or PhasedBuffer()).get(min(info.size, STREAM_CHUNK) * dtype.itemsize, phase).view(dtype)
        # 1 MiB chunks (float32): 11-12 % faster than 256 KiB on every format (ab.py, 16/16 pairs), same
        # bits; a compressed member inflates on another thread
        for chunk in reader.iter_chunks_ahead(info, STREAM_CHUNK):
            src = _prepare(chunk, policy, np_xp)
            if fused is not None and src is chunk and chunk.dtype == info.dtype \
                    and chunk.flags.c_contiguous:  # scale, count changes and measure in one pass
                out = out_buf[: chunk.shape[0]]
                sum_sq, n_changed = fused(chunk, scale, out)
                changed += n_changed
                acc.update_sum_sq(sum_sq, out)
                yield out
                continue
            if clip_values is not None and src.dtype == info.dtype and src.flags.c_contiguous:
                out = out_buf[: src.shape[0]]
                n_changed, nonfinite = clip_values(src, out)
                if not (nonfinite and policy == "error"):  # (else clip_by_value's error, below)
                    changed += n_changed if src is chunk else _changed(chunk, out, np_xp, may_nan)  # (zeroed
                    acc.update(out)  # NaN and ±inf count as changed too)
                    yield out
                    continue
            if lo is not None:
                out = clipping.clip_by_value(src, lo, threshold, nonfinite=policy, xp=np_xp)
            elif scale != 1.0:
                out = clipping.scale_tensor(src, scale, np_xp, out=out_buf[: src.shape[0]])
            else:
                out = src
            if out is not chunk:
                changed += _changed(chunk, out, np_xp, may_nan)
            acc.update(out)
            yield out

    _write_or_drain(writer, info, clipped_chunks())
    after = acc.result()
    return TensorClip(name, before, after, changed > 0, changed, threshold)


# Tensors of at most RUN_ELEMENTS, lying back to back in the input (or a few headers apart), are clipped a
# run of up to RUN_BYTES at a time (_clip_run): a dump of 20,000 tensors of 1-5 k elements spent ~60 us a
# tensor going through the streaming path's read, scale and write one tensor at a time. 1 MiB runs clip
# that dump as fast as 4 MiB ones (in-process, five each in turns: safetensors 1.08-1.22 s either way)
# with 5-9 MB less peak RSS (the 20,000-tensor npz clip was at target 4's budget, 97 of 97 MiB).
RUN_ELEMENTS = STREAM_CHUNK  # (one chunk: the streaming path scales it with one kernel call too)
RUN_BYTES = 1 << 20
RUN_GAP = 4 << 10  # bytes a run reads past between two of its tensors (an npz member's zip and .npy headers)


# What a run does to one of its tensors, in place: (Σx² of the result as the kernel took it, or None to
# take it again; elements changed); None: the tensor is left as it is (a per-tensor norm under its threshold)
_RunOp = Callable[[np.ndarray], tuple[float | None, int]] | None


@dataclass
class _Run:
    """Tensors of one input file, each with its size in bytes, what is done to it (:data:`_RunOp`) and its
    threshold for the report, ``nbytes`` in all: lying raw in the file in its order from byte ``start``
    of ``fd`` to ``end``, back to back or up to RUN_GAP bytes apart (``offsets``: where each begins), or,
    ``fd`` -1, small deflated members (npz) or gzip datasets (HDF5) the reader inflates together
    (``inflate_members``)."""

    fd: int
    start: int
    end: int = 0
    nbytes: int = 0
    tensors: list[tuple[TensorInfo, int, _RunOp, float | None]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def takes(self, location: tuple[int, int], nbytes: int) -> bool:
        """Whether a tensor of ``nbytes`` at ``location`` ((fd, offset), or (-1, -1): inflated) joins the run."""
        fd, offset = location
        if fd != self.fd:
            return False
        if fd < 0:
            return self.nbytes + nbytes <= RUN_BYTES
        return self.end <= offset <= self.end + RUN_GAP and offset + nbytes - self.start <= RUN_BYTES

    def add(self, tensor: tuple[TensorInfo, int, _RunOp, float | None], offset: int) -> None:
        self.tensors.append(tensor)
        self.offsets.append(offset)
        self.nbytes += tensor[1]
        if self.fd >= 0:
            self.end = offset + tensor[1]


def _small_runs(reader: DumpReader, chosen: set[str], spec: ClipSpec, scale: float | None,
                p: float, norms_before: Mapping[str, float]) -> dict[int, _Run]:
    """The runs of tensors :func:`_clip_run` clips together, by the index of each run's first tensor in
    ``reader.tensors``: two or more consecutive chosen tensors of 1 to RUN_ELEMENTS elements, each
    beginning where the one before it ends in one input file or a few headers after (:class:`_Run`;
    or small deflated npz members or gzip HDF5 datasets, inflated together), that the compiled kernel scales by the
    global norm's factor ≠ 1 (:func:`_fused_scale`), or, float32 ones whose L2 norm before is known and
    finite (so no NaN/Inf for the "error" policy), clips by value (:func:`_fused_clip_values`) or scales
    by its own norm (``norm``, ``average-norm`` without ``--axes``; a tensor under its threshold is left
    as it is); never when NaN/Inf are zeroed first. A dump of 20,000 small tensors: ~60 us a tensor
    through the streaming path."""
    runs: dict[int, _Run] = {}
    per_tensor = p == 2.0 and (spec.mode == "value"
                               or (spec.mode in ("norm", "average-norm") and spec.axes is None))
    if spec.nonfinite == "zero" or not (per_tensor or (spec.mode == "global-norm" and scale is not None
                                                       and scale != 1.0)):
        return runs
    kernels: dict[Any, Any] = {}

    def op_of(info: TensorInfo) -> tuple[bool, _RunOp, float | None]:
        """(whether the tensor can be in a run, what the run does to it, its threshold)."""
        # (one answer a dtype, or a dtype and bounds, shared by their tensors: a closure and a tuple each
        # were ~4 MB of Python objects for 20,000 tensors, ~2 MB of clip's peak RSS)
        if not per_tensor:
            key = info.dtype.name if bits_view(info) is not None else info.dtype  # (a DeferredDtype's hash
            if key not in kernels:  # imports ml_dtypes)
                fused = _fused_scale(info, scale, p)
                kernels[key] = (fused is not None, None if fused is None else
                                (lambda view, fused=fused: fused(view, scale, view)), spec.max)
            return kernels[key]
        hi = spec.threshold_for(info.name)
        before = norms_before.get(info.name, math.nan)
        if hi is None or info.dtype != np.float32 or not math.isfinite(before):
            return False, None, hi
        if spec.mode == "value":
            key = (info.dtype, hi, spec.lower_bound_for(info.name, hi))
            if key not in kernels:
                clip = _fused_clip_values(info, key[2], hi)
                kernels[key] = (clip is not None, None if clip is None else
                                (lambda view, clip=clip: (None, clip(view, view)[0])), hi)
            return kernels[key]
        c = hi * (info.size if spec.mode == "average-norm" else 1)
        if before <= c:
            return True, None, hi
        s = c / before
        fused = _fused_scale(info, s, p)
        return fused is not None, lambda view: fused(view, s, view), hi

    inflates_whole = getattr(reader, "inflates_whole", None)
    run, first = None, 0
    for k, info in enumerate(reader.tensors):
        location, op, hi = None, None, None
        size = info.size
        if 0 < size <= RUN_ELEMENTS and not info.fortran and info.name in chosen:
            fits, op, hi = op_of(info)
            location = reader.raw_location(info) if fits else None
            if location is None and fits and inflates_whole is not None and inflates_whole(info):
                location = (-1, -1)
        if location is None:
            if run is not None and len(run.tensors) > 1:
                runs[first] = run
            run = None
            continue
        nbytes = size * info.dtype.itemsize
        if run is None or not run.takes(location, nbytes):
            if run is not None and len(run.tensors) > 1:
                runs[first] = run
            run, first = _Run(location[0], location[1], location[1]), k
        run.add((info, nbytes, op, hi), location[1])
    if run is not None and len(run.tensors) > 1:
        runs[first] = run
    return runs


def _clip_run(writer: DumpWriter | None, run: _Run, data: np.ndarray,
              norms_before: dict[str, float]) -> list[TensorClip]:
    """A run of small tensors (:func:`_small_runs`), their bytes ``data`` (:func:`_run_bytes`: read with
    one ``pread``, or inflated together), each scaled (or clipped by value) and measured in place by its
    kernel call (what the streaming path makes of a one-chunk tensor: the same bits), written with one
    call (:meth:`DumpWriter.add_run`)."""
    clips = []
    at = 0
    for info, nbytes, op, threshold in run.tensors:
        before = norms_before[info.name]
        if op is None:  # (under its threshold: the streaming path copies it, its norm unchanged)
            clips.append(TensorClip(info.name, before, before, False, 0, threshold))
        else:
            bits = bits_view(info)
            view = data[at:at + nbytes].view(info.dtype if bits is None else bits)
            sum_sq, changed = op(view)  # in place: the kernels read each element first
            acc = NormAccumulator(2.0)
            if sum_sq is None:  # (clipped by value: float32 alone, never bits)
                acc.update(view)
            else:
                _update_sum_sq(acc, sum_sq, view, bits)
            clips.append(TensorClip(info.name, before, acc.result(), changed > 0, changed, threshold))
        at += nbytes
    if writer is not None:
        writer.add_run([info for info, *_ in run.tensors], data)
    return clips


class _RunsInflatedAhead:
    """The bytes of the runs (:func:`_run_bytes`), each run of deflated members inflated on a worker
    thread while the run before it is clipped and written. The compiled ``inflate_raw`` lets go of the
    GIL for a whole run (a member a call, the two threads convoyed on the GIL and the clip got slower:
    measured), so without it nothing is inflated ahead. An HDF5 file's gzip datasets are inflated ahead a
    Python call each all the same (each chunk's inflate lets go of the GIL): 20,000 of them clipped in
    5.68 s against 5.96 s on this thread (``ab.py``, 6 of 8 pairs). Two buffers, taken in turns: a run's
    bytes stay valid until the next run's are asked for."""

    def __init__(self, reader: DumpReader, runs: dict[int, _Run]) -> None:
        from .io.compiled import member_inflater

        self._reader, self._runs = reader, runs
        order = [k for k in sorted(runs) if runs[k].fd < 0] if member_inflater() is not None else []
        self._next = dict(zip(order, order[1:]))  # each inflated run's successor
        self._turn = {k: i % 2 for i, k in enumerate(order)}  # which buffer each one's bytes go to
        self._buffers = (PhasedBuffer(), PhasedBuffer()) if order else ()
        self._ahead: dict[int, Any] = {}  # the runs being inflated on the worker: Futures

    def bytes_of(self, k: int, run: _Run, buffer: PhasedBuffer) -> np.ndarray | None:
        """:func:`_run_bytes` of run ``k`` (in ``buffer`` for a run read from the file, in one of the
        two inflation buffers for a deflated one), the next deflated run handed to the worker first."""
        if k not in self._turn:
            return _run_bytes(self._reader, run, buffer)
        following = self._next.get(k)
        if following is not None:
            self._ahead[following] = _inflate_ahead_thread().submit(
                _run_bytes, self._reader, self._runs[following], self._buffers[self._turn[following]])
        job = self._ahead.pop(k, None)
        return job.result() if job is not None else _run_bytes(self._reader, run, self._buffers[self._turn[k]])


def _inflate_ahead_thread() -> Any:
    """:class:`_RunsInflatedAhead`'s one worker thread."""
    return kept_thread_pool("gradtool-runs-ahead")


def _run_bytes(reader: DumpReader, run: _Run, buffer: PhasedBuffer) -> np.ndarray | None:
    """The bytes of the run's tensors one after another (uint8, in ``buffer``): one ``pread`` of the
    file's ``[start, end)``, the tensors then moved together over the headers between them (each moves
    towards the front, in order: never over one not moved yet); or the members inflated (None if one
    would not)."""
    infos = [info for info, *_ in run.tensors]
    if run.fd < 0:
        data = buffer.get(run.nbytes)
        got = reader.inflate_members(infos, data)  # type: ignore[attr-defined]
        return None if any(g is None for g in got) else data
    data = buffer.get(run.end - run.start, buffer_phase(reads=[run.start]))
    reader._fill(memoryview(data), pread_at(run.fd, run.start), infos[0])
    if run.end - run.start != run.nbytes:
        at = 0
        for (_, nbytes, *_), offset in zip(run.tensors, run.offsets):
            if offset - run.start != at:
                data[at:at + nbytes] = data[offset - run.start: offset - run.start + nbytes]
            at += nbytes
    return data[:run.nbytes]


def _slice_layout(spec: ClipSpec, info: TensorInfo) -> tuple[str, int] | None:
    """How ``--mode norm --axes`` cuts ``info`` into slices that can be streamed, the tensor seen as
    (rows, width) in C order: ("rows", width) when the axes are its trailing ones (each slice a row of
    consecutive elements), ("columns", width) when they are its leading ones and the rest holds at least
    two elements (each slice a column: NumPy sums such a reduction row after row, which a stream can do
    in the same order), ("all", 0) when they are all of its axes (one norm over the whole tensor, as
    without --axes); None otherwise (other axes, another mode, an empty tensor): clipped whole."""
    if spec.mode != "norm" or spec.axes is None or info.size == 0:
        return None
    ndim = len(info.shape)
    ax = clipping.normalize_axes(spec.axes, ndim)
    if len(ax) == ndim:
        return "all", 0
    if ax == tuple(range(ndim - len(ax), ndim)):
        return "rows", math.prod(info.shape[ndim - len(ax):])
    width = math.prod(info.shape[len(ax):])
    if ax == tuple(range(len(ax))) and width >= 2:  # one column: a contiguous sum, which NumPy pairs
        return "columns", width
    return None


def _clip_slices(reader: DumpReader, writer: DumpWriter | None, info: TensorInfo, spec: ClipSpec,
                 norms_before: dict[str, float], layout: tuple[str, int]) -> TensorClip | None:
    """``clip_by_norm`` over a tensor's trailing or leading axes (:func:`_slice_layout`), streamed in two
    passes over blocks of whole rows (about STREAM_CHUNK elements): A takes the slices' norms as
    ``slice_l2_norms`` takes them on the whole tensor (rows: the same function on the same rows; columns:
    the squares summed row after row, as NumPy sums them, carried from block to block), so the same bits;
    B scales the clipped slices (elementwise, so the same bits again) and writes them; the norm after is
    taken over STREAM_CHUNK chunks, as ``tensor_norm`` takes it. Memory: a block or two and one float64
    per slice, where the whole-tensor path held the tensor, its float64 copy and their products (800 MB
    at its peak for the 500 MB GPT-2 set, whose largest tensor is 147 MiB). None, having written nothing,
    for a tensor without a threshold, or one whose clipped slices' scales are below float32's normal
    range (``scale_tensor`` then takes the whole float32 tensor through float64): it is clipped whole."""
    from .backend import host_namespace

    np_xp = host_namespace()
    name, policy, threshold = info.name, spec.nonfinite, spec.threshold_for(info.name)
    if threshold is None:
        return None
    before = norms_before[name] if name in norms_before else _norm_of(reader, info, 2.0, policy, None)
    kind, width = layout
    block = max(1, STREAM_CHUNK // width) * width
    blocks, bits = _slice_blocks(reader, info, block, policy, kind)
    norms = (_row_norms if kind == "rows" else _column_norms)(blocks, info, width, policy, np_xp, bits)
    clipped, scale = clipping.slice_clip_scales(norms, float(threshold), np_xp)
    if info.dtype == np.float32 and clipping._subnormal_in_float32(scale, np_xp):
        return None
    if not clipped.any() and policy != "zero" and _copied(reader, writer, info):
        return TensorClip(name, before, before, False, 0, threshold)
    after = NormOfPieces(info.dtype if bits is None else bits, STREAM_CHUNK, bfloat16_bits=bits is not None)
    changed = 0
    kernel_scaled = _slice_scaler(info, kind == "rows")

    def clipped_blocks() -> Iterator[np.ndarray]:
        nonlocal changed
        done = 0
        for chunk in blocks(True):
            src = _prepare(chunk, policy, np_xp)
            n = src.shape[0] // width
            out, counted = src, None
            if kind == "columns":
                if clipped.any() and kernel_scaled is not None:  # float32/16, bfloat16: in the kernel
                    out, counted = kernel_scaled(src, clipped, scale)
                elif clipped.any():  # each column by its scale, where that column is clipped
                    x2 = src.reshape(n, width)
                    out = np_xp.where(clipped[None, :], clipping.scale_tensor(x2, scale[None, :], np_xp), x2)
                    out = out.reshape(-1)
            elif clipped[done: done + n].any():
                rows = slice(done, done + n)
                if kernel_scaled is not None:
                    out, counted = kernel_scaled(src, clipped[rows], scale[rows])
                else:
                    out = clipping.scale_slices(src.reshape(n, width), clipped[rows], scale[rows], np_xp)
                    out = out.reshape(-1)
            if src is not chunk or (out is not chunk and counted is None):
                changed += _changed(chunk, out, np_xp)
            elif counted is not None:
                changed += counted
            after.add(out)
            done += n
            yield out

    _write_or_drain(writer, info, clipped_blocks())
    return TensorClip(name, before, after.result(), changed > 0, changed, threshold)


def _slice_blocks(reader: DumpReader, info: TensorInfo, block: int, policy: str,
                  kind: str) -> tuple[Callable[[bool], Iterator[np.ndarray]], np.dtype | None]:
    """(``blocks(ahead)``: the tensor's blocks of ``block`` elements for a pass of :func:`_clip_slices`,
    read ahead on a worker where that pays; the dtype they come in when it is not the tensor's). A
    bfloat16 tensor at a file offset comes as its bits (:func:`~.io.base.bits_view`: ml_dtypes, ~0.5 s to
    import in 0.7, is not needed) where the kernels take them: its slices' norms (rows widened to float32
    by their bits, exactly; columns summed by ``column_sumsq``) and their scaling (``half_scale_slices``);
    not under "zero", which zeroes a copy of each block and compares it with the block."""
    from .core import kernels

    bits = bits_view(info) if policy != "zero" and kernels.compiled_half_scale_slices is not None and (
        kind == "rows" or kernels.compiled_column_sumsq is not None) else None
    location = reader.raw_location(info) if bits is not None else None
    if location is None:
        return (lambda ahead: (reader.iter_chunks_ahead if ahead else reader.iter_chunks)(info, block)), None
    buffer = PhasedBuffer()

    def blocks(ahead: bool) -> Iterator[np.ndarray]:
        work = buffer.get(min(info.size, block) * info.dtype.itemsize, buffer_phase(reads=[location[1]]))
        return reader.chunks_into(location, info, work, block, bits)

    return blocks, bits


def _slice_scaler(info: TensorInfo, by_row: bool) -> Callable[..., tuple[np.ndarray, int]] | None:
    """``(block, clipped, scale) -> (block with its clipped slices scaled, elements changed)`` for a float32,
    float16 or bfloat16 tensor clipped by rows (``by_row``: ``clipped`` and ``scale`` the block's rows') or
    columns (the tensor's columns'), by the compiled ``f32_scale_slices`` / ``half_scale_slices``: the
    arithmetic of ``scale_tensor`` (float32 products; float16 and bfloat16 multiplied in float32, rounded
    once) and ``_changed``'s count, one call a block. NumPy's float16 casts took the float16 GPT-2 set's
    ``clip --axes 0`` 9.1 s (float32: 0.8 s), and 200 MB of float16 rows of 64 elements 3.9 s by ``--axes
    -1``. None: another dtype, or no kernel (the caller leaves float32 scales below float32's normal range,
    which scale_tensor takes through float64, to the whole-tensor path)."""
    from .core import kernels

    hk = half_kind(info.dtype)
    if hk is not None and kernels.compiled_half_scale_slices is not None:
        half_slices = kernels.compiled_half_scale_slices

        def run(src: np.ndarray, scales: np.ndarray, out: np.ndarray) -> int:
            return half_slices(src.view(np.uint16), scales, out.view(np.uint16), hk, by_row)
    elif info.dtype == np.float32 and kernels.compiled_f32_scale_slices is not None:
        f32_slices = kernels.compiled_f32_scale_slices

        def run(src: np.ndarray, scales: np.ndarray, out: np.ndarray) -> int:
            return f32_slices(src, scales, out, by_row)
    else:
        return None

    def scaled(block: np.ndarray, clipped: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, int]:
        scales = np.where(clipped, scale, -1.0).astype(np.float32)  # (negative: a slice kept as it is; a
        out = np.empty_like(block)  # clipping scale c / norm never is, and NaN, for a NaN norm, scales)
        return out, run(block.reshape(-1), scales, out.reshape(-1))

    return scaled


def _norm_rows(info: TensorInfo, width: int, bits: bool = False) -> tuple[int, np.ndarray | None]:
    """(rows of ``width`` elements a NumPy call in the slice norms' pass A, the reused float64 buffer of
    that many rows that float16, float32 and bfloat16 rows taken as their bits (``bits``) are widened
    into, or None for other dtypes)."""
    widened = bits or info.dtype in (np.float16, np.float32)
    step = max(1, (NORM_ROWS_WIDENED if widened else NORM_ROWS_ELEMENTS) // width)
    return step, np.empty((step, width)) if widened else None


def _row_norms(blocks: Callable[[bool], Iterator[np.ndarray]], info: TensorInfo, width: int, policy: str,
               np_xp: ModuleType, bits: np.dtype | None = None) -> np.ndarray:
    """Pass A of :func:`_clip_slices` for rows: each row's L2 norm by ``slice_l2_norms``, a few rows at a
    time (their float64 copies stay in cache); float16, float32 and bfloat16 rows (as their bits:
    ``bits``, widened to float32 first, exactly) widened into one reused float64 buffer and squared there,
    as ``slice_l2_norms`` squares its copy (each row's sum is the same pairwise sum whatever the rows
    around it: the same bits), four times the rows a call (~18,000 calls of ~20 us for the GPT-2 set by
    rows: 0.4 s of its 1.0). Raises NonFiniteError under "error" for NaN/Inf."""
    from .core.norms import slice_l2_norms

    norms = np.empty(info.size // width)
    done = 0
    step, scratch = _norm_rows(info, width, bits is not None)
    for chunk in blocks(False):
        x = _prepare(chunk, policy, np_xp)
        n = x.shape[0] // width
        rows = x.reshape(n, width)
        for i in range(0, n, step):
            part = rows[i: i + step]
            if scratch is not None:
                sq = scratch[: part.shape[0]]
                np.copyto(sq, part if bits is None else bfloat16_bits_as_float32(part))
                sq *= sq
                got = np.sqrt(np.sum(sq, axis=1))
            else:
                got = slice_l2_norms(part, (1,), np_xp).reshape(-1)
            norms[done + i: done + i + got.shape[0]] = got
        _refuse_nonfinite(policy, norms[done: done + n], x, info.name, np_xp, bits)
        done += n
    return norms


def _column_norms(blocks: Callable[[bool], Iterator[np.ndarray]], info: TensorInfo, width: int, policy: str,
                  np_xp: ModuleType, bits: np.dtype | None = None) -> np.ndarray:
    """Pass A of :func:`_clip_slices` for columns: ``slice_l2_norms`` over the leading axes, streamed.
    NumPy sums a reduction over leading axes row after row into one accumulator (a sum over the single
    contiguous axis, which it pairs, never comes here: width >= 2), so the squares of each few rows are
    summed with the running sums added to their first row: the same additions in the same order; or, for
    float32, float16 and bfloat16, by the compiled ``column_sumsq`` (the same additions; the float16 GPT-2
    set's column norms ~0.2 s -> ~0.03 s). A float64 tensor is first scanned for each column's max |x|,
    by which ``slice_l2_norms`` scales it."""
    f64 = info.dtype == np.float64
    safe = None
    if f64:
        peak = None
        for chunk in blocks(False):
            x = _prepare(chunk, policy, np_xp)
            m = np.max(np.abs(x.reshape(-1, width)), axis=0)
            peak = m if peak is None else np.maximum(peak, m)
        safe = np.where((peak > 0) & np.isfinite(peak), peak, np.ones_like(peak))
    from .core import kernels

    kind = kernel_kind(info.dtype)
    if kind is not None and kernels.compiled_column_sumsq is not None:  # the same sums in the kernel
        sums = np.zeros(width)
        for chunk in blocks(False):
            x = np.ascontiguousarray(_prepare(chunk, policy, np_xp))
            kernels.compiled_column_sumsq(x if kind == -1 else x.view(np.uint16), sums, kind)
            _refuse_nonfinite(policy, sums, x, info.name, np_xp, bits)
        return np.sqrt(sums)
    acc = None
    # float16/float32 widened into one reused float64 buffer and squared there (the same products: both
    # widen exactly), so more rows a call: 38M elements 43 -> 33 ms (float16), 34 -> 25 ms (float32), where
    # each 2^13 elements made a new array (np.multiply(..., dtype=float64) widened through NumPy's
    # buffered casts: 59 ms)
    step, scratch = _norm_rows(info, width)
    for chunk in blocks(False):
        x = _prepare(chunk, policy, np_xp)
        rows = x.reshape(-1, width)
        for i in range(0, rows.shape[0], step):
            part = rows[i: i + step]
            if scratch is not None:
                sq = scratch[: part.shape[0]]
                np.copyto(sq, part)
            else:
                sq = part / safe if f64 else as_float64(part, np_xp)
            sq *= sq
            if acc is not None:
                sq[0] += acc
            acc = np.add.reduce(sq, axis=0)
        _refuse_nonfinite(policy, acc, x, info.name, np_xp)
    assert acc is not None  # info.size > 0
    return safe * np.sqrt(acc) if f64 else np.sqrt(acc)


def _refuse_nonfinite(policy: str, norms: np.ndarray, x: np.ndarray, name: str, np_xp: ModuleType,
                      bits: np.dtype | None = None) -> None:
    """Under the "error" policy, NonFiniteError when ``x`` holds NaN/Inf (as ``clip_by_norm`` refuses such a
    tensor); looked for only where a norm is not finite. ``bits``: ``x`` holds bfloat16 bits."""
    if policy == "error" and not np.isfinite(norms).all() and (
            clipping.has_nonfinite(x, xp=np_xp) if bits is None else bool(((x & 0x7F80) == 0x7F80).any())):
        raise NonFiniteError(f"tensor {name!r} holds NaN/Inf", [name])


def _write_or_drain(writer: DumpWriter | None, info: TensorInfo, chunks: Iterator[np.ndarray]) -> None:
    """The clipped chunks to ``writer``; on a dry run (no writer) produced all the same, for the report."""
    if writer is not None:
        writer.add_chunks(info, chunks)
    else:
        for _ in chunks:
            pass


# elements whose slice norms are taken in one call: their float64 copy (64 KiB) and its squares stay in
# cache and in malloc's heap (bigger ones are mapped afresh each time): pass A over the 500 MB GPT-2 set
# 0.9 s at 2^18 elements a call, ~0.15 s at 2^13 (measured on 20,000 rows of 768: 108 against 19 ms)
NORM_ROWS_ELEMENTS = 1 << 13
NORM_ROWS_WIDENED = 1 << 15  # (_column_norms and _row_norms, into a reused buffer: 256 KiB)


def _scaled_in_place(reader: DumpReader, info: TensorInfo, location: tuple[int, int], where: int | None,
                     scale: float, fused: Callable[..., tuple[float, int]], acc: NormAccumulator,
                     buffer: PhasedBuffer | None,
                     ahead: WorkAhead | None = None) -> Generator[np.ndarray, None, int]:
    """A float32 (or float16/bfloat16) tensor at ``location`` (descriptor, byte offset) of the input, scaled
    for the writer, which puts it at byte ``where`` of the output: each chunk read with ``pread`` into a
    buffer (placed for both offsets, see :func:`buffer_phase`), scaled and measured there by the compiled
    kernel, and yielded to be written out of it. Against scaling a memory map into a second buffer: a bare
    read-scale-write loop over 2 GB 0.71-0.72 s against 1.09-1.35 s (medians of 8-10 runs in turns);
    ``clip`` of the 500 MB safetensors dump 307 against 331 ms (``ab.py``, 16/16 pairs). A tensor of
    several chunks is read and scaled on ``ahead``'s worker thread while the chunks before are written
    (:class:`~.io.base.WorkAhead`); one of one chunk, or without ``ahead``, here, into ``buffer``. Returns
    the number of elements changed; the norm after goes to ``acc``, chunk by chunk in order. The same
    bits as the memory-map path: the same kernel on the same chunks."""
    writes = [] if where is None else [where]
    phase = buffer_phase(reads=[location[1]], writes=writes)
    bits = bits_view(info)
    if ahead is not None and info.size > STREAM_CHUNK:
        def scaled(chunk: np.ndarray) -> tuple[int, NormAccumulator, int]:
            sum_sq, n_changed = fused(chunk, scale, chunk)  # in place
            part = NormAccumulator(acc.p)
            _update_sum_sq(part, sum_sq, chunk, bits)
            return n_changed, part, 0

        return (yield from _changed_ahead(reader, info, location, phase, scaled, acc, ahead, "propagate",
                                          bits))
    changed = 0
    work = (buffer or PhasedBuffer()).get(min(info.size, STREAM_CHUNK) * info.dtype.itemsize, phase)
    for chunk in reader.chunks_into(location, info, work, STREAM_CHUNK, bits):
        sum_sq, n_changed = fused(chunk, scale, chunk)  # in place: the kernel reads each element first
        _update_sum_sq(acc, sum_sq, chunk, bits)
        changed += n_changed
        yield chunk
    return changed


def _clipped_bits_in_place(reader: DumpReader, info: TensorInfo, location: tuple[int, int], where: int | None,
                           clip_values: Callable[[np.ndarray, np.ndarray], tuple[int, int]],
                           acc: NormAccumulator, buffer: PhasedBuffer | None, policy: str,
                           bits: np.dtype) -> Generator[np.ndarray, None, int]:
    """A bfloat16 tensor at ``location`` of the input taken as its bits (``bits``, its
    :func:`~.io.base.bits_view`), clipped by value chunk by chunk in place by the kernel (``clip_values``,
    which compares bits) in a buffer placed for both offsets, measured
    (:meth:`NormAccumulator.update_bfloat16_bits`) and yielded to be written out of it: the streaming
    path's bits without ml_dtypes. A chunk with NaN or ±inf under
    the "error" policy is refused (the tensor measured finite before: the file changed since). Returns
    the number of elements changed."""
    phase = buffer_phase(reads=[location[1]], writes=[] if where is None else [where])
    work = (buffer or PhasedBuffer()).get(min(info.size, STREAM_CHUNK) * info.dtype.itemsize, phase)
    changed = 0
    for chunk in reader.chunks_into(location, info, work, STREAM_CHUNK, bits):
        n_changed, nonfinite = clip_values(chunk, chunk)  # in place: the kernel reads each element first
        if nonfinite and policy == "error":
            raise NonFiniteError(f"tensor {info.name!r} holds NaN/Inf", [info.name])
        acc.update_bfloat16_bits(chunk)
        changed += n_changed
        yield chunk
    return changed


def _in_place_op(info: TensorInfo, lo: Any, scale: float, fused: Callable[..., tuple[float, int]] | None,
                 clip_values: Callable[[np.ndarray, np.ndarray], tuple[int, int]] | None) -> Any:
    """What :func:`_zeroed_in_place` does to a tensor's zeroed chunks in place: (``chunk -> (Σx² of the
    result as the kernel took it, or None to measure it again; elements changed)``, or None to leave
    them as they are (a scale of 1); whether it changes a zero: a clip by value to bounds without 0, in
    the tensor's dtype); None where no kernel does it (the caller takes NumPy's steps): a dtype of its
    own, a scale below float32's normal range, bounds of another type, no kernel."""
    bits = bits_view(info)
    if info.dtype not in (np.float32, np.float64, np.float16) and bits is None:
        return None
    if lo is not None:
        if clip_values is None:
            return None
        zero = np.zeros(1, info.dtype if bits is None else bits)
        return (lambda chunk: (None, clip_values(chunk, chunk)[0])), clip_values(zero, zero)[0] > 0
    if scale == 1.0:
        return None, False
    if fused is None or math.isnan(scale):
        return None
    return (lambda chunk: fused(chunk, scale, chunk)), False  # (0 · a finite scale is 0)


def _zeroed_in_place(reader: DumpReader, info: TensorInfo, location: tuple[int, int], where: int | None,
                     how: tuple[Callable[[np.ndarray], tuple[Any, int]] | None, bool], acc: NormAccumulator,
                     buffer: PhasedBuffer | None) -> Generator[np.ndarray, None, int]:
    """A tensor at ``location`` of the input that holds NaN or ±inf, under the "zero" policy: each chunk
    read into a buffer placed for both offsets (bfloat16 as its bits: :func:`~.io.base.bits_view`), its
    NaN and ±inf set to +0.0 there (:func:`~.core.clipping.zero_nonfinite_in_place`), then scaled or
    clipped by value in place (``how``: :func:`_in_place_op`), measured and yielded to be written out of
    it: the kernels' arithmetic on the zeroed chunks of the NumPy path, without a zeroed copy of each (nor
    ml_dtypes for bfloat16). Returns the elements changed: those zeroed, and those changed after; a
    zeroed element that the clip moves too (bounds without 0) counted once."""
    op, zero_moves = how
    bits = bits_view(info)
    phase = buffer_phase(reads=[location[1]], writes=[] if where is None else [where])
    work = (buffer or PhasedBuffer()).get(min(info.size, STREAM_CHUNK) * info.dtype.itemsize, phase)
    changed = 0
    for chunk in reader.chunks_into(location, info, work, STREAM_CHUNK, bits):
        zeroed = clipping.zero_nonfinite_in_place(chunk, bfloat16_bits=bits is not None)
        sum_sq, n_changed = (None, 0) if op is None else op(chunk)  # (the kernels read each element first)
        if sum_sq is not None:
            _update_sum_sq(acc, sum_sq, chunk, bits)
        elif bits is not None:
            acc.update_bfloat16_bits(chunk)
        else:
            acc.update(chunk)
        changed += n_changed + (0 if zero_moves else zeroed)
        yield chunk
    return changed


def _update_sum_sq(acc: NormAccumulator, sum_sq: Any, chunk: np.ndarray, bits: np.dtype | None) -> None:
    """``acc.update_sum_sq(sum_sq, chunk)``, for a chunk of bfloat16 bits (``bits``: see :func:`_bits_of`)
    too: where the accumulator needs the values (no finite sum above 1e-25: zeros, NaN, ±inf), their
    float32 values (exact: a bfloat16 is the upper half of a float32), which it measures as it measures
    the bfloat16 chunk (tested)."""
    if bits is not None and not acc.takes_sum_sq(sum_sq):
        acc.update(bfloat16_bits_as_float32(chunk))
    else:
        acc.update_sum_sq(sum_sq, chunk)


def _changed_ahead(reader: DumpReader, info: TensorInfo, location: tuple[int, int], phase: int,
                   change: Callable[[np.ndarray], tuple[int, NormAccumulator, int]], acc: NormAccumulator,
                   ahead: WorkAhead, policy: str,
                   bits: np.dtype | None = None) -> Generator[np.ndarray, None, int]:
    """The chunks of a tensor at ``location`` of the input, read and changed in place on ``ahead``'s worker
    thread while the caller writes the chunks before (:class:`~.io.base.WorkAhead`), in buffers at
    ``phase`` in a page: ``change(chunk)`` gives (elements changed, the chunk's norm after as an
    accumulator of its own, NaN and ±inf it found), the accumulators merged into ``acc`` in order (the
    same parts as ``acc.update`` of each chunk gives). A chunk with NaN or ±inf under the "error" policy
    is refused (the tensor measured finite before: the file changed since). Returns the elements
    changed. ``bits``: the chunks' dtype, for a tensor taken as its bits (:func:`_bits_of`)."""
    read_into, dtype = pread_at(*location), info.dtype if bits is None else bits

    def fill(view: memoryview, at: int) -> None:
        reader._fill(view, lambda v, pos: read_into(v, at + pos), info)

    changed = 0
    for raw, (n_changed, part, nonfinite) in ahead.chunks(fill, info.nbytes, STREAM_CHUNK * dtype.itemsize,
                                                          phase, lambda raw: change(raw.view(dtype))):
        if nonfinite and policy == "error":
            raise NonFiniteError(f"tensor {info.name!r} holds NaN/Inf", [info.name])
        acc.merge(part)
        changed += n_changed
        yield raw.view(dtype)
    return changed


def _data_phase(reader: DumpReader) -> int | None:
    """Where in a page the input's first tensor starts (see DumpWriter.plan); None when its bytes cannot
    be copied as they are."""
    if not reader.tensors or reader.tensors[0].fortran:
        return None
    location = reader.raw_location(reader.tensors[0])
    return None if location is None else location[1] % PAGE


def _copied(reader: DumpReader, writer: DumpWriter | None, info: TensorInfo) -> bool:
    """Whether the tensor was written as an unchanged copy of its bytes in the input file, inside the
    kernel (:meth:`DumpWriter.add_copy`): where the input holds them raw and in C order and the output
    format stores them so. Otherwise nothing was written, and the caller streams the tensor."""
    if writer is None or info.fortran:
        return False
    location = reader.raw_location(info)
    where = f"{reader.display_path}: tensor {info.name!r}"
    return location is not None and writer.add_copy(info, location, where)


def _fused_scale(info: TensorInfo, scale: float | None, p: float) -> Callable[..., tuple[float, int]] | None:
    """The compiled scale-and-measure kernel when it gives exactly what the NumPy steps would: a float32
    tensor scaled by a factor ≠ 1 that is normal in float32 (else scale_tensor goes through float64), a
    float64 one (its measure (max |out|, Σout²), for ``NormAccumulator.update_sum_sq``), or a
    float16/bfloat16 one (multiplied in float32 and rounded once, both ways), L2."""
    from .core import kernels

    if scale is None or scale == 1.0 or p != 2.0:
        return None
    if info.dtype == np.float64:  # (not by a NaN scale: which of two NaN operands a product keeps is the
        if (f64_scale := kernels.compiled_f64_scale) is None or math.isnan(scale):  # compiler's choice)
            return None

        def scaled(src: np.ndarray, s: float, out: np.ndarray) -> tuple[Any, int]:
            amax, sum_sq, changed = f64_scale(src, s, out)
            return (amax, sum_sq), changed
        return scaled
    kind = half_kind(info.dtype)
    if kind is not None and kernels.compiled_half_scale is not None:
        half_scale = kernels.compiled_half_scale
        return lambda src, s, out: half_scale(src.view(np.uint16), s, out.view(np.uint16), kind)
    if (kernels.compiled_f32_scale is None or info.dtype != np.float32
            or clipping._subnormal_in_float32(scale, np)):
        return None
    return kernels.compiled_f32_scale


def _fused_clip_values(info: TensorInfo, lo: Any,
                       hi: Any) -> Callable[[np.ndarray, np.ndarray], tuple[int, int]] | None:
    """``(chunk, out) -> (elements changed, NaN and ±inf in chunk)``, ``clipping.clip_by_value(chunk, lo,
    hi)`` into ``out`` by the compiled ``clip_values`` in one pass (NumPy's comparisons, two ``where`` and
    the checks took the GPT-2 set's ``clip --mode value`` 1.8 s, 2.9 s in float16), for a float32, float64,
    float16 or bfloat16 tensor and the usual bounds (Python floats, neither NaN, lo <= hi: clip_by_value refuses the
    others, and says why); the bounds rounded to the tensor's dtype as clip_by_value rounds them
    (:func:`~.core.clipping.bound_in_dtype`). None otherwise."""
    from .core import kernels

    kernel = kernels.compiled_clip_values
    if (kernel is None or type(lo) is not float or type(hi) is not float or math.isnan(lo) or math.isnan(hi)
            or lo > hi):
        return None
    if info.dtype == np.float32 or info.dtype == np.float64:
        kind = -1 if info.dtype == np.float32 else -2
        return lambda chunk, out: kernel(chunk, lo, hi, out, kind)
    kind = half_kind(info.dtype)
    if kind is None:
        return None
    if kind == kernels.HALF_BF16:  # (rounded without ml_dtypes, whose import takes ~0.5 s in 0.7)
        lo_bits, hi_bits = clipping.bfloat16_bits_of(lo), clipping.bfloat16_bits_of(hi)
    else:
        lo_bits, hi_bits = (int(clipping.bound_in_dtype(b, info.dtype, np).view(np.uint16)) for b in (lo, hi))
    return lambda chunk, out: kernel(chunk.view(np.uint16), lo_bits, hi_bits, out.view(np.uint16), kind)


def _clip_whole(reader: DumpReader, writer: DumpWriter | None, info: TensorInfo, spec: ClipSpec,
                norms_before: dict[str, float], used: float | None, xp: ModuleType | None, p: float) -> TensorClip:
    """One tensor in memory (axes, Fortran order, device backends)."""
    a = reader._read(info)
    x = to_device(a, xp) if xp else a
    out, before, threshold = _clip_one(x, info.name, spec, norms_before, used, xp, p)
    after = before if out is x else tensor_norm(out, p, xp=xp)
    n_changed = _changed(x, out, xp or _ns(x))
    if writer is not None:
        writer.add(info, to_host(out) if out is not x else a)
    return TensorClip(info.name, before, after, n_changed > 0, n_changed, threshold)


def _ns(x: Any) -> ModuleType:
    from .backend import namespace_of

    return namespace_of(x)


def _float_info(info: Any) -> bool:
    from .backend import is_floating_dtype

    return is_floating_dtype(info.dtype)


def _prepare(x: Any, nonfinite: str, xp: ModuleType | None) -> Any:
    return clipping.zero_nonfinite(x, xp=xp) if nonfinite == "zero" else x


def _clip_one(x: Any, name: str, spec: ClipSpec, norms_before: dict[str, float], used_norm: float | None,
              xp: ModuleType | None, p: float) -> tuple[Any, float, float | None]:
    """(clipped tensor, its norm before, the threshold used) for one selected float tensor."""
    threshold = spec.threshold_for(name)
    if spec.mode == "global-norm":
        before = norms_before[name]
        (out,), _ = clipping.clip_by_global_norm([x], spec.max, use_norm=used_norm,
                                                 nonfinite=spec.nonfinite, norm_type=p, xp=xp)
        return out, before, spec.max
    before = tensor_norm(_prepare(x, spec.nonfinite, xp) if spec.nonfinite == "zero" else x, 2, xp=xp)
    if threshold is None:
        return clipping._apply_policy(x, spec.nonfinite, _ns(x), name), before, None
    if spec.mode == "value":
        lo = spec.lower_bound_for(name, threshold)
        out = clipping.clip_by_value(x, lo, threshold, nonfinite=spec.nonfinite, xp=xp)
    elif spec.mode == "norm":
        out = clipping.clip_by_norm(x, threshold, spec.axes, nonfinite=spec.nonfinite, xp=xp)
    else:
        out = clipping.clip_by_average_norm(x, threshold, nonfinite=spec.nonfinite, xp=xp)
    return out, before, threshold


