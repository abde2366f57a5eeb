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
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from .errors import OutputError, UsageError


# PyTorch dtypes NumPy lacks -> (the same-width integer dtype PyTorch can export, the ml_dtypes type)
_TORCH_BITS_AS = {"torch.bfloat16": ("int16", "bfloat16"), "torch.float8_e4m3fn": ("uint8", "float8_e4m3fn"),
                  "torch.float8_e5m2": ("uint8", "float8_e5m2")}


def _torch_bits_as_ml_dtypes(x: Any) -> np.ndarray | None:
    """A PyTorch bfloat16/float8 tensor (on the host) as the ml_dtypes array with the same bits: PyTorch
    exports neither dtype through ``__array__`` or DLPack to NumPy, but it does export the integers of the
    same width, which ``.view`` reinterprets exactly. None for anything else."""
    wanted = _TORCH_BITS_AS.get(str(getattr(x, "dtype", "")))
    if wanted is None or not type(x).__module__.startswith("torch"):
        return None
    import sys

    import ml_dtypes

    torch = sys.modules["torch"]  # imported already: x is one of its tensors
    bits = x.contiguous().view(getattr(torch, wanted[0])).numpy()
    return bits.view(getattr(ml_dtypes, wanted[1]))


NO_GRADIENTS = ("recorded before loss.backward() or after optimizer.zero_grad()? a frozen parameter? under "
                "DeepSpeed ZeRO p.grad stays None: pass deepspeed.utils.safe_get_full_grad(p)")


# TensorFlow's and Keras's variables (the weights): ``model.trainable_variables`` where its gradients were
# meant; NumPy reads them as arrays, so the weights were recorded as if they were gradients
_VARIABLE_CLASSES = frozenset({"ResourceVariable", "UninitializedVariable", "Variable", "KerasVariable",
                               "AutoCastVariable", "MirroredVariable", "SyncOnReadVariable",
                               "DistributedVariable"})
_VARIABLE_MODULES = ("tensorflow", "keras", "tf_keras")


def _is_variable(x: Any) -> bool:
    cls = type(x)
    return cls.__name__ in _VARIABLE_CLASSES and cls.__module__.startswith(_VARIABLE_MODULES)


def _is_dtensor(x: Any) -> bool:
    """True for a PyTorch DTensor (FSDP2's and tensor parallelism's gradients): a wrapper whose data is
    each rank's piece, reached through ``to_local()``; NumPy reading it directly reads no real data."""
    return type(x).__name__ == "DTensor" and type(x).__module__.startswith("torch.distributed")


def dtensor_piece(x: Any, name: str, sharded: bool) -> Any:
    """This rank's piece of the DTensor ``x`` as a plain tensor: the whole tensor when its mesh is one
    rank; with ``sharded`` (a Recorder with ``shard``, whose pieces gradtool adds up) the local shard of
    a tensor sharded on every mesh dimension. Anything else is refused: a piece replicated on other
    ranks would count once per rank, a partial one is not reduced yet."""
    ranks = x.device_mesh.size()
    if ranks == 1:
        return x.to_local()
    placements = tuple(x.placements)
    if not sharded:
        raise UsageError(f"tensor {name!r} is a DTensor spread over {ranks} ranks ({placements}): record "
                         "each rank's piece with Recorder(..., shard=f'rank{rank}') (gradtool adds the "
                         "pieces up), or pass .full_tensor() (an all-gather, called on every rank)")
    if not all(p.is_shard() for p in placements):
        raise UsageError(f"tensor {name!r} is a DTensor with placements {placements}: a Replicate piece is "
                         "held by several ranks and would count once per rank, a Partial one is not reduced "
                         "yet; record .full_tensor() from one rank instead")
    return x.to_local()


