"""HDF5 dumps through h5py: tensors anywhere in the group tree, one step per file or many steps per file.

* A tensor's name is its dataset path relative to the dump's root group, without the leading ``/``.
* A *history file* holds several steps as top-level groups that carry an integer ``step`` attribute;
  each such group is one dump (its attributes are that step's metadata). A file whose top level is only
  groups named as steps (``step_100``, ``iter-5``: :func:`~gradtool.io.base.steps_of_names`) is one too,
  with the steps their names give. Otherwise the file is one dump and the root group's attributes are its
  metadata.
* Only hard links are followed, and each object is visited once, so link cycles cannot loop. A soft link
  names an object of the same file (read once, under its hard link's name) or nothing. Data in other
  files is refused, not skipped (a tensor left out would make a smaller global norm without a word):
  external links, user-defined links, and datasets whose data lies in other files (raw external
  storage, virtual datasets).
* Writing keeps names, order (creation order is tracked), group structure, group and dataset attributes,
  soft links, second hard links to an object and gzip compression. HDF5 has no bfloat16; such dumps must
  be written as safetensors.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import InputError, UnsafeInputError, listed
from . import h5header, h5inflate
from .atomic import preallocate, settle_truncation
from .base import (
    DumpReader,
    DumpWriter,
    TensorInfo,
    allocate,
    check_dtype,
    check_shape,
    copy_range,
    metadata_step,
    numbered_names,
    physical_memory,
    pwrite_all,
    steps_of_names,
)

MAGIC = b"\x89HDF\r\n\x1a\n"
OPEN_DATASETS = 32  # datasets a reader keeps open at once (see Hdf5Reader._dataset)
SMALL_DATASET_BYTES = 1 << 20  # a chunked or compact dataset this small is read whole, by one HDF5 read


def _h5py() -> Any:
    import h5py

    return h5py


def _attrs(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in obj.attrs:
        try:
            v = obj.attrs[k]
        except Exception:  # unreadable attribute types (references, exotic compounds) are dropped
            continue
        out[k] = v
    return out


def _plain(v: Any) -> Any:
    """An attribute value as plain JSON-able Python (for metadata)."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return v.tolist() if v.dtype.kind in "biuf" else str(v)
    return v


_READ_INSIDE = ("not read (gradtool reads only data inside the dump it is given; copy the data into the file "
                "to read it)")


def _link_outside(h5py: Any, gid: Any, key: bytes) -> str | None:
    """What a link of a group (by its low-level id) names outside the file, said for a message, or None
    for a hard or soft link: an external link's file and path, or a user-defined link's type."""
    kind = gid.links.get_info(key).type
    if kind in (h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT):
        return None
    if kind == h5py.h5l.TYPE_EXTERNAL:
        file, path = gid.links.get_val(key)
        return f"is an external link to {os.fsdecode(file)!r}:{path.decode('utf-8', 'replace')}"
    return f"is a user-defined link (type {kind})"


def _first_link_outside(h5py: Any, gid: Any, soft: dict[bytes, bytes] | None = None,
                        hard_links: list[bytes] | None = None) -> bytes | None:
    """The path (below the group) of the first external or user-defined link in a group's tree, found by
    one ``H5Lvisit`` (hard links followed, ~1 ms for a 148-tensor dump), or None; the soft links before it
    go into ``soft`` (path -> the path it names), the hard links' paths into ``hard_links``."""
    hard, soft_type = h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT

    def visit(key: bytes, info: Any) -> bytes | None:
        if info.type == hard:
            if hard_links is not None:
                hard_links.append(key)
            return None
        if info.type != soft_type:
            return key
        if soft is not None:
            soft[key] = gid.links.get_val(key)
        return None

    return gid.links.visit(visit, info=True)


