"""The optional compiled log readers (gradtool/io/_logscan.c): W&B history records, TensorBoard's TFRecord
framing, CRCs and add_scalar events, MLflow metric lines, text log lines by a line template. Each reader
that uses them keeps its Python (and NumPy, msgspec) path, which gives the same results and runs when the
extension was not built (no C compiler at install time) or ``GRADTOOL_NO_KERNELS`` is set."""

from __future__ import annotations

import os
from typing import Any


def log_readers() -> Any:
    """The ``gradtool.io._logscan`` module, or None (not built, or turned off by ``GRADTOOL_NO_KERNELS``).
    Looked up at each call, so that tests can switch it off."""
    if os.environ.get("GRADTOOL_NO_KERNELS", "").strip() not in ("", "0"):
        return None
    try:
        from . import _logscan
    except ImportError:
        return None
    return _logscan