def to_numpy(x: Any, name: str = "tensor") -> np.ndarray:
    """A host NumPy array from any array-like, without importing its framework. PyTorch bfloat16 and
    float8 tensors become ml_dtypes arrays with the same bits; a DTensor on one rank its local tensor
    (on several: see :func:`dtensor_piece`)."""
    if isinstance(x, np.ndarray):
        return x
    if x is None:
        raise UsageError(f"tensor {name!r} is None: it has no gradient ({NO_GRADIENTS})")
    if type(x).__name__ == "Parameter" and type(x).__module__.startswith("torch"):
        raise UsageError(f"tensor {name!r} is a torch.nn.Parameter (the weights), not its gradient: pass "
                         "p.grad (or p.detach() to record the weights themselves)")
    if _is_variable(x):
        raise UsageError(f"tensor {name!r} is a {type(x).__name__} (the weights), not its gradient: pass the "
                         "gradients, tape.gradient(loss, model.trainable_variables) (or v.numpy() to record "
                         "the weights themselves)")
    if _is_dtensor(x):
        x = dtensor_piece(x, name, sharded=False)
    for attr in ("detach",):  # PyTorch tensors that require grad refuse __array__/dlpack export
        if hasattr(x, attr) and hasattr(x, "requires_grad"):
            x = x.detach()
            if hasattr(x, "cpu"):
                x = x.cpu()
    x = _sparse_as_dense(x, name)
    if isinstance(x, np.ndarray):
        return x
    if (bits := _torch_bits_as_ml_dtypes(x)) is not None:
        return bits
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
        raise UsageError(f"cannot convert tensor {name!r} ({type(x).__name__}) to an array: {exc}") from None
    if a.dtype.hasobject:
        raise UsageError(f"tensor {name!r} is not numeric ({type(x).__name__})")
    return a


_INDEXED_SLICES_PARTS = ("values", "indices", "dense_shape")


def _sparse_as_dense(x: Any, name: str) -> Any:
    """A sparse gradient as the dense gradient it stands for, or ``x`` itself when it is not sparse.
    Rows given more than once are added up, as the optimizer applies them to the weights:

    - a PyTorch sparse tensor (the gradient of ``nn.Embedding(sparse=True)``): ``x.to_dense()``;
    - a TensorFlow ``IndexedSlices`` (the gradient of ``tf.gather``, so of a Keras ``Embedding``):
      ``dense[indices[i]] += values[i]`` over ``dense = zeros(dense_shape)``, what
      ``tf.convert_to_tensor`` gives (``unsorted_segment_sum``). TensorFlow's own ``global_norm`` and
      ``clip_by_norm`` of an IndexedSlices take the norm of ``values``, repeated rows apart (README)."""
    if str(getattr(x, "layout", "")).startswith("torch.sparse") and hasattr(x, "to_dense"):
        return x.to_dense()
    if type(x).__name__ != "IndexedSlices" or not all(hasattr(x, a) for a in _INDEXED_SLICES_PARTS):
        return x
    if x.dense_shape is None:
        raise UsageError(f"tensor {name!r} is an IndexedSlices without a dense_shape (the shape of the "
                         "gradient it is part of): pass tf.convert_to_tensor(g) to record it")
    values = to_numpy(x.values, name)
    indices = to_numpy(x.indices, name)
    shape = tuple(int(d) for d in to_numpy(x.dense_shape, name).reshape(-1))
    if (indices.ndim != 1 or indices.dtype.kind not in "iu" or not shape
            or values.shape != (len(indices), *shape[1:])):
        raise UsageError(f"tensor {name!r} is an IndexedSlices whose values {values.shape} and indices "
                         f"{indices.shape} ({indices.dtype}) do not make a tensor of shape {shape}")
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= shape[0]):
        raise UsageError(f"tensor {name!r} is an IndexedSlices with indices outside 0..{shape[0] - 1}")
    dense = np.zeros(shape, values.dtype)
    np.add.at(dense, indices, values)
    return dense


