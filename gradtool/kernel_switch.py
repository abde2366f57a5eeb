"""The one switch for gradtool's optional compiled code (the stats kernel, the log readers, the npz
members' inflater): ``GRADTOOL_NO_KERNELS`` set to anything but empty or ``0`` turns all of it off, and
the NumPy / Python paths run instead. Standard library only: ``gradtool --version`` asks it without NumPy."""

from __future__ import annotations

import os


def kernels_turned_off() -> bool:
    """True when ``GRADTOOL_NO_KERNELS`` is set to a value other than ``""`` or ``"0"`` (spaces ignored).
    Read at each call, so that tests can switch it."""
    return os.environ.get("GRADTOOL_NO_KERNELS", "").strip() not in ("", "0")
