"""Deflate decoding for compressed dumps: python-isal's ``isal_zlib`` when installed, else the standard
``zlib``.

``isal_zlib`` (Intel's ISA-L, extra ``gradtool[speedups]``) has zlib's interface and inflates 2-2.5x
faster on this project's benchmark, releasing the GIL as zlib does. It only ever speeds up a success:
when it reports an error, the same bytes are inflated again by ``zlib``, whose verdict and message
stand, so a corrupt file is judged exactly as without the extra. Deflate decoding is deterministic,
so the inflated bytes are the same either way (tests run both).
"""

from __future__ import annotations

import zlib
from types import ModuleType
from typing import Any

USE_ISAL = True  # tests switch it off to run the zlib path with isal installed


def fast_zlib() -> ModuleType:
    """``isal.isal_zlib`` if installed (and not switched off), else ``zlib``."""
    if USE_ISAL:
        try:
            from isal import isal_zlib
        except ImportError:
            return zlib
        return isal_zlib
    return zlib


def decompress(data: bytes, wbits: int = zlib.MAX_WBITS) -> Any:
    """``zlib.decompress(data, wbits)``, by isal when it can; zlib decides whenever isal reports an error."""
    mod = fast_zlib()
    if mod is not zlib:
        try:
            return mod.decompress(data, wbits)
        except mod.error:  # isal's own error class (not a zlib.error): let zlib judge these bytes
            pass
    return zlib.decompress(data, wbits)
