"""Clip whole dumps tensor by tensor (the library behind `gradtool clip`).

Memory holds one tensor at a time. Global-norm clipping makes two streaming passes: the norms first, then
scale-and-write. Every tensor goes through the same library functions a user would call
(:mod:`gradtool.core.clipping`), so the command and the library cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .backend import to_device, to_host
from .core import clipping
from .core.norms import combine_norms, parse_norm_type, tensor_norm
from .errors import NonFiniteError, UsageError
from .io.base import DumpReader, DumpWriter
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


@dataclass
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


def _changed(before: Any, after: Any, xp: ModuleType) -> int:
    """Number of elements whose value changed (NaN -> NaN counts as unchanged)."""
    if after is before:
        return 0
    same = (before == after) | (xp.isnan(before) & xp.isnan(after))
    return int(xp.sum(xp.astype(~same, xp.int64)))


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


def clip_dump(reader: DumpReader, writer: DumpWriter | None, spec: ClipSpec, *, step: int | None = None,
              xp: ModuleType | None = None, on_tensor: Callable[[int], None] | None = None) -> DumpClip:
    """Clip one dump into ``writer`` (None = dry run) and report what changed, per tensor."""
    spec.validate()
    result = DumpClip(reader.display_path, reader.group, step if step is not None else reader.step, spec)
    p = spec.norm_type if spec.mode == "global-norm" else 2.0
    chosen = [i.name for i in reader.tensors if name_selected(i.name, spec.select, spec.exclude)
              and _float_info(i)]
    _check_axes(reader, spec, chosen)
    chosen_set = set(chosen)

    norms_before: dict[str, float] = {}
    used: float | None = None
    if spec.mode == "global-norm":
        for info, a in reader.iter_tensors(chosen):
            x = _prepare(to_device(a, xp) if xp else a, spec.nonfinite, xp)
            norms_before[info.name] = tensor_norm(x, p, xp=xp)
            if on_tensor:
                on_tensor(1)
        bad = [n for n, v in norms_before.items() if not math.isfinite(v)]
        if bad and spec.nonfinite == "error":
            raise NonFiniteError(f"{reader.display_path}: NaN/Inf in {', '.join(bad)}; nothing written "
                                 "(--nonfinite zero or propagate to go on)", bad)
        n = combine_norms(norms_before.values(), p)
        used = spec.use_norm if spec.use_norm is not None else n
        result.global_norm_before = n
        result.scale = clipping.global_clip_scale(used, float(spec.max))

    if writer is not None:
        writer.plan(list(reader.tensors))
    norms_after: dict[str, float] = {}
    for info in reader.tensors:
        a = reader._read(info)
        if info.name not in chosen_set:
            if writer is not None:
                writer.add(info, a)
            why = "not selected" if _float_info(info) else "not floating point"
            result.tensors.append(TensorClip(info.name, None, None, False, 0, skipped=why))
            continue
        x = to_device(a, xp) if xp else a
        try:
            out, before, threshold = _clip_one(x, info.name, spec, norms_before, used, xp, p)
        except NonFiniteError:
            bad = [info.name] + [i.name for i, t in reader.iter_tensors([c for c in chosen if c != info.name])
                                 if clipping.has_nonfinite(t)]
            raise NonFiniteError(f"{reader.display_path}: NaN/Inf in {', '.join(bad)}; nothing written "
                                 "(--nonfinite zero or propagate to go on)", bad) from None
        after = before if out is x else tensor_norm(out, p, xp=xp)
        norms_after[info.name] = after
        n_changed = _changed(x, out, xp or _ns(x))
        result.tensors.append(TensorClip(info.name, before, after, n_changed > 0, n_changed, threshold))
        if writer is not None:
            writer.add(info, to_host(out) if out is not x else a)
        if on_tensor:
            on_tensor(1)
    if writer is not None:
        for group, attrs in reader.group_attrs.items():
            writer.set_group_attrs(group, attrs)
    if spec.mode != "global-norm":
        result.global_norm_before = combine_norms(
            (t.norm_before for t in result.tensors if t.norm_before is not None), p)
    result.global_norm_after = combine_norms(norms_after.values(), p)
    return result


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
    threshold = (spec.thresholds or {}).get(name, spec.max)
    if spec.mode == "global-norm":
        before = norms_before[name]
        (out,), _ = clipping.clip_by_global_norm([x], spec.max, use_norm=used_norm,
                                                 nonfinite=spec.nonfinite, norm_type=p, xp=xp)
        return out, before, spec.max
    before = tensor_norm(_prepare(x, spec.nonfinite, xp) if spec.nonfinite == "zero" else x, 2, xp=xp)
    if threshold is None:
        return clipping._apply_policy(x, spec.nonfinite, _ns(x), name), before, None
    if spec.mode == "value":
        lo = -threshold if spec.min is None or name in (spec.thresholds or {}) else spec.min
        out = clipping.clip_by_value(x, lo, threshold, nonfinite=spec.nonfinite, xp=xp)
    elif spec.mode == "norm":
        out = clipping.clip_by_norm(x, threshold, spec.axes, nonfinite=spec.nonfinite, xp=xp)
    else:
        out = clipping.clip_by_average_norm(x, threshold, nonfinite=spec.nonfinite, xp=xp)
    return out, before, threshold


