"""The only place that names numpy/cupy: pick an array namespace, move arrays host <-> device.

Numeric code receives arrays and asks :func:`namespace_of` for their Array API namespace
(array-api-compat), so the same code runs on NumPy, CuPy and array-api-strict. CuPy is imported lazily,
only when asked for.

Choice of backend: ``--backend`` on the command line, else the ``GRADTOOL_BACKEND`` environment variable,
else ``numpy``. ``auto`` means cupy when it imports and sees a GPU, else numpy.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import array_api_compat
import numpy as np

from .errors import BackendError

BACKENDS = ("numpy", "cupy", "auto")
ENV_VAR = "GRADTOOL_BACKEND"


def _cupy_namespace() -> ModuleType:
    try:
        import cupy  # noqa: F401
        import array_api_compat.cupy as cp_xp
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        raise BackendError(
            f"backend 'cupy' is not available ({type(exc).__name__}: {exc}); install gradtool[cupy] "
            "on a machine with an NVIDIA GPU, or use --backend numpy"
        ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise BackendError(f"backend 'cupy' found no usable GPU ({exc}); use --backend numpy") from None
    if count < 1:
        raise BackendError("backend 'cupy' found no GPU; use --backend numpy")
    return cp_xp


def get_namespace(name: str | None = None) -> ModuleType:
    """Return the Array API namespace for ``name`` ('numpy', 'cupy', 'auto'; None = env var or numpy)."""
    if name is None:
        name = os.environ.get(ENV_VAR) or "numpy"
    name = name.strip().lower()
    if name == "numpy":
        import array_api_compat.numpy as np_xp

        return np_xp
    if name == "cupy":
        return _cupy_namespace()
    if name == "auto":
        try:
            return _cupy_namespace()
        except BackendError:
            return get_namespace("numpy")
    raise BackendError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


def host_namespace() -> ModuleType:
    """The Array API namespace of the host fast paths (streamed clipping, norms of NumPy arrays): NumPy
    itself from 2.0 on, whose main namespace follows the standard (NEP 56) for every function gradtool
    calls; ``array_api_compat.numpy`` on NumPy 1.x. array_api_compat.numpy star-imports NumPy, which
    loads every NumPy submodule (f2py, ma, random, testing, polynomial): 75-150 ms of `clip`'s start-up
    on this project's machine, for no difference in results (the tests run the core on both)."""
    if _NUMPY_MAJOR >= 2:
        return np
    import array_api_compat.numpy as np_xp

    return np_xp


_NUMPY_MAJOR = int(np.__version__.split(".", 1)[0])


def namespace_of(*arrays: Any, xp: ModuleType | None = None) -> ModuleType:
    """The namespace to compute with: ``xp`` when given, else the arrays' own (NumPy for array-likes)."""
    if xp is not None:
        return xp
    real = [a for a in arrays if a is not None and not isinstance(a, (int, float, bool))]
    if not real:
        import array_api_compat.numpy as np_xp

        return np_xp
    return array_api_compat.array_namespace(*real)


def is_numpy_namespace(xp: ModuleType) -> bool:
    return array_api_compat.is_numpy_namespace(xp)


def asarray(x: Any, xp: ModuleType) -> Any:
    """``x`` as an array of namespace ``xp`` (plain lists and scalars become NumPy arrays first)."""
    if array_api_compat.is_array_api_obj(x):
        if namespace_of(x) is xp or (is_numpy_namespace(xp) and isinstance(x, np.ndarray)):
            return x
        return xp.asarray(to_host(x))
    return xp.asarray(np.asarray(x)) if not is_numpy_namespace(xp) else np.asarray(x)


def to_device(x: np.ndarray, xp: ModuleType) -> Any:
    """Move a host NumPy array to the namespace's device (a no-op for NumPy)."""
    if is_numpy_namespace(xp):
        return x
    return xp.asarray(x)


def to_host(x: Any) -> np.ndarray:
    """Bring an array of any supported namespace back to a NumPy array (no copy for NumPy)."""
    if isinstance(x, np.ndarray):
        return x
    if array_api_compat.is_cupy_array(x):
        return x.get()
    try:
        return np.from_dlpack(x)
    except Exception:
        return np.asarray(x)


_EXTRA_FLOAT_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                      "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float6_e2m3fn",
                      "float6_e3m2fn", "float4_e2m1fn")


def is_floating_dtype(dtype: Any, xp: ModuleType | None = None) -> bool:
    """True for real floating dtypes, including ml_dtypes' bfloat16 and float8 variants on NumPy."""
    if isinstance(dtype, np.dtype) or (xp is not None and is_numpy_namespace(xp)):
        d = np.dtype(dtype)
        return d.kind == "f" or d.name in _EXTRA_FLOAT_NAMES
    if xp is not None:
        try:
            return bool(xp.isdtype(dtype, "real floating"))
        except Exception:
            pass
    name = getattr(dtype, "name", str(dtype))
    return name.startswith("float") or name in _EXTRA_FLOAT_NAMES


def is_complex_dtype(dtype: Any, xp: ModuleType | None = None) -> bool:
    """True for complex floating dtypes (complex64, complex128)."""
    if isinstance(dtype, np.dtype) or (xp is not None and is_numpy_namespace(xp)):
        return np.dtype(dtype).kind == "c"
    if xp is not None:
        try:
            return bool(xp.isdtype(dtype, "complex floating"))
        except (AttributeError, TypeError, ValueError):  # a namespace without isdtype, a foreign dtype
            pass
    return getattr(dtype, "name", str(dtype)).rsplit(".", 1)[-1].startswith("complex")


def is_floating(x: Any) -> bool:
    """True when the array ``x`` holds real floating-point values (the tensors that are clipped and counted)."""
    dtype = x.dtype
    if isinstance(dtype, np.dtype):
        return is_floating_dtype(dtype)
    return is_floating_dtype(dtype, namespace_of(x))


_DTYPE_NAMES: dict[np.dtype, str] = {}  # NumPy's dtype.name is a Python property: ~6 us, once per tensor


def dtype_name(dtype: Any) -> str:
    """'float32', 'bfloat16', ... whatever the namespace (array-api-strict spells 'array_api_strict.float32')."""
    numpy_dtype = isinstance(dtype, np.dtype)
    if numpy_dtype and (name := _DTYPE_NAMES.get(dtype)) is not None:
        return name
    name = getattr(dtype, "name", None)
    name = name if isinstance(name, str) else str(dtype).rsplit(".", 1)[-1]
    if numpy_dtype and len(_DTYPE_NAMES) < 1024:  # structured dtypes are endless; the common ones are few
        _DTYPE_NAMES[dtype] = name
    return name
