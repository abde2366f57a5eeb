"""gradtool: gradient diagnostics for saved gradient dumps.

Library API (TensorFlow's names and argument order)::

    from gradtool import clip_by_value, clip_by_norm, clip_by_average_norm, global_norm, clip_by_global_norm
    from gradtool import tensor_stats, tensor_norm
    from gradtool import open_dump, iter_dumps, save_dump, Recorder     # dump I/O (h5py imported lazily)
    from gradtool import suggest_threshold                              # threshold recommendation

Importing gradtool imports NumPy and array-api-compat only: never click, rich, h5py or cupy.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .core.clipping import clip_by_average_norm, clip_by_global_norm, clip_by_norm, clip_by_value
from .core.norms import global_norm, tensor_norm
from .core.stats import TensorStats, tensor_stats
from .errors import GradtoolError, NonFiniteError, UsageError

__version__ = "0.1.0"

_LAZY = {
    "open_dump": "gradtool.io.dump",
    "iter_dumps": "gradtool.io.history",
    "save_dump": "gradtool.io.dump",
    "Recorder": "gradtool.recorder",
    "record": "gradtool.recorder",
    "suggest_threshold": "gradtool.suggest",
    "read_norm_log": "gradtool.io.logs",
}

__all__ = [
    "clip_by_value", "clip_by_norm", "clip_by_average_norm", "clip_by_global_norm", "global_norm",
    "tensor_norm", "tensor_stats", "TensorStats", "GradtoolError", "NonFiniteError", "UsageError",
    "__version__", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gradtool' has no attribute {name!r}")