def flatten_tensors(tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """(name, tensor) pairs from a mapping of names to tensors or an iterable of pairs; a value that is
    itself a mapping, list or tuple (a JAX/Flax or Haiku gradient pytree) is flattened with its keys
    joined by "/": ``{"params": {"Dense_0": {"kernel": g}}}`` -> ``("params/Dense_0/kernel", g)``, a
    list's items by index, a NamedTuple's by field name. Two paths to one name (``{"a/b": x, "a": {"b":
    y}}``) are refused as duplicate names by the writer."""
    out: list[tuple[str, Any]] = []

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                visit(f"{prefix}/{k}", v)
        elif isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (optax states): by field
            for k, v in zip(value._fields, value):
                visit(f"{prefix}/{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                visit(f"{prefix}/{i}", v)
        else:
            out.append((prefix, value))

    for name, value in (tensors.items() if isinstance(tensors, Mapping) else tensors):
        visit(str(name), value)
    return out


def _numpy_dtype_of(x: Any) -> np.dtype | None:
    """The NumPy dtype that :func:`to_numpy` gives ``x``, known without converting it: for NumPy, CuPy and
    JAX arrays (whose ``dtype`` is a NumPy dtype) and PyTorch tensors; None for anything else."""
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, np.dtype):
        return dtype
    text = str(dtype)
    if type(x).__module__.startswith("torch") and text.startswith("torch."):
        if text in _TORCH_BITS_AS:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, _TORCH_BITS_AS[text][1]))
        try:
            return np.dtype(text[len("torch."):])
        except TypeError:
            return None
    return None


