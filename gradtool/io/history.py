"""Turn command-line inputs into a history: an ordered list of dumps, each with a step number.

Inputs are files, directories (their dump files in name order with numbers by value, step_2 before
step_10; not recursive; other files are ignored) and multi-step HDF5 files (one dump per top-level group
with an integer ``step`` attribute, or per top-level group named as a step: ``step_100``).
A dump's step number comes from, in order: its metadata (``step`` in the npz ``__metadata__.json``, the
safetensors ``__metadata__``, or the HDF5 group/root attribute); else its file name (see
:func:`steps_from_filenames`: ``step_00100.npz`` -> 100, ``gpt2_step_100.npz`` -> 100); else its position
in the argument order (0, 1, 2, ...).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, listed
from .base import STEP_IN_NAME, DumpReader
from .detect import detect_format
from .dump import is_stream, open_dump, spooled_copy, stream_name

_INT = re.compile(r"\d+")
_INT_PARTS = re.compile(r"(\d+)")  # split() gives text at even, digits at odd positions
_FD_PATH = re.compile(r"/(?:dev|proc/(?:self|\d+))/fd/\d+")  # a shell's <(cmd): its number is no step


@dataclass
class DumpRef:
    """Where one dump lives (a file, a step group inside an HDF5 history file, or a directory of shard
    files) and its step number."""

    path: str
    format: str | None
    group: str | None = None
    step: int | None = None
    shards: list[str] | None = None

    @property
    def label(self) -> str:
        return f"{self.path}::{self.group}" if self.group else self.path

    def open(self) -> DumpReader:
        if self.shards is not None:
            from .sharded import ShardedReader

            return ShardedReader(self.shards, display_path=self.path)
        return open_dump(self.path, group=self.group, format=self.format)


def _name_stem(path: str) -> str:
    """The file (or step directory) name without a dump extension: the 5 of .h5 is no step."""
    from .detect import EXTENSIONS

    name = os.path.basename(os.path.normpath(path))
    stem, ext = os.path.splitext(name)
    return stem if ext.lower() in EXTENSIONS else name


def step_from_filename(path: str) -> int | None:
    """The step a file (or step directory) name gives, the directory it is in aside: the number after a
    step word (``step_00100.npz``, ``gpt2_step_100.npz``, ``iter-100.h5``, ``rank0_it100.npz`` -> 100),
    else the last number (``llama3_000100.npz`` -> 100; a model name's digits come first), else None
    (``grads.h5``)."""
    stem = _name_stem(path)
    m = STEP_IN_NAME.search(stem)
    if m:
        return int(m.group(1))
    numbers = _INT.findall(stem)
    return int(numbers[-1]) if numbers else None


def steps_from_filenames(paths: Sequence[str]) -> list[int | None]:
    """The steps the names of a history's dumps give: each name's (:func:`step_from_filename`), unless
    those repeat or are missing while the names hold the same count of numbers and one place of them
    differs in every name (``run2_100_r0.npz``, ``run2_200_r0.npz``: the second); then that place's
    numbers (the last such place if several do)."""
    own = [step_from_filename(p) for p in paths]
    if len(paths) < 2 or (None not in own and len(set(own)) == len(own)):
        return own
    numbers = [[int(n) for n in _INT.findall(_name_stem(p))] for p in paths]
    width = len(numbers[0])
    if width == 0 or any(len(row) != width for row in numbers):
        return own
    distinct = [i for i in range(width) if len({row[i] for row in numbers}) == len(paths)]
    return [row[distinct[-1]] for row in numbers] if distinct else own


def natural_key(name: str) -> tuple[list[Any], str]:
    """Sort key that orders the numbers in names by value: step_2 before step_10 (plain name order puts
    step_10, step_11, ... before step_2, the way ``f"step_{step}.npz"`` names files); the name itself
    breaks ties (step_01, step_1)."""
    return [int(part) if i % 2 else part for i, part in enumerate(_INT_PARTS.split(name))], name


def _dir_files(directory: str) -> list[str]:
    try:
        names = sorted(os.listdir(directory), key=natural_key)
    except OSError as exc:
        raise InputError(f"{directory}: cannot list directory ({exc.strerror or exc})") from None
    out = []
    for n in names:
        p = os.path.join(directory, n)
        if n.startswith(".") or not os.path.isfile(p):
            continue
        if detect_format(p) is not None:
            out.append(p)
    return out


def _readable(path: str) -> tuple[str, str]:
    """(the file to read, the name for messages) of an input: a read-once input (``-``, a pipe) is read
    from its copy (:func:`~gradtool.io.dump.streams_spooled`), when there is one."""
    copy = spooled_copy(path)
    return (path, path) if copy is None else (copy, stream_name(path))


def _refs_for_file(path: str, numbered: bool = False,
                   on_warning: Callable[[str], None] | None = None) -> list[DumpRef]:
    """The dumps of one file: its step groups (``numbered``: groups named by bare numbers are steps too;
    ``on_warning`` hears of such groups read as one dump), else the file."""
    real, display = _readable(path)
    fmt = None if real == path and is_stream(path) else detect_format(real)  # an unspooled stream: unsniffed
    if fmt == "hdf5":
        from .hdf5 import numbered_groups_doubt, open_h5, step_groups

        with open_h5(real, display) as f:
            groups = step_groups(f, display, numbered=numbered)
            doubt = None if groups or on_warning is None else numbered_groups_doubt(f, display)
        if doubt and on_warning is not None:
            on_warning(doubt)
        if groups:
            return [DumpRef(path, "hdf5", g, s) for g, s in groups]
    return [DumpRef(path, fmt)]


def _group_path(item: str) -> tuple[str, str] | None:
    """(FILE, GROUP) of an argument ``FILE::GROUP`` whose FILE is a file, else None."""
    path, sep, group = item.rpartition("::")
    return (path, group) if sep and os.path.isfile(path) else None


def is_group_address(item: str) -> bool:
    """True for ``FILE::GROUP`` naming an existing file: one group of an HDF5 file as a dump (the label
    gradtool's messages give a step group, ``run.h5::step_00000005``)."""
    return not os.path.exists(item) and _group_path(item) is not None


def _group_ref(item: str, numbered: bool = False) -> DumpRef:
    """The dump ``FILE::GROUP`` names (:func:`is_group_address`): that group of the HDF5 file, with its step
    (:func:`~gradtool.io.hdf5.group_step`)."""
    found = _group_path(item)
    if found is None:
        raise InputError(f"{item}: no such file or directory")
    path, group = found
    if detect_format(path) != "hdf5":
        raise InputError(f"{item}: {path} is not an HDF5 file (FILE::GROUP names a group of one)")
    from .hdf5 import group_step, open_h5

    with open_h5(path, path) as f:
        step = group_step(f, path, group, numbered=numbered)
    return DumpRef(path, "hdf5", "/".join(part for part in group.split("/") if part), step)


_SHARD_NAME = re.compile(r"-(\d+)-of-(\d+)\.[^.]+$")  # Hugging Face's model-00001-of-00004.safetensors


def _one_step_of_shards(files: Sequence[str]) -> bool:
    """True when ``files`` are named as the K-of-N shards of one checkpoint, all N of them."""
    found = [_SHARD_NAME.search(os.path.basename(f)) for f in files]
    if not all(found):
        return False
    totals = {int(m.group(2)) for m in found if m}
    numbers = sorted(int(m.group(1)) for m in found if m)
    return totals == {len(files)} and numbers == list(range(1, len(files) + 1))


def _directory_doubts(directory: str, files: Sequence[str], steps: Sequence[str]) -> list[str]:
    """What a user should hear about a directory read as the history of its own dump ``files``: step
    directories (``steps``) beside them are not read (a sharded run with a stray dump in it), and files
    named as one checkpoint's shards are read as steps."""
    doubts = []
    if steps:
        doubts.append(f"{directory}: {len(steps)} subdirector{'y' if len(steps) == 1 else 'ies'} of dumps "
                      f"({listed(map(os.path.basename, steps), 3)}) not read, only the directory's own "
                      f"{len(files)} dump file(s); give subdirectories as arguments to read them (with "
                      "--sharded for a step's shards)")
    if len(files) > 1 and _one_step_of_shards(files):
        doubts.append(f"{directory}: its files are named as the shards of one checkpoint (-00001-of-"
                      f"{len(files):05d}...) but are read as {len(files)} steps; add --sharded to read them "
                      "as one step")
    elif len(files) > 1 and (shapes := _npy_shapes(files)) and len({shape for _, shape in shapes}) > 1:
        shown = listed([f"{name} {shape}" for name, shape in shapes], 3)
        doubts.append(f"{directory}: its {len(files)} .npy files hold tensors of different shapes ({shown}) "
                      f"but are read as {len(files)} steps of one tensor each (numbered by the digits in "
                      "their names); if they are one step's tensors, add --sharded to read them as one step")
    return doubts


def _steps_in_several_files(refs: Sequence[DumpRef]) -> str | None:
    """A doubt about a history of files whose names give each step the same number of times, two or more
    (``step_100_rank0.npz``, ``step_100_rank1.npz``, ...): one file per rank, each read as a step of its
    own, the same step once per rank. Shards of a step (FSDP, ZeRO) make a step's norm only together, and
    copies of the same gradients (DDP) count a step several times. Files of one name in several formats
    (``step_100.npz`` beside ``step_100.safetensors``) are copies of a step too, told as such. None when the
    names do not say so."""
    files = [r.path for r in refs if r.group is None and r.shards is None and r.path != "-"
             and not _FD_PATH.fullmatch(r.path)]
    if len(files) < 4 or len(files) != len(refs):
        return None
    by_step: dict[int | None, list[str]] = {}  # the files of each step, grouped in one pass over them
    for f, s in zip(files, steps_from_filenames(files)):
        by_step.setdefault(s, []).append(f)
    per_step = {len(same) for same in by_step.values()}
    if None in by_step or len(by_step) < 2 or len(per_step) != 1 or (k := per_step.pop()) < 2:
        return None
    example = [os.path.basename(f) for f in next(iter(by_step.values()))]
    # step_100.npz beside step_100.safetensors: one name in several formats
    if all(len({os.path.splitext(f)[0] for f in same}) == 1 for same in by_step.values()):
        ext = os.path.splitext(files[0])[1]
        where = os.path.dirname(files[0])
        one = (os.path.join(where, f"*{ext}") if all(os.path.dirname(f) == where for f in files)
               else f"only the {ext} files")
        return (f"each of the {len(by_step)} steps is in {k} files that differ only in format "
                f"({listed(example, 3)}), read as {k} dumps of that step: give one format's files ({one})")
    return (f"each of the {len(by_step)} steps that the file names give is in {k} files "
            f"({listed(example, 3)}), read as {k} dumps of that step: one file per rank? Shards of each step "
            "(FSDP, ZeRO, tensor parallel) are read as one step from a directory per step "
            "(step_100/rank0.npz, ...: what Recorder(..., shard=...) writes); copies of the same gradients "
            "(DDP): give one rank's files")


def _npy_shapes(files: Sequence[str]) -> list[tuple[str, tuple[int, ...]]] | None:
    """(tensor name, shape) of each of ``files`` when every one is a .npy file (one tensor each, as
    ``np.save(f"{name}.npy", g)`` writes them), from their headers; None otherwise."""
    from .npy import MAGIC, read_npy_header

    found = []
    for f in files:
        name = os.path.splitext(os.path.basename(f))[0]
        try:
            with open(f, "rb") as fh:
                if fh.read(len(MAGIC)) != MAGIC:
                    return None
                fh.seek(0)
                found.append((name, read_npy_header(fh, name, f)[0]))
        except (OSError, InputError):
            return None
    return found


def _logs_hint(directory: str) -> str:
    """"; it holds training logs (...): suggest-threshold reads them" when ``directory`` is what
    ``suggest-threshold`` reads as a log (a Trainer's output, TensorBoard, MLflow, Trackio, W&B or DVCLive
    runs); else ""."""
    from .dvclive_log import dvclive_files
    from .logs import csv_logger_runs, tensorboard_runs, trainer_state_files
    from .mlflow_store import file_store_runs
    from .sqlite_logs import log_databases
    from .wandb_log import is_run_store

    if trainer_state_files(directory):
        what = "trainer_state.json"
    elif is_run_store(directory):
        what = "W&B runs"
    elif databases := log_databases(directory):
        what = ", ".join(map(os.path.basename, databases[:3])) + (", ..." if len(databases) > 3 else "")
    elif file_store_runs(directory):
        what = "MLflow runs"
    elif tensorboard_runs(directory):
        what = "TensorBoard event files"
    elif csv_logger_runs(directory):
        what = "Lightning's metrics.csv"
    elif dvclive_files(directory):
        what = "a DVCLive log"
    else:
        return ""
    return f"; it holds training logs ({what}): suggest-threshold reads them"


def _step_dirs(directory: str) -> list[str]:
    """Subdirectories that hold dump files: the steps of a sharded run."""
    try:
        names = sorted(os.listdir(directory), key=natural_key)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names
            if not n.startswith(".") and os.path.isdir(os.path.join(directory, n)) and _dir_files(os.path.join(directory, n))]


def _sharded_ref(directory: str) -> DumpRef:
    files = _dir_files(directory)
    if not files:
        raise InputError(f"{directory}: step directory holds no shard files (.npz .npy .h5 .safetensors)")
    return DumpRef(os.path.normpath(directory), "sharded", shards=files)


OnUnreadable = Callable[[str, InputError], None]  # (the dump's label, why it cannot be read)


def expand_inputs(inputs: Sequence[str], *, resolve_steps: bool = True, sharded: bool = False,
                  numbered_groups_are_steps: bool = False, on_warning: Callable[[str], None] | None = None,
                  on_unreadable: OnUnreadable | None = None, defer_lone_step: bool = False) -> list[DumpRef]:
    """Expand files/directories/multi-step HDF5 files into dump references with step numbers.

    ``resolve_steps=False`` leaves the steps of one-dump files unknown (None) instead of opening every
    dump for its metadata: a caller that opens them anyway takes the metadata step then and
    :func:`fallback_steps` for the rest (an HDF5 file costs ~13 ms an open; a 20,000-tensor file 0.15-0.5
    s). ``defer_lone_step`` does so for a lone one-file dump only: a history's dumps are still opened up
    front (``clip``: an unreadable one then fails the run before any output is written).

    A directory of dump files is a history of one-file steps; a directory of directories is a history
    of sharded steps (each subdirectory's files are one step's shards); with ``sharded`` every directory
    argument is itself one sharded step. A directory with dump files of its own is a history of those
    files; its subdirectories of dumps are then not read, and ``on_warning`` is told so; it is told too
    when the files' names give every step several times (a file per rank: :func:`_steps_in_several_files`).
    ``FILE::GROUP`` is that group of an HDF5 file (one step of a history file, as messages label it).
    An HDF5 file whose top-level groups are all named by bare numbers is one dump, and ``on_warning`` is told
    when they look like steps; with ``numbered_groups_are_steps`` each of them is a step (``100/``, ``200/``).

    With ``on_unreadable``, a dump that does not open (cut short, still being written, malformed) is
    reported to it and left out (:func:`drop_unreadable`), rather than failing the whole history; an
    InputError still ends it when no dump is left."""
    refs: list[DumpRef] = []
    doubted = False  # a directory's doubt was told: no second one about the same files

    def add_file(path: str) -> None:
        try:
            refs.extend(_refs_for_file(path, numbered_groups_are_steps, on_warning))
        except InputError as exc:
            if on_unreadable is None or is_stream(path):
                raise
            on_unreadable(path, exc)

    for item in inputs:
        if item != "-" and os.path.isdir(item):
            if sharded:
                refs.append(_sharded_ref(item))
                continue
            files = _dir_files(item)
            steps = _step_dirs(item)
            if steps and not files:
                refs.extend(_sharded_ref(d) for d in steps)
                continue
            if not files:
                from .detect import no_dumps_hint

                raise InputError(f"{item}: directory holds no gradient dumps (.npz .npy .h5 .safetensors)"
                                 f"{_logs_hint(item) or no_dumps_hint(item)}")
            for doubt in _directory_doubts(item, files, steps) if on_warning is not None else ():
                on_warning(doubt)
                doubted = True
            for p in files:
                add_file(p)
        elif item != "-" and not os.path.exists(item):
            refs.append(_group_ref(item, numbered_groups_are_steps))  # FILE::GROUP, else no such file
        else:
            add_file(item)
    if on_warning is not None and not doubted and (doubt := _steps_in_several_files(refs)):
        on_warning(doubt)
    if defer_lone_step and len(refs) == 1 and refs[0].shards is None:
        resolve_steps = False
    if on_unreadable is not None:
        given = len(refs)
        refs = drop_unreadable(refs, on_unreadable, take_steps=resolve_steps)
        if not refs:
            raise no_readable_dump(inputs, given)
    if resolve_steps:
        for ref in refs:
            if ref.step is None and on_unreadable is None:  # else drop_unreadable took it when it opened
                ref.step = _metadata_step(ref)
        for ref, step in zip(refs, fallback_steps(refs, [ref.step for ref in refs])):
            ref.step = step
    return refs


def fallback_steps(refs: Sequence[DumpRef], known: Sequence[int | None]) -> list[int | None]:
    """The step of each dump of ``refs`` (a history, in order): ``known[i]`` (its metadata's), else the one
    its file name gives (:func:`steps_from_filenames`, over the named dumps of the history), else its
    position in the history (None for standard input)."""
    if None not in known:
        return list(known)
    step_of = fallback_step(refs)
    return [step_of(order, step) for order, step in enumerate(known)]


def fallback_step(refs: Sequence[DumpRef]) -> Callable[[int, int | None], int | None]:
    """:func:`fallback_steps` one dump at a time, for a caller that learns each dump's metadata step as
    it reads it: ``step_of(i, known)`` is the step of ``refs[i]`` whose metadata gives ``known``."""
    named = [i for i, ref in enumerate(refs) if ref.path != "-" and not _FD_PATH.fullmatch(ref.path)]
    by_name: dict[int, int | None] | None = None  # (file names parsed when first needed)

    def step_of(order: int, known: int | None) -> int | None:
        nonlocal by_name
        if known is not None:
            return known
        if by_name is None:
            by_name = dict(zip(named, steps_from_filenames([refs[i].path for i in named])))
        step = by_name.get(order)
        return None if refs[order].path == "-" else order if step is None else step

    return step_of


def _metadata_step(ref: DumpRef) -> int | None:
    if ref.format is None:
        return None
    if ref.shards is not None:
        with open_dump(ref.shards[0]) as r:
            return r.step
    with ref.open() as r:
        return r.step


def open_each(refs: Sequence[DumpRef], on_unreadable: OnUnreadable | None = None,
              ) -> Iterator[tuple[DumpRef, DumpReader]]:
    """``(ref, reader)`` for each ref in order, one open reader at a time (each closed before the next is
    opened). Consecutive step groups of one HDF5 file share one open file: h5py's open and close of
    ``sample_data/run.h5`` were 17 % of its ``stats`` (400 steps of 5 small tensors). With
    ``on_unreadable``, a dump that fails to open is reported to it and passed over."""
    shared: Any = None
    shared_path: str | None = None
    try:
        for ref in refs:
            try:
                if ref.format == "hdf5" and ref.group is not None and ref.shards is None:
                    from .hdf5 import Hdf5Reader, open_h5

                    real, display = _readable(ref.path)
                    if ref.path != shared_path:
                        if shared is not None:
                            shared.close()
                            shared = None
                        shared = open_h5(real, display)
                        shared_path = ref.path
                    reader: DumpReader = Hdf5Reader(real, group=ref.group, display_path=display, _file=shared)
                else:
                    reader = ref.open()
            except InputError as exc:
                if on_unreadable is None:
                    raise
                on_unreadable(ref.label, exc)
                continue
            with reader:
                yield ref, reader
    finally:
        if shared is not None:
            shared.close()


def drop_unreadable(refs: Sequence[DumpRef], on_unreadable: OnUnreadable, *,
                    take_steps: bool = False) -> list[DumpRef]:
    """The refs whose dumps open, in order; each other one is reported to ``on_unreadable`` (its label,
    the InputError) and left out. Opening reads a dump's index, which is where a file cut short or still
    being written fails in every format (an .npz has no zip directory yet, a safetensors header or .npy
    header claims more bytes than the file holds, an HDF5 file's end is short of what its superblock
    says), so a dump that opens is whole; one extra open per dump (HDF5 step groups share theirs).
    ``take_steps``: a ref without a step gets its dump's metadata step from that open (None if none)."""
    kept = []
    for ref, reader in open_each(refs, on_unreadable):
        if take_steps and ref.step is None:
            ref.step = reader.step
        kept.append(ref)
    return kept


def no_readable_dump(inputs: Sequence[str], skipped: int) -> InputError:
    """The error of a history whose every dump was left out as unreadable (``skipped`` of them), each
    named already by ``on_unreadable``."""
    return InputError(f"{', '.join(inputs)}: no readable dump"
                      + (f" (all {skipped} skipped)" if skipped > 1 else ""))


def iter_dumps(inputs: Sequence[str], *, numbered_groups_are_steps: bool = False,
               ) -> Iterator[tuple[DumpRef, DumpReader]]:
    """Yield ``(ref, reader)`` for every dump of the inputs, one open reader at a time;
    ``numbered_groups_are_steps``: an HDF5 file's top-level groups named by bare numbers (``100/``) are
    steps (:func:`expand_inputs`)."""
    yield from open_each(expand_inputs(inputs, numbered_groups_are_steps=numbered_groups_are_steps))
