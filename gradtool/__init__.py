"""gradtool: gradient diagnostics for saved gradient dumps.

Library API (TensorFlow's names and argument order)::

    from gradtool import clip_by_value, clip_by_norm, clip_by_average_norm, global_norm, clip_by_global_norm
    from gradtool import tensor_stats, tensor_norm
    from gradtool import open_dump, iter_dumps, save_dump, Recorder     # dump I/O (h5py imported lazily)
    from gradtool import suggest_threshold                              # threshold recommendation

Every name is imported on first use, so ``import gradtool`` (and ``gradtool --help``) costs almost
nothing; nothing here ever imports click, rich, h5py or cupy.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "clip_by_value": "gradtool.core.clipping",
    "clip_by_norm": "gradtool.core.clipping",
    "clip_by_average_norm": "gradtool.core.clipping",
    "clip_by_global_norm": "gradtool.core.clipping",
    "global_norm": "gradtool.core.norms",
    "tensor_norm": "gradtool.core.norms",
    "tensor_stats": "gradtool.core.stats",
    "TensorStats": "gradtool.core.stats",
    "GradtoolError": "gradtool.errors",
    "NonFiniteError": "gradtool.errors",
    "UsageError": "gradtool.errors",
    "open_dump": "gradtool.io.dump",
    "iter_dumps": "gradtool.io.history",
    "save_dump": "gradtool.io.dump",
    "Recorder": "gradtool.recorder",
    "record": "gradtool.recorder",
    "suggest_threshold": "gradtool.suggest",
    "read_norm_log": "gradtool.io.logs",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'gradtool' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