def _as_h5py_sees(h5py: Any, dsid: Any, found: h5header.Contiguous | h5header.Deflated
                  ) -> h5header.Contiguous | h5header.Deflated | None:
    """What h5py says of a dataset (by its low-level id) in the terms of :func:`.h5header.read_dataset`
    and of the kind of its answer ``found``: to check that answer. None when h5py says it is not of that
    kind."""
    shape, dtype = tuple(dsid.shape), dsid.dtype
    try:
        if isinstance(found, h5header.Contiguous):
            offset = dsid.get_offset()
            return None if offset is None else h5header.Contiguous(shape, dtype, offset)
        dcpl = dsid.get_create_plist()
        filters = [dcpl.get_filter(i) for i in range(dcpl.get_nfilters())]  # (code, flags, values, name)
        codes = [f[0] for f in filters]
        deflate, shuffle = h5py.h5z.FILTER_DEFLATE, h5py.h5z.FILTER_SHUFFLE
        if dcpl.get_layout() != h5py.h5d.CHUNKED or codes not in ([deflate], [shuffle, deflate]):
            return None
        chunk = tuple(int(c) for c in dcpl.get_chunk())
        chunks = {}
        for i in range(dsid.get_num_chunks()):
            info = dsid.get_chunk_info(i)
            if info.filter_mask or info.byte_offset is None:
                return None
            chunks[tuple(o // c for o, c in zip(info.chunk_offset, chunk))] = (info.byte_offset, info.size)
        return h5header.Deflated(shape, dtype, chunk, len(codes) == 2, filters[-1][2][0], found.tree, chunks)
    except Exception:  # (h5py's errors on anything it cannot answer)
        return None


def _data_outside(h5py: Any, dsid: Any) -> str | None:
    """Where a dataset (by its low-level id) keeps its data outside its file, said for a message, or None.
    Raw external storage (``external=`` in h5py) names any file on the disk, read as the dataset's bytes:
    a dump could copy a private file into a clipped output. A virtual dataset maps other files' datasets,
    and reads its fill value where a source is missing: a silent "norm 0"."""
    dcpl = dsid.get_create_plist()
    if dcpl.get_layout() == h5py.h5d.VIRTUAL:
        files = dict.fromkeys(dcpl.get_virtual_filename(i) for i in range(dcpl.get_virtual_count()))
        return f"is a virtual dataset mapped from {listed(files, 3, repr)}"
    if n := dcpl.get_external_count():
        files = dict.fromkeys(os.fsdecode(dcpl.get_external(i)[0]) for i in range(n))
        return f"keeps its data in external file(s) {listed(files, 3, repr)}"
    return None


def _variable_length_kind(h5py: Any, dtype: np.dtype) -> str:
    """What a dataset of one of h5py's object dtypes holds, said for a message."""
    if h5py.check_string_dtype(dtype) is not None:
        return ("a string dataset, not a numeric tensor (keep text as an attribute, f.attrs[...]: gradtool "
                "reads those as metadata)")
    if h5py.check_ref_dtype(dtype) is not None:
        return "a dataset of HDF5 references, not a numeric tensor"
    if h5py.check_vlen_dtype(dtype) is not None:
        return "a dataset of variable-length sequences, not a numeric tensor"
    return "a dataset of compound values with variable-length fields, not a numeric tensor"


def _decode(name: bytes, display: str) -> str:
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{display}: object name {name!r} is not valid UTF-8") from None


_COMMON_TYPES: list[tuple[Any, np.dtype]] = []


def _dtype_of(h5py: Any, dsid: Any) -> np.dtype:
    """The dataset's NumPy dtype. h5py's ``dsid.dtype`` converts the HDF5 type anew for each dataset (23 us,
    3.4 ms of a 148-dataset open); the common types (those of :data:`.h5header.COMMON_TYPES`) are
    recognised by ``H5Tequal`` instead, which is exact (byte order, precision, offset and padding), and
    anything else is converted as before."""
    if not _COMMON_TYPES:
        _COMMON_TYPES.extend((h5py.h5t.py_create(dtype), dtype) for _, dtype in h5header.COMMON_TYPES)
    tid = dsid.get_type()
    for h5type, dtype in _COMMON_TYPES:
        if tid.equal(h5type):
            return dtype
    return dsid.dtype


def open_h5(path: str, display: str) -> Any:
    """The file, read-only and without HDF5's file lock: a reader's lock made a training run's writer
    (``Recorder("run.h5")``) fail with "unable to lock file" for as long as gradtool read the file, and
    the writer's lock refused gradtool. The Recorder writes a step as a group without its ``step``
    attribute until it is whole, so a step being written is not read as one. HDF5 wants one locking
    choice per file in a process: a file this process holds open with the lock is opened with it too
    (one opened by gradtool first must be opened by others with ``locking=False``)."""
    h5py = _h5py()
    try:
        try:
            f = h5py.File(path, "r", locking=False)
        except OSError as exc:
            if "locking flag" not in str(exc):
                raise
            return h5py.File(path, "r")  # open in this process already, with the lock: HDF5 wants the same
            # (and its cache settings are that opener's: left as they are)
    except (OSError, ValueError) as exc:
        raise InputError(f"{display}: not a readable HDF5 file ({exc})") from None
    _cap_metadata_cache(f)
    return f


# HDF5's metadata cache (object headers, B-tree nodes, heaps) may grow to 32 MB of on-disk images, which
# hold ~10x that once decoded: indexing 20,000 datasets left ~40 MB more in the process (and the bytes
# stay with it). Readers and writers meet each object once, so a small cache loses nothing: 512 KiB took
# `stats` of 20,000 datasets from 159 to 117 MB, and no longer (64 KiB did: the group's own nodes thrash).
METADATA_CACHE_BYTES = 512 << 10


def _cap_metadata_cache(f: Any) -> None:
    """Cap the metadata cache of the open file ``f`` at METADATA_CACHE_BYTES (HDF5 ≥ 1.8's own setting,
    kept with the file while it is open in this process)."""
    c = f.id.get_mdc_config()
    c.set_initial_size, c.initial_size = True, min(c.initial_size, METADATA_CACHE_BYTES)
    c.min_size, c.max_size = min(c.min_size, METADATA_CACHE_BYTES), METADATA_CACHE_BYTES
    f.id.set_mdc_config(c)


def _step_of(h5py: Any, gid: Any) -> int | None:
    """The integer ``step`` attribute of a group (by its low-level id), or None (absent, not an integer)."""
    if not h5py.h5a.exists(gid, b"step"):
        return None
    s = h5py.Group(gid).attrs["step"]
    if isinstance(s, np.ndarray) and s.size == 1:
        s = s.reshape(()).item()
    if isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)):
        return int(s)
    return None


def step_groups(f: Any, display: str, *, numbered: bool = False) -> list[tuple[str, int]]:
    """Top-level groups with an integer ``step`` attribute, as (group name, step), in file order; when
    none has one, the top-level groups as the steps their names give, if every top-level object is such
    a group (``f"step_{step}"``, written without the attribute: read as one dump, its global norm and
    global-norm clipping ran over every step at once), or, with ``numbered``, is named by a bare number
    (``f"{step}"``). A top-level external or user-defined link is refused (it could be a step)."""
    h5py = _h5py()
    out = []
    groups, others = [], 0  # the top-level hard-linked groups' names; the count of other objects
    for key in f.id:
        kind = f.id.links.get_info(key).type
        if kind not in (h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT):
            raise InputError(f"{display}: {_decode(key, display)!r} {_link_outside(h5py, f.id, key)}: "
                             f"{_READ_INSIDE}")
        if kind != h5py.h5l.TYPE_HARD:
            continue  # only hard links are followed
        if h5py.h5o.get_info(f.id, key).type != h5py.h5o.TYPE_GROUP:
            others += 1
            continue
        groups.append(_decode(key, display))
        s = _step_of(h5py, h5py.h5g.open(f.id, key))
        if s is not None:
            out.append((groups[-1], s))
    if not out and not others:
        steps = steps_of_names(groups)
        if steps is None and numbered:
            steps = numbered_names(groups)
        if steps is not None:
            return list(zip(groups, steps))
    return out


def _tree(h5py: Any, gid: Any) -> list[tuple[bytes, Any, Any]]:
    """The objects under a group (by its low-level id), in visiting order: (name, shape, dtype) for a
    dataset, (name, object type, None) for the others."""
    tree: list[tuple[bytes, Any, Any]] = []

    def visit(name: bytes, info: Any) -> None:
        if info.type == h5py.h5o.TYPE_DATASET:
            dsid = h5py.h5d.open(gid, name)
            tree.append((name, dsid.shape, dsid.dtype))
        else:
            tree.append((name, info.type, None))

    h5py.h5o.visit(gid, visit, info=True)
    return tree


