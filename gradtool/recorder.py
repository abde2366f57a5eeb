"""Record gradients during training: one dump per call, framework-agnostic, no framework imported.

Example (PyTorch)::

    rec = gradtool.Recorder("grads/", format="npz")          # grads/step_00000100.npz, ...
    ...
    loss.backward()
    rec.write(step, {n: p.grad for n, p in model.named_parameters() if p.grad is not None},
              loss=loss.item(), lr=sched.get_last_lr()[0])

``Recorder("run.h5")`` instead appends one step group per call to a single HDF5 history file.
Tensors may be anything with ``__dlpack__`` or ``__array__`` (PyTorch, TensorFlow, JAX, CuPy, NumPy);
device tensors are copied to the host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import UsageError


def to_numpy(x: Any, name: str = "tensor") -> np.ndarray:
    """A host NumPy array from any array-like, without importing its framework."""
    if isinstance(x, np.ndarray):
        return x
    for attr in ("detach",):  # PyTorch tensors that require grad refuse __array__/dlpack export
        if hasattr(x, attr) and hasattr(x, "requires_grad"):
            x = x.detach()
            if hasattr(x, "cpu"):
                x = x.cpu()
    if hasattr(x, "get") and type(x).__module__.startswith("cupy"):
        return x.get()
    if hasattr(x, "__array__"):
        try:
            return np.asarray(x)
        except Exception:
            pass
    if hasattr(x, "__dlpack__"):
        try:
            return np.from_dlpack(x)
        except Exception:
            pass
    try:
        a = np.asarray(x)
    except Exception as exc:
        raise UsageError(f"cannot convert tensor {name!r} ({type(x).__name__}) to an array: {exc}; "
                         "for bfloat16 PyTorch tensors pass t.float() or t.view(torch.int16)") from None
    if a.dtype.hasobject:
        raise UsageError(f"tensor {name!r} is not numeric ({type(x).__name__})")
    return a


def _scalar(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, (bool, int, float, str)):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


class Recorder:
    """Writes one dump per training step.

    ``target`` is a directory (one file per step, named ``{prefix}{step:08d}{ext}``) or a ``.h5``/``.hdf5``
    file (one group per step, with attribute ``step``, in a single history file). ``format`` picks the
    per-step file format for a directory: ``npz`` (default), ``safetensors``, ``hdf5``.
    """

    def __init__(self, target: str, *, format: str = "npz", prefix: str = "step_", compress: bool = False,
                 force: bool = False):
        self.target = target
        self.prefix = prefix
        self.compress = compress
        self.force = force
        ext = os.path.splitext(target)[1].lower()
        self.history_file = ext in (".h5", ".hdf5")
        if not self.history_file:
            if format not in ("npz", "safetensors", "hdf5"):
                raise UsageError(f"Recorder format must be npz, safetensors or hdf5, not {format!r}")
            os.makedirs(target, exist_ok=True)
        self.format = "hdf5" if self.history_file else format

    def path_for(self, step: int) -> str:
        ext = {"npz": ".npz", "safetensors": ".safetensors", "hdf5": ".h5"}[self.format]
        return os.path.join(self.target, f"{self.prefix}{step:08d}{ext}")

    def write(self, step: int, grads: Mapping[str, Any], **scalars: Any) -> str:
        """Record ``grads`` (name -> tensor) for ``step`` with numeric ``scalars`` (loss, lr, ...) as metadata."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise UsageError(f"step must be an integer, not {step!r}")
        step = int(step)
        meta = {"step": step, **{k: _scalar(v) for k, v in scalars.items()}}
        if self.history_file:
            return self._append_group(step, grads, meta)
        from .io.dump import save_dump

        return save_dump(self.path_for(step), grads, meta, format=self.format, force=self.force,
                         compress=self.compress)

    def _append_group(self, step: int, grads: Mapping[str, Any], meta: dict[str, Any]) -> str:
        import h5py

        from .io.base import TensorInfo, check_tensor_name
        from .io.hdf5 import Hdf5Writer

        group = f"{self.prefix}{step:08d}"
        with h5py.File(self.target, "a", track_order=True) as f:
            if group in f:
                if not self.force:
                    raise UsageError(f"{self.target}: step {step} is already recorded")
                del f[group]
            w = Hdf5Writer(self.target, file=f)
            w.begin_step(group, meta)
            for name, t in grads.items():
                a = to_numpy(t, name)
                w.add(TensorInfo(check_tensor_name(name, self.target), tuple(a.shape), a.dtype), a)
            f.flush()
        return self.target


def record(target: str, step: int, grads: Mapping[str, Any], **scalars: Any) -> str:
    """One-shot form of :class:`Recorder` ``(target).write(step, grads, **scalars)``."""
    return Recorder(target).write(step, grads, **scalars)
