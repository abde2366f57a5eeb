"""Sharded steps: one training step saved as several files, one per rank (FSDP, ZeRO, tensor parallel).

Layout: a directory per step holding that step's shard files, e.g. ``run/step_00100/rank0.safetensors``
… ``rank7.safetensors``. Pass the run directory (a directory of step directories), or pass step
directories themselves with ``--sharded``. Tensors that appear under the same name in several shards are
pieces of one logical tensor: their statistics merge exactly (squared norms add, max |g| is the max,
counts add), so the results equal those of the same tensors stored unsharded. A logical tensor made of
several pieces is reported with the flat shape ``[total elements]`` and ``shards`` = the number of pieces.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import InputError
from .base import DumpReader, TensorInfo


class ShardedReader(DumpReader):
    format = "sharded"

    def __init__(self, paths: Sequence[str], *, display_path: str):
        from .dump import open_dump

        super().__init__(display_path, display_path=display_path)
        self.shards: list[DumpReader] = []
        try:
            for p in paths:
                self.shards.append(open_dump(p))
            self._index()
        except BaseException:
            self.close()
            raise

    def _index(self) -> None:
        pieces: dict[str, list[tuple[DumpReader, TensorInfo]]] = {}
        for shard in self.shards:
            for info in shard.tensors:
                pieces.setdefault(info.name, []).append((shard, info))
        self._pieces = pieces
        for name, parts in pieces.items():
            # (compared, not hashed: a DeferredDtype's hash imports ml_dtypes)
            if any(p[1].dtype != parts[0][1].dtype for p in parts):
                dtypes = {str(p[1].dtype) for p in parts}
                raise InputError(f"{self.display_path}: tensor {name!r} has pieces of different dtypes "
                                 f"({', '.join(sorted(dtypes))})")
            first = parts[0][1]
            shape = first.shape if len(parts) == 1 else (sum(p[1].size for p in parts),)
            self.tensors.append(TensorInfo(name, shape, first.dtype, fortran=first.fortran if len(parts) == 1 else False))
        meta: dict[str, Any] = {}
        for shard in self.shards:
            for k, v in shard.metadata.items():
                meta.setdefault(k, v)
        self.metadata = meta

    def shard_count(self, name: str) -> int:
        return len(self._pieces[name])

    def iter_chunks(self, info: TensorInfo, chunk_elements: int = 1 << 16) -> Iterator[np.ndarray]:
        for shard, piece in self._pieces[info.name]:
            yield from shard.iter_chunks(piece, chunk_elements)

    def raw_segments(self, info: TensorInfo, *, crc_by_caller: bool = False
                     ) -> list[tuple[DumpReader, TensorInfo, tuple[int, int]]] | None:
        out: list[tuple[DumpReader, TensorInfo, tuple[int, int]]] = []
        for shard, piece in self._pieces[info.name]:
            segs = shard.raw_segments(piece, crc_by_caller=crc_by_caller)
            if segs is None:
                return None
            out.extend(segs)
        return out

    def _read(self, info: TensorInfo) -> np.ndarray:
        parts = self._pieces[info.name]
        if len(parts) == 1:
            return parts[0][0]._read(parts[0][1])
        return np.concatenate([shard._read(piece).reshape(-1) for shard, piece in parts])

    def close(self) -> None:
        for s in self.shards:
            s.close()