def group_step(f: Any, display: str, group: str, *, numbered: bool = False) -> int | None:
    """The step of the group at path ``group`` (``step_100``, ``run/step_100``: a ``FILE::GROUP`` argument),
    after checking that hard links lead to it and that it is a group: its integer ``step`` attribute, else
    the step a top-level group's name gives (``step_100``; ``100`` with ``numbered``), else None."""
    h5py = _h5py()
    parts = [part for part in group.split("/") if part]
    if not parts:
        raise InputError(f"{display}: FILE::GROUP without a group (e.g. run.h5::step_100)")
    gid = f.id
    for i, part in enumerate(parts):
        where, key = "/".join(parts[: i + 1]), part.encode("utf-8", "surrogateescape")
        try:
            found = part not in (".", "..") and gid.links.exists(key)
        except (KeyError, ValueError, RuntimeError):
            found = False
        if not found:
            raise InputError(f"{display}: no group {where!r}")
        if (outside := _link_outside(h5py, gid, key)) is not None:
            raise InputError(f"{display}: {where!r} {outside}: {_READ_INSIDE}")
        if gid.links.get_info(key).type != h5py.h5l.TYPE_HARD:
            raise InputError(f"{display}: {where!r} is a soft link; give the group it points to")
        if h5py.h5o.get_info(gid, key).type != h5py.h5o.TYPE_GROUP:
            raise InputError(f"{display}: {where!r} is not a group (FILE::GROUP names the group of a step)")
        gid = h5py.h5g.open(gid, key)
    step = _step_of(h5py, gid)
    if step is None and len(parts) == 1:
        named = steps_of_names(parts) or (numbered_names(parts) if numbered else None)
        step = named[0] if named else None
    return step


def numbered_groups_doubt(f: Any, display: str) -> str | None:
    """What a user should hear about a file read as one dump whose top-level objects are two or more
    groups named by bare numbers that hold the same tensors (names, shapes, dtypes): the steps of a history
    written as ``f.create_group(str(step))``, read as one dump (one global norm over every step) unless
    ``--numbered-groups-are-steps`` says they are steps. None otherwise: an ``nn.Sequential``'s layers
    (``0/weight``, ``2/weight``) differ in shape, but a stack of identical blocks is told too. Compares
    each group with the first, stopping at the first that differs."""
    h5py = _h5py()
    fid = f.id
    keys = list(fid)
    names = [_decode(k, display) for k in keys]
    if len(keys) < 2 or numbered_names(names) is None:
        return None
    first = None
    for key in keys:
        if (fid.links.get_info(key).type != h5py.h5l.TYPE_HARD
                or h5py.h5o.get_info(fid, key).type != h5py.h5o.TYPE_GROUP):
            return None
        tree = _tree(h5py, h5py.h5g.open(fid, key))
        if first is None:
            first = tree
        elif tree != first:
            return None
    tensors = sum(dtype is not None for _, _, dtype in first or ())
    if not tensors:
        return None
    return (f"{display}: its {len(keys)} top-level groups are named by numbers ({listed(names, 3)}) and "
            f"each holds the same {tensors} tensor(s): read as one dump (an nn.Sequential's layers look so); "
            "if they are training steps, add --numbered-groups-are-steps")


