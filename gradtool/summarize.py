"""Statistics of whole dumps and histories, one tensor in memory at a time (the library behind `stats`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .backend import to_device
from .core.norms import combine_norms, parse_norm_type
from .core.stats import TensorStats, tensor_stats
from .io.base import DumpReader


def name_selected(name: str, select: Sequence[str] = (), exclude: Sequence[str] = ()) -> bool:
    """True when ``name`` matches a ``select`` glob (or there are none) and no ``exclude`` glob."""
    if select and not any(fnmatch.fnmatchcase(name, g) for g in select):
        return False
    return not any(fnmatch.fnmatchcase(name, g) for g in exclude)


@dataclass
class DumpSummary:
    """One dump's statistics. ``global_norm`` is over its floating tensors, in ``norm_type``."""

    path: str
    format: str
    group: str | None
    step: int | None
    norm_type: float
    metadata: dict[str, Any]
    tensors: list[tuple[str, TensorStats]] = field(default_factory=list)

    @property
    def global_norm(self) -> float:
        return combine_norms((s.norm for _, s in self.tensors if s.is_float), self.norm_type)

    @property
    def num_tensors(self) -> int:
        return len(self.tensors)

    @property
    def num_elements(self) -> int:
        return sum(s.size for _, s in self.tensors)

    @property
    def nonfinite_tensors(self) -> list[str]:
        return [n for n, s in self.tensors if s.nonfinite_count]

    @property
    def largest(self) -> tuple[str | None, float | None]:
        """(name, norm) of the float tensor with the largest norm (NaN counts as largest)."""
        best: tuple[str | None, float | None] = (None, None)
        for n, s in self.tensors:
            if not s.is_float:
                continue
            if best[1] is None or s.norm != s.norm or (best[1] == best[1] and s.norm > best[1]):
                best = (n, s.norm)
        return best


def summarize_dump(reader: DumpReader, *, step: int | None = None, select: Sequence[str] = (),
                   exclude: Sequence[str] = (), norm_type: float | int | str = 2, xp: ModuleType | None = None,
                   on_tensor: Callable[[int], None] | None = None) -> DumpSummary:
    """Per-tensor statistics of the selected tensors of one dump, reading one tensor at a time."""
    p = parse_norm_type(norm_type)
    summary = DumpSummary(reader.display_path, reader.format, reader.group,
                          step if step is not None else reader.step, p, dict(reader.metadata))
    names = [n for n in reader.names if name_selected(n, select, exclude)]
    for info, array in reader.iter_tensors(names):
        x = to_device(array, xp) if xp is not None else array
        summary.tensors.append((info.name, tensor_stats(x, p, xp=xp)))
        del x, array
        if on_tensor:
            on_tensor(1)
    return summary