def tensor_shape_and_dtype(x: Any) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of ``x`` as :func:`to_numpy` will give it, without a copy to the host; None when
    that cannot be known without converting (the caller converts it then)."""
    if type(x).__name__ == "Parameter" or _is_variable(x) or (_is_dtensor(x) and x.device_mesh.size() > 1):
        return None  # to_numpy says what it is
    dtype = _numpy_dtype_of(x)
    shape = getattr(x, "shape", None)
    if dtype is None or shape is None:
        return None
    try:
        return tuple(int(d) for d in shape), dtype
    except (TypeError, ValueError):
        return None


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

    ``shard`` (e.g. ``f"rank{rank}"``) records one rank's part of a sharded step (FSDP, ZeRO, tensor
    parallel): each rank writes ``{target}/{prefix}{step:08d}/{shard}{ext}``, the layout gradtool reads
    as sharded steps (same-named pieces of one tensor add up). Under plain data parallelism (DDP) every
    rank holds the same averaged gradients: record them on one rank, without ``shard``.

    ``fsync=False`` skips the flush to disk of each step's file (each write is still atomic: a file is
    whole or absent, but a power cut may lose the last steps), ~30 % less time per step in a training loop.
    """

    def __init__(self, target: str, *, format: str = "npz", prefix: str = "step_", compress: bool = False,
                 force: bool = False, shard: str | None = None, fsync: bool = True):
        self.target = target
        self.prefix = prefix
        self.compress = compress
        self.force = force
        ext = os.path.splitext(target)[1].lower()
        self.history_file = ext in (".h5", ".hdf5")
        if shard is not None:
            if self.history_file:
                raise UsageError(f"{target}: shards go to a directory (one file per rank and step), "
                                 "not into one HDF5 file that every rank would write at once")
            if not isinstance(shard, str) or not shard or shard != os.path.basename(shard) \
                    or shard.startswith(".") or "\\" in shard:
                raise UsageError(f"shard must be a plain file name such as 'rank0', not {shard!r}")
        self.shard = shard
        self.fsync = fsync
        if not self.history_file:
            if format not in ("npz", "safetensors", "hdf5"):
                raise UsageError(f"Recorder format must be npz, safetensors or hdf5, not {format!r}")
            os.makedirs(target, exist_ok=True)
        self.format = "hdf5" if self.history_file else format

    def path_for(self, step: int) -> str:
        ext = {"npz": ".npz", "safetensors": ".safetensors", "hdf5": ".h5"}[self.format]
        if self.shard is not None:
            return os.path.join(self.target, f"{self.prefix}{step:08d}", f"{self.shard}{ext}")
        return os.path.join(self.target, f"{self.prefix}{step:08d}{ext}")

    def write(self, step: int, grads: Mapping[str, Any], **scalars: Any) -> str:
        """Record ``grads`` (name -> tensor) for ``step`` with numeric ``scalars`` (loss, lr, ...) as metadata."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise UsageError(f"step must be an integer, not {step!r}")
        step = int(step)
        meta = {"step": step, **{k: _scalar(v) for k, v in scalars.items()}}
        items = flatten_tensors(grads)
        if self.shard is not None:  # FSDP2 / tensor-parallel DTensors: this rank's shard of each
            items = [(n, dtensor_piece(t, n, sharded=True) if _is_dtensor(t) else t) for n, t in items]
        elif not items:  # (a rank may hold none of a sharded step's tensors; a whole step of none is amiss)
            raise UsageError(f"no tensors to record for step {step} ({NO_GRADIENTS})")
        if self.history_file:
            return self._append_group(step, items, meta)
        from .io.dump import save_dump

        path = self.path_for(step)
        if self.shard is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)  # every rank may make it; exist_ok is race-safe
        return save_dump(path, items, meta, format=self.format, force=self.force, compress=self.compress,
                         fsync=self.fsync)

    def _append_group(self, step: int, grads: list[tuple[str, Any]], meta: dict[str, Any]) -> str:
        """Write the step into a group ``NAME.partial`` without attributes, then give it its attributes
        (``step`` among them) and its name: a write that fails (a tensor that cannot be converted or
        stored, Ctrl-C) removes the partial group and leaves the file as it was: no phantom step of zero
        tensors, and the step it was to replace (``force``) still there; a file this first write created is
        removed again (an empty HDF5 file read as a dump of no tensors, global norm 0). A writer killed
        outright leaves a group without a ``step`` attribute, which readers do not take for a step; the
        next write removes it."""
        import h5py

        from .io.base import check_tensor_name, check_unique

        items = [(check_tensor_name(n, self.target), t) for n, t in grads]  # flattened by write()
        check_unique([n for n, _ in items], self.target)
        group = f"{self.prefix}{step:08d}"
        partial = f"{group}.partial"
        created = not os.path.exists(self.target)
        try:
            return self._append_to(h5py, step, group, partial, items, meta)
        except BaseException:
            if created and _holds_nothing(h5py, self.target):
                os.unlink(self.target)
            raise

    def _append_to(self, h5py: Any, step: int, group: str, partial: str, items: list[tuple[str, Any]],
                   meta: dict[str, Any]) -> str:
        """The write of :meth:`_append_group`, in the history file opened to append to."""
        from .io.base import TensorInfo
        from .io.hdf5 import Hdf5Writer

        with _open_for_append(h5py, self.target, step) as f:
            if group in f and not self.force:
                raise UsageError(f"{self.target}: step {step} is already recorded")
            if partial in f:
                del f[partial]
            w = Hdf5Writer(self.target, file=f)
            w.begin_step(partial, {})
            try:
                for name, t in items:  # one host copy at a time
                    a = to_numpy(t, name)
                    w.add(TensorInfo(name, tuple(a.shape), a.dtype), a)
                    del a
                w.set_group_attrs("", meta)  # the step (first, as before) and the scalars
                if group in f:
                    del f[group]
                f.move(partial, group)
            except BaseException:
                del f[partial]
                raise
            f.flush()
        return self.target


def _holds_nothing(h5py: Any, path: str) -> bool:
    """True when the HDF5 file at ``path`` has no members and no attributes (False when it cannot be read)."""
    try:
        with h5py.File(path, "r") as f:
            return len(f) == 0 and len(f.attrs) == 0
    except (OSError, ValueError):
        return False


LOCK_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # seconds between attempts on a locked history file: ~3 s


def _open_for_append(h5py: Any, target: str, step: int) -> Any:
    """The history file, opened to append to. Another process's HDF5 lock on it (a reader holding it open:
    h5py in a notebook, HDFView, h5ls; gradtool itself reads without one) is waited out for ~3 s, then an
    OutputError says what holds it; the training run decides whether a lost step is fatal."""
    for wait in LOCK_WAITS:
        try:
            return h5py.File(target, "a", track_order=True)
        except BlockingIOError:
            time.sleep(wait)
    try:
        return h5py.File(target, "a", track_order=True)
    except BlockingIOError:
        raise OutputError(
            f"{target}: step {step} not recorded: another process holds the file open (h5py in a notebook, "
            "HDFView, h5ls, another Recorder?) and HDF5 locks it; close it there, or record to a directory "
            "(Recorder('grads/')), one file per step") from None


def record(target: str, step: int, grads: Mapping[str, Any], **scalars: Any) -> str:
    """One-shot form of :class:`Recorder` ``(target).write(step, grads, **scalars)``."""
    return Recorder(target).write(step, grads, **scalars)