class Hdf5Reader(DumpReader):
    format = "hdf5"

    def __init__(self, path: str, *, group: str | None = None, display_path: str | None = None, _file: Any = None):
        super().__init__(path, display_path=display_path)
        self._f = _file or open_h5(path, self.display_path)
        self._own = _file is None
        self.group = group
        try:
            self._index()
        except InputError:
            self.close()
            raise
        except Exception as exc:  # h5py raises KeyError/OSError/RuntimeError on corrupt internals
            self.close()
            raise InputError(f"{self.display_path}: corrupt HDF5 file ({type(exc).__name__}: {exc})") from None
        self._validate_index()

    @property
    def step(self) -> int | None:
        """The ``step`` attribute, else the step a top-level group's name gives (``step_100``: a history
        written without the attribute, whose steps the commands take from these names)."""
        step = metadata_step(self.metadata)
        if step is None and self.group is not None and (named := steps_of_names([self.group.strip("/")])):
            return named[0]
        return step

    def _index(self) -> None:
        """Walk the group tree with one ``H5Ovisit``: hard links only, each object once, depth first, each
        group's links in creation order where the group tracks it and in name order where not (the order of
        h5py's own group iteration). The high-level objects cost ~15 ms more for a 148-dataset dump, and a
        Python loop over each group's links with a lookup per link ~2 ms more. Contiguous datasets are
        remembered by their file offset and not kept open; the others (chunked, compressed, compact,
        external) keep their high-level ``Dataset``."""
        h5py = _h5py()
        root = self._f if self.group is None else self._f[self.group]
        self._root = root
        self.metadata = {k: _plain(v) for k, v in _attrs(root).items()}
        self._offsets: dict[str, int] = {}
        self._deflated: dict[str, h5inflate.DeflatePlan] = {}  # gzip datasets read from their headers
        self._plans: dict[str, h5inflate.DeflatePlan | None] = {}
        self._datasets: dict[str, Any] = {}  # the datasets open (see _dataset)
        self._datasets_lock = threading.Lock()
        p = self.display_path
        h5o, h5d, h5g = h5py.h5o, h5py.h5d, h5py.h5g
        rid = root.id
        fcpl = self._f.id.get_create_plist()
        # plain contiguous datasets from their object headers (h5header): 8-byte addresses, no user block
        headers = fcpl.get_sizes() == (8, 8) and fcpl.get_userblock() == 0
        file_size = os.fstat(self._fd()).st_size if headers else 0
        checked: set[bool] = set()  # the first dataset of each kind read from its header (deflated or not)
        # is checked against h5py

        def visit(key: bytes, info: Any) -> None:
            nonlocal headers, objects
            objects += 1
            name = _decode(key, p)
            if info.type == h5o.TYPE_DATASET:
                found = None
                if headers and not info.num_attrs:  # attributes: h5py reads them
                    found = h5header.read_dataset(self._fd(), info.addr, file_size)
                dsid = None
                if found is not None and (deflated := isinstance(found, h5header.Deflated)) not in checked:
                    checked.add(deflated)
                    dsid = h5d.open(rid, key)
                    if _as_h5py_sees(h5py, dsid, found) != found:
                        headers, found = False, None  # not what h5header expects: h5py for this file
                if found is None:
                    self._add_dataset(name, dsid if dsid is not None else h5d.open(rid, key), info.num_attrs)
                elif isinstance(found, h5header.Contiguous):
                    self._add_contiguous(name, *found)
                else:
                    self._add_deflated(name, found)
            elif info.type == h5o.TYPE_GROUP:
                top = self.group is None and b"/" not in key
                if top:
                    top_groups.append(name)
                if top or info.num_attrs:
                    sub = h5g.open(rid, key)
                    if top and _step_of(h5py, sub) is not None:
                        raise InputError(f"{p}: holds several steps; open one of its step groups")
                    self.group_attrs[name] = _attrs(h5py.Group(sub)) if info.num_attrs else {}
                else:
                    self.group_attrs[name] = {}

        top_groups: list[str] = []
        objects = 0  # objects below the root, each visited once
        h5o.visit(rid, visit, info=True, idx_type=h5py.h5.INDEX_CRT_ORDER)  # name order where not tracked
        if (top_groups and all("/" in t.name for t in self.tensors)
                and steps_of_names(top_groups) is not None):  # step_100/, step_200/, ...: as step_groups
            raise InputError(f"{p}: holds {len(top_groups)} step(s) as groups named by step; open one of "
                             "its step groups")
        soft: dict[bytes, bytes] = {}
        hard: list[bytes] = []
        if (key := _first_link_outside(h5py, rid, soft, hard)) is not None:
            raise InputError(f"{p}: {_decode(key, p)!r} {_link_outside(h5py, rid, key)}: {_READ_INSIDE}")
        self.soft_links = {_decode(k, p): _decode(v, p) for k, v in soft.items()}  # kept by clip's output
        if len(hard) > objects:  # an object under two names: H5Ovisit gave it once
            self.hard_links = self._aliases(h5py, rid, hard)
        self.compressed = bool(self._deflated)  # (summarised by inflating datasets on two threads)

    def _aliases(self, h5py: Any, rid: Any, hard: list[bytes]) -> dict[str, str]:
        """The second names of objects reached by several hard links (``hard``: every hard link's path, by
        ``H5Lvisit``), each -> the name the index gives the object (a tensor's or group's; "" for the
        root group, a link back to it)."""
        p = self.display_path
        indexed = {t.name for t in self.tensors} | set(self.group_attrs)
        root = h5py.h5o.get_info(rid).addr
        names: dict[int, list[str]] = {}
        for key in hard:
            names.setdefault(h5py.h5o.get_info(rid, key).addr, []).append(_decode(key, p))
        aliases = {}
        for addr, found in names.items():
            known = "" if addr == root else next((n for n in found if n in indexed), None)
            if known is not None:
                aliases.update((n, known) for n in found if n != known)
        return aliases

    def _add_contiguous(self, name: str, shape: tuple[int, ...], dtype: np.dtype, offset: int) -> None:
        """A dataset without attributes whose shape, dtype and data offset were read from its object header
        (:mod:`.h5header`): indexed without opening it."""
        p = self.display_path
        self._offsets[name] = offset
        self.tensors.append(TensorInfo(name, check_shape(shape, name, p), check_dtype(dtype, name, p)))

    def _add_deflated(self, name: str, found: h5header.Deflated) -> None:
        """A gzip dataset without attributes whose chunks were found from its object header and chunk
        B-tree (:func:`.h5header.read_dataset`): indexed without opening it, and read by inflating its
        chunks here (:meth:`_inflated`), not by HDF5."""
        p = self.display_path
        shape, dtype = check_shape(found.shape, name, p), check_dtype(found.dtype, name, p)
        self._deflated[name] = h5inflate.DeflatePlan(shape, found.chunk, found.shuffle,
                                                     h5inflate.compact_chunks(found.chunks or {}))
        self.tensors.append(TensorInfo(name, shape, dtype, compression="gzip", compression_opts=found.level))

    def _add_dataset(self, name: str, dsid: Any, num_attrs: int) -> None:
        h5py = _h5py()
        p = self.display_path
        space = dsid.get_space()
        if space.get_simple_extent_type() == h5py.h5s.NULL:
            raise InputError(f"{p}: dataset {name!r} has no data (null dataspace)")
        dtype = _dtype_of(h5py, dsid)
        if dtype.hasobject or dtype.kind == "S":  # h5py's object dtypes: HDF5's variable-length types
            raise InputError(f"{p}: tensor {name!r} is {_variable_length_kind(h5py, dtype)}")
        dtype = check_dtype(dtype, name, p)
        shape = check_shape(tuple(int(d) for d in space.shape), name, p)
        offset = dsid.get_offset()  # defined only for contiguous, allocated, non-external data (never filtered)
        ds = None
        compression = compression_opts = None
        if offset is None:
            if outside := _data_outside(h5py, dsid):
                raise InputError(f"{p}: dataset {name!r} {outside}: {_READ_INSIDE}")
            ds = h5py.Dataset(dsid)  # (not kept open: see _dataset)
            compression, compression_opts = ds.compression, ds.compression_opts
        else:
            self._offsets[name] = offset
        attrs = _attrs(ds if ds is not None else h5py.Dataset(dsid)) if num_attrs else {}
        self.tensors.append(TensorInfo(name, shape, dtype, attrs=attrs, compression=compression,
                                       compression_opts=compression_opts))

    def _dataset(self, name: str) -> Any:
        """The high-level dataset, opened when first asked for; the OPEN_DATASETS last asked for are kept
        open. HDF5 holds ~80 kB for an open filtered dataset: 20,000 gzip datasets kept open from the
        index on took 1.7 GB (and 14 s)."""
        with self._datasets_lock:
            ds = self._datasets.pop(name, None)
        if ds is None:
            ds = _h5py().Dataset(self._dataset_id(name))
        with self._datasets_lock:
            self._datasets[name] = ds  # (the last asked for last)
            while len(self._datasets) > OPEN_DATASETS:
                del self._datasets[next(iter(self._datasets))]
        return ds

    def _dataset_id(self, name: str) -> Any:
        """The low-level dataset (h5py's ``DatasetID``): the open one's, else opened for the caller alone."""
        with self._datasets_lock:
            ds = self._datasets.get(name)
        if ds is not None:
            return ds.id
        try:
            return _h5py().h5d.open(self._root.id, name.encode())
        except Exception as exc:  # h5py raises KeyError/OSError/RuntimeError on corrupt internals
            raise InputError(f"{self.display_path}: corrupt HDF5 file, dataset {name!r} "
                             f"({type(exc).__name__}: {exc})") from None

    def _read(self, info: TensorInfo) -> np.ndarray:
        if info.name in self._deflated:
            data = self._inflated(info)
            return (data if data.flags.writeable else data.copy()).reshape(info.shape)
        ds = self._dataset(info.name)
        out = allocate(info, self.display_path, read_from=self._offsets.get(info.name))  # contiguous: placed
        try:
            if info.size:
                ds.read_direct(out)
        except Exception as exc:
            raise InputError(f"{self.display_path}: cannot read dataset {info.name!r} ({exc})") from None
        return out

    def raw_location(self, info: TensorInfo) -> tuple[int, int] | None:
        if info.size == 0:
            return None
        offset = self._offsets.get(info.name)
        if offset is None:
            return None
        return self._checked_location(self._fd(), offset, info)

    def iter_chunks(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        if info.size == 0:
            return
        offset = self._offsets.get(info.name)
        if offset is not None:  # contiguous: read the bytes at their file offset
            yield from self._pread_chunks(self._fd(), offset, info, chunk_elements)
            return
        row = max(1, info.size // max(info.shape[0], 1) if info.shape else 1)
        rows = max(1, chunk_elements // row)
        plan = self._deflated.get(info.name)  # a gzip dataset read from its header: inflated here
        if plan is not None and (len(plan.chunks) == 1 or info.nbytes <= SMALL_DATASET_BYTES):
            data = self._inflated(info)  # (its few chunks, on this thread), in the blocks of whole rows
            step = rows * row  # the paths below give (the same statistics, bit for bit)
            for start in range(0, data.size, step):
                yield data[start: start + step]
            return
        if plan is not None and h5inflate.in_bands(plan.shape, plan.chunk, info.dtype.itemsize):
            where = f"{self.display_path}: dataset {info.name!r}"  # (many chunks: on two cores)
            yield from h5inflate.iter_row_blocks(self._fd(), plan, info.dtype, min(rows, info.shape[0]),
                                                 where)
            return
        if not info.shape:
            yield self._read(info).reshape(-1)
            return
        if info.shape[0] <= rows and info.nbytes <= SMALL_DATASET_BYTES:  # one block: read whole by HDF5's
            # own read, without h5py's high-level dataset, selection or a plan of its chunks (20,000 gzip
            # datasets of 50 elements: ~180 -> ~50 us each)
            out = self._buffer(info.nbytes)[: info.nbytes].view(info.dtype).reshape(info.shape)
            h5s = _h5py().h5s
            dsid = self._dataset_id(info.name)
            try:
                dsid.read(h5s.ALL, h5s.ALL, out)
            except Exception as exc:
                raise InputError(f"{self.display_path}: cannot read dataset {info.name!r} ({exc})") from None
            yield out.reshape(-1)
            return
        ds = self._dataset(info.name)
        plan = self._deflate_plan(info, ds)
        if plan is not None:  # gzip chunks inflated on two cores; the same blocks as below
            where = f"{self.display_path}: dataset {info.name!r}"
            yield from h5inflate.iter_row_blocks(self._fd(), plan, info.dtype, min(rows, info.shape[0]), where)
            return
        itemsize = info.dtype.itemsize
        buf = self._buffer(min(rows, info.shape[0]) * row * itemsize)
        for start in range(0, info.shape[0], rows):
            stop = min(start + rows, info.shape[0])
            out = buf[: (stop - start) * row * itemsize].view(info.dtype).reshape((stop - start,) + info.shape[1:])
            try:
                ds.read_direct(out, np.s_[start:stop])
            except Exception as exc:
                raise InputError(f"{self.display_path}: cannot read dataset {info.name!r} ({exc})") from None
            yield out.reshape(-1)

    def _inflated(self, info: TensorInfo) -> np.ndarray:
        """A gzip dataset read from its header (:meth:`_add_deflated`), its chunks inflated one after
        another: a new 1-D array (read-only when it is one chunk, not shuffled); refused, as
        :func:`~.base.allocate` refuses it, when it claims more bytes than this machine's memory."""
        if info.nbytes > physical_memory():
            raise UnsafeInputError(f"{self.display_path}: tensor {info.name!r} claims {info.nbytes} bytes, "
                                   "more than this machine's memory")
        return h5inflate.inflate_whole(self._fd(), self._deflated[info.name], info.dtype,
                                       f"{self.display_path}: dataset {info.name!r}").reshape(-1)

    def inflates_whole(self, info: TensorInfo) -> bool:
        """Whether :meth:`inflate_members` takes tensor ``info``: a gzip dataset read from its header
        (:meth:`_add_deflated`) of at most SMALL_DATASET_BYTES, which :meth:`iter_chunks` inflates whole."""
        return info.name in self._deflated and 0 < info.nbytes <= SMALL_DATASET_BYTES

    def inflate_members(self, infos: Sequence[TensorInfo], out: np.ndarray | None = None) -> list[memoryview | None]:
        """The bytes (C order, the file's byte order) of each dataset of ``infos`` that
        :meth:`inflates_whole` takes, its chunks inflated one after another on this thread as
        :meth:`iter_chunks` inflates them (the same values), for the callers that take many small tensors
        at once (``clip``'s runs, ``stats``' small members): no generator, chunk loop and reader call a
        tensor. ``out`` (uint8, at least the tensors' bytes long): where they go, one after another (each
        view a slice of it; without it, each view its own new bytes). None for a dataset it does not take
        or that fails a check: the caller reads it the usual way, which reports what is wrong."""
        views: list[memoryview | None] = []
        at = 0
        for info in infos:
            view = None
            if self.inflates_whole(info):
                try:
                    data = np.ascontiguousarray(self._inflated(info)).view(np.uint8)
                except InputError:
                    data = None
                if data is not None and out is not None:
                    dst = out[at:at + info.nbytes]
                    dst[:] = data
                    view = memoryview(dst)
                elif data is not None:  # (without ``out``, the inflated bytes themselves: no copy)
                    view = memoryview(data)
            views.append(view)
            at += info.nbytes
        return views

    def inflated_chunks(self, info: TensorInfo, chunk_elements: int,
                        buffer: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """A tensor's elements as :meth:`iter_chunks` gives them in chunks of STREAM_CHUNK elements, for a
        worker thread of :func:`~gradtool.summarize._summarize_compressed`, which summarises a file with
        gzip datasets read from their headers (:attr:`compressed`), those and the others (the blocks of
        whole rows a chunked dataset is read in depend on the chunk size asked for, and the statistics on
        the blocks: the same as streaming it, whatever ``chunk_elements``; ``buffer`` unused: a chunk
        inflates to new bytes, and the reader's buffers are each thread's own)."""
        from ..core.stats import STREAM_CHUNK

        return self.iter_chunks(info, STREAM_CHUNK)

    def _fd(self) -> int:
        if getattr(self, "_raw_fd", None) is None:
            self._raw_fd = os.open(self.path, os.O_RDONLY)
        return self._raw_fd

    def _deflate_plan(self, info: TensorInfo, ds: Any) -> h5inflate.DeflatePlan | None:
        if info.name not in self._plans:
            self._plans[info.name] = h5inflate.deflate_plan(ds.id, info.shape, info.dtype.itemsize)
        return self._plans[info.name]

    def close(self) -> None:
        if getattr(self, "_raw_fd", None) is not None:
            os.close(self._raw_fd)
            self._raw_fd = None
        if self._own:
            try:
                self._f.close()
            except Exception:
                pass


@functools.lru_cache(maxsize=4096)
def _guessed_chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """h5py's ``guess_chunk(shape, None, itemsize)`` (~20 us of NumPy a call), kept for the shapes a
    writer meets again (a model's layers share them)."""
    from h5py._hl.filters import guess_chunk

    return tuple(guess_chunk(shape, None, itemsize))


def _gathered(info: TensorInfo, out: np.ndarray, chunks: Any) -> np.ndarray:
    """A tensor's 1-D chunks copied one after another into ``out`` (at least the tensor's size; the rest
    left as it is), which is returned. RuntimeError when they hold more or fewer elements than the shape."""
    pos = 0
    for c in chunks:
        if pos + c.shape[0] > info.size:
            raise RuntimeError(f"tensor {info.name!r}: more elements than its shape holds")
        out[pos: pos + c.shape[0]] = c
        pos += c.shape[0]
    if pos != info.size:
        raise RuntimeError(f"tensor {info.name!r}: wrote {pos} of {info.size} elements")
    return out


def _row_blocks(info: TensorInfo, dtype: np.dtype, rows_per_block: int,
                chunks: Any) -> Iterator[tuple[int, int, np.ndarray]]:
    """A tensor's 1-D C-order chunks gathered into blocks of whole first-axis rows: ``(first row, rows,
    block)``, ``rows_per_block`` rows a block (the last may have fewer); ``block`` is one flat buffer,
    reused, its first ``rows`` rows valid until the next block is asked for. RuntimeError when the chunks
    hold more or fewer elements than the shape."""
    row = info.size // info.shape[0]
    block = np.empty(rows_per_block * row, dtype)
    filled = next_row = 0  # elements in the block; rows handed out
    for c in chunks:
        pos = 0
        while pos < c.shape[0]:
            take = min(block.shape[0] - filled, c.shape[0] - pos)
            if next_row * row + filled + take > info.size:
                raise RuntimeError(f"tensor {info.name!r}: more elements than its shape holds")
            block[filled: filled + take] = c[pos: pos + take]
            filled, pos = filled + take, pos + take
            if filled == block.shape[0]:
                yield next_row, rows_per_block, block
                next_row, filled = next_row + rows_per_block, 0
    if filled:
        if filled % row:
            raise RuntimeError(f"tensor {info.name!r}: {filled} elements do not make whole rows")
        yield next_row, filled // row, block
        next_row += filled // row
    if next_row != info.shape[0]:
        raise RuntimeError(f"tensor {info.name!r}: wrote {next_row} of {info.shape[0]} rows")


class Hdf5Writer(DumpWriter):
    """Writes datasets in order (creation order tracked); ``begin_step`` starts a step group."""

    format = "hdf5"

    def __init__(self, path: str, metadata: dict[str, Any] | None = None, *, file: Any = None):
        super().__init__(path, metadata)
        self._own = file is None
        self._f = _h5py().File(path, "w", track_order=True) if file is None else file
        if file is None:
            settle_truncation(path)  # h5py's "w" truncated the empty temporary file: see the function
            _cap_metadata_cache(self._f)  # (clip of 20,000 datasets to HDF5: 126 -> 104 MB)
        self._root = self._f
        self._groups: dict[str, Any] = {}  # the groups under the root, by path (see _group)
        if self._own:
            self._set_attrs(self._f, self.metadata)

    def plan(self, infos: list[TensorInfo], *, data_phase: int | None = None) -> None:
        """A file of its own: reserve its space (:func:`~.atomic.preallocate`) for the data of the
        tensors written to contiguous storage of 64 KiB or more (HDF5 places those at the file's end
        as it stands when each is made; smaller ones may go into blocks it has already set aside), from
        where the file ends now; :meth:`close` frees any of it the file did not reach."""
        if not self._own:
            return
        least = sum(i.nbytes for i in infos if i.nbytes >= 1 << 16 and self._writes_contiguous(i))
        start = self._f.id.get_filesize()
        if preallocate(self._data_descriptor(), start, least):
            self._reserved_end = max(getattr(self, "_reserved_end", 0), start + least)  # (a step each)

    @staticmethod
    def _set_attrs(obj: Any, attrs: dict[str, Any]) -> None:
        for k, v in attrs.items():
            if v is None:
                continue
            try:
                obj.attrs[k] = v
            except (TypeError, ValueError):
                obj.attrs[k] = str(v)

    def begin_step(self, group: str, metadata: dict[str, Any]) -> None:
        self._root = self._f.create_group(group, track_order=True)
        self._groups = {}
        self._set_attrs(self._root, metadata)

    def _group(self, path: str) -> Any:
        """The group at ``path`` under the step's root, made (with its parents) if it is not there yet;
        each one looked up once and remembered (the writer never unlinks a group): h5py's ``in`` and
        ``[]`` for every part of every tensor's name cost ~45 us a tensor (20,000 tensors: 0.9 s)."""
        if not path:
            return self._root
        g = self._groups.get(path)
        if g is None:
            parent, _, part = path.rpartition("/")
            up = self._group(parent)
            g = self._groups[path] = up[part] if part in up else up.create_group(part, track_order=True)
        return g

    def set_group_attrs(self, group: str, attrs: dict[str, Any]) -> None:
        self._set_attrs(self._group(group), attrs)

    def add_soft_link(self, name: str, target: str) -> None:
        parent, _, leaf = name.rpartition("/")
        self._group(parent)[leaf] = _h5py().SoftLink(target)

    def add_hard_link(self, name: str, existing: str) -> None:
        parent, _, leaf = name.rpartition("/")
        if existing and existing not in self._root:
            return  # not written: nothing to name twice
        self._group(parent)[leaf] = self._root[existing] if existing else self._root

    def add(self, info: TensorInfo, array: np.ndarray) -> None:
        from .npy import check_writable_dtype

        check_writable_dtype(array.dtype, "HDF5", info.name)
        parent, _, leaf = info.name.rpartition("/")
        g = self._group(parent)
        kwargs: dict[str, Any] = {}
        if info.compression == "gzip" and array.size:
            kwargs = {"compression": "gzip", "compression_opts": _gzip_level(info)}
        ds = g.create_dataset(leaf, data=array, **kwargs)
        self._set_attrs(ds, info.attrs)

    def add_chunks(self, info: TensorInfo, chunks: Any) -> None:
        """Stream a tensor into its dataset a block of whole first-axis rows at a time, so memory holds
        one block (≥ one row), not the tensor."""
        from .npy import check_writable_dtype

        if not info.shape or info.size == 0:
            super().add_chunks(info, chunks)
            return
        check_writable_dtype(info.dtype, "HDF5", info.name)
        dtype = info.dtype if info.dtype.isnative else info.dtype.newbyteorder("=")
        parent, _, leaf = info.name.rpartition("/")
        if self._writes_contiguous(info):
            self._add_contiguous(info, dtype, self._group(parent), leaf, chunks)
            return
        if info.compression == "gzip":
            level = _gzip_level(info)
            dsid, cshape = self._gzip_dataset(self._group(parent), leaf, info.shape, dtype, level)
            self._add_gzip_chunks(info, dtype, dsid, cshape, level, chunks)
            if info.attrs:
                self._set_attrs(_h5py().Dataset(dsid), info.attrs)
            return
        ds = self._group(parent).create_dataset(leaf, shape=info.shape, dtype=dtype)
        row = info.size // info.shape[0]
        rows = max(1, (1 << 20) // max(row * dtype.itemsize, 1))
        for first, n, block in _row_blocks(info, dtype, rows, chunks):
            ds[first: first + n] = block[: n * row].reshape((n,) + info.shape[1:])
        self._set_attrs(ds, info.attrs)

    def _gzip_dataset(self, group: Any, leaf: str, shape: tuple[int, ...], dtype: np.dtype,
                      level: int) -> tuple[Any, tuple[int, ...]]:
        """A new gzip dataset (by its low-level id) and its chunk shape, made by h5py's low-level
        ``h5d.create`` with what ``group.create_dataset(leaf, shape=shape, dtype=dtype,
        compression="gzip", compression_opts=level)`` passes it (the chunks h5py's ``guess_chunk`` gives,
        deflate at ``level``, no modification times; the name and type as :meth:`_allocated_dataset`
        makes them): the same file, byte for byte, without h5py's ~100 us of Python a dataset (20,000:
        2.4 s)."""
        h5py = _h5py()
        cshape = _guessed_chunks(shape, dtype.itemsize)
        # one property list a gzip level, its chunk shape set for each dataset as it differs from the last
        # one's (HDF5 copies the list into the dataset it makes): one a chunk shape kept ~4,000 of them
        # for 20,000 datasets of 1-5 k elements, ~13 MB of the clip's peak RSS
        dcpls = self.__dict__.setdefault("_gzip_dcpls", {})
        dcpl, chunked = dcpls.get(level, (None, None))
        if dcpl is None:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_deflate(level)
            dcpl.set_obj_track_times(False)
        if chunked != cshape:
            dcpl.set_chunk(cshape)
            dcpls[level] = (dcpl, cshape)
        tid = self._type_id(dtype)
        try:
            name = leaf.encode("ascii")
        except UnicodeEncodeError:
            name = leaf.encode("utf-8")
        return h5py.h5d.create(group.id, name, tid, h5py.h5s.create_simple(shape, None), dcpl=dcpl), cshape

    def _type_id(self, dtype: np.dtype) -> Any:
        """h5py's ``h5t.py_create(dtype, logical=1)``, made once per writer and dtype."""
        types = self.__dict__.setdefault("_types", {})
        tid = types.get(dtype)
        if tid is None:
            tid = types[dtype] = _h5py().h5t.py_create(dtype, logical=1)
        return tid

    def _add_gzip_chunks(self, info: TensorInfo, dtype: np.dtype, dsid: Any, cshape: tuple[int, ...],
                         level: int, chunks: Any) -> None:
        """A gzip dataset (``dsid``, chunks of ``cshape``) written chunk by chunk: its HDF5 chunks (edge
        chunks padded with zeros, which HDF5 ignores) are compressed on this writer's two threads
        (:func:`~.deflate.compress_chunk`, which releases the GIL), or here when the dataset is less than
        INLINE_BYTES, and written in order with ``write_direct_chunk``. A dataset of at most
        SMALL_DATASET_BYTES is gathered whole first, a bigger one a band of chunk rows at a time. HDF5
        compresses the chunks of ``ds[a:b] = block`` one after another on one core (~25 MB/s at gzip
        level 4 on float gradients: clip of a 270 MB gzip dump took 11 s)."""
        from .deflate import INLINE_BYTES, compress_chunk, thread_pool

        shape = info.shape
        grid = [range(0, n, c) for n, c in zip(shape[1:], cshape[1:])]  # chunk offsets along the other axes
        band_rows = cshape[0]
        inline = info.nbytes < INLINE_BYTES  # (a hand-off to the pool and back costs more: 20,000 datasets
        # of 50 elements, ~2 s)
        pending: deque[tuple[tuple[int, ...], Any]] = deque()

        def flush_band(r0: int, rows: int, band: np.ndarray) -> None:
            view = band.reshape((-(-rows // band_rows) * band_rows,) + shape[1:])
            if rows < view.shape[0]:
                view[rows:] = 0
            for r in range(0, rows, band_rows):
                for offsets in itertools.product(*grid):
                    others = tuple(slice(o, o + c) for o, c in zip(offsets, cshape[1:]))
                    piece = view[(slice(r, r + band_rows),) + others]
                    if piece.shape != cshape:  # an edge chunk: HDF5 stores it whole
                        full = np.zeros(cshape, dtype)
                        full[tuple(slice(0, n) for n in piece.shape)] = piece
                        piece = full
                    data = np.ascontiguousarray(piece).tobytes()
                    if inline:
                        dsid.write_direct_chunk((r0 + r,) + offsets, compress_chunk(data, level), 0)
                        continue
                    if getattr(self, "_pool", None) is None:
                        self._pool = thread_pool()
                    pending.append(((r0 + r,) + offsets, self._pool.submit(compress_chunk, data, level)))
                while len(pending) > 8 or (pending and pending[0][1].done()):
                    at, fut = pending.popleft()
                    dsid.write_direct_chunk(at, fut.result(), 0)

        if inline and cshape == shape:  # one small chunk (most datasets of a compressed dump)
            data = _gathered(info, np.empty(info.size, dtype), chunks).tobytes()
            dsid.write_direct_chunk((0,) * len(shape), compress_chunk(data, level), 0)
        elif info.nbytes <= SMALL_DATASET_BYTES:  # whole: one band of every chunk row (padded), no row blocks
            whole = np.zeros(-(-shape[0] // band_rows) * band_rows * (info.size // shape[0]), dtype)
            flush_band(0, shape[0], _gathered(info, whole, chunks))
        else:
            for first, n, band in _row_blocks(info, dtype, band_rows, chunks):
                flush_band(first, n, band)
        for at, fut in pending:
            dsid.write_direct_chunk(at, fut.result(), 0)

    def add_copy(self, info: TensorInfo, source: tuple[int, int], where: str) -> bool:
        """An uncompressed tensor's bytes copied into its dataset's contiguous storage (allocated when the
        dataset is created, see :meth:`_allocated_dataset`) by :func:`copy_range`."""
        from .npy import check_writable_dtype

        if not info.shape or info.size == 0 or not info.dtype.isnative or not self._writes_contiguous(info):
            return False
        check_writable_dtype(info.dtype, "HDF5", info.name)
        parent, _, leaf = info.name.rpartition("/")
        group = self._group(parent)
        ds, offset = self._allocated_dataset(group, leaf, info.shape, info.dtype)
        if offset is None:  # not allocated after all: unlink it again and let the caller stream it
            del group[leaf]
            return False
        copy_range(source, self._data_descriptor(), offset, info.nbytes, where)
        self._set_attrs(ds, info.attrs)
        return True

    @staticmethod
    def _writes_contiguous(info: TensorInfo) -> bool:
        """Whether the tensor goes to contiguous storage written by us (:meth:`_allocated_dataset`): not a
        gzip one (HDF5 chunks and filters those), and where ``pwrite`` exists."""
        return info.compression != "gzip" and hasattr(os, "pwrite")

    def _allocated_dataset(self, group: Any, leaf: str, shape: tuple[int, ...],
                           dtype: np.dtype) -> tuple[Any, int | None]:
        """A new contiguous dataset whose storage is allocated now and never filled (every byte is to be
        written by us), and that storage's byte offset in the file (None if HDF5 did not allocate it).

        Made by h5py's low-level ``h5d.create`` with what ``group.create_dataset(leaf, shape=shape,
        dtype=dtype, dcpl=...)`` passes it (the name ASCII, else UTF-8, bytes; the type of
        ``h5t.py_create(dtype, logical=1)``; no modification times), the creation property list and
        the types made once per writer: the same file, byte for byte, without h5py's ~50 us of Python a
        dataset (a dump of 20,000 tensors: 1.9 -> 0.6 s of dataset creation)."""
        h5py = _h5py()
        if getattr(self, "_dcpl", None) is None:
            self._dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            self._dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            self._dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            self._dcpl.set_obj_track_times(False)
        tid = self._type_id(dtype)
        try:
            name = leaf.encode("ascii")
        except UnicodeEncodeError:
            name = leaf.encode("utf-8")
        dsid = h5py.h5d.create(group.id, name, tid, h5py.h5s.create_simple(shape, None), dcpl=self._dcpl)
        return h5py.Dataset(dsid), dsid.get_offset()

    def _data_descriptor(self) -> int:
        """A second descriptor of the output, for writing data at offsets beside h5py's own."""
        if getattr(self, "_data_fd", None) is None:
            self._data_fd = os.open(self.path, os.O_WRONLY)
        return self._data_fd

    def _add_contiguous(self, info: TensorInfo, dtype: np.dtype, group: Any, leaf: str, chunks: Any) -> None:
        """An uncompressed tensor: its contiguous storage is allocated when the dataset is created (and never
        filled: every byte is written here), then the chunks are written straight to those bytes with
        ``pwrite`` on a second descriptor, as the safetensors and npz writers write theirs. HDF5's own
        write path (a hyperslab selection per block) was measured at ~0.55 s of 0.8 s for a 500 MB dump."""
        ds, offset = self._allocated_dataset(group, leaf, info.shape, dtype)
        if offset is None:  # not allocated after all: let HDF5 write it
            ds[...] = np.concatenate([np.asarray(c, dtype) for c in chunks]).reshape(info.shape)
        else:
            fd = self._data_descriptor()
            end = offset + info.size * dtype.itemsize
            pos = self.data_offset = offset
            for c in chunks:
                data = memoryview(np.ascontiguousarray(c, dtype=dtype)).cast("B")
                if pos + len(data) > end:
                    raise RuntimeError(f"tensor {info.name!r}: more elements than its shape holds")
                pwrite_all(fd, data, pos)
                pos += len(data)
            self.data_offset = None
            if pos != end:
                written = (pos - offset) // dtype.itemsize
                raise RuntimeError(f"tensor {info.name!r}: wrote {written} of {info.size} elements")
        self._set_attrs(ds, info.attrs)

    def close(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown()
            self._pool = None
        if self._own:
            self._f.close()
        if getattr(self, "_data_fd", None) is not None:
            if getattr(self, "_reserved_end", 0) > os.fstat(self._data_fd).st_size:  # (see plan)
                os.ftruncate(self._data_fd, os.fstat(self._data_fd).st_size)  # frees blocks past the end
            os.close(self._data_fd)
            self._data_fd = None


def _gzip_level(info: TensorInfo) -> int:
    """The gzip level a tensor read from a gzip dataset is written with: its input's (0-9), else h5py's
    default, 4 (no level recorded, or one outside 0-9, which HDF5's deflate filter can hold but neither
    h5py nor HDF5 will set: a damaged or foreign file, whose tensors read as they are)."""
    level = info.compression_opts
    return int(level) if isinstance(level, (int, np.integer)) and not isinstance(level, bool) and 0 <= level <= 9 else 4
