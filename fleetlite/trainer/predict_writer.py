"""Predictions streamed to disk: ``Trainer.predict(data, output_dir=...)`` (Lightning's prediction writer).

# Note [streamed predictions]
Each rank saves every batch's outputs as it goes (``<output_dir>/.parts/rank<r>/<i>.pt``, with the
batch's dataset indices), so a rank holds one batch at a time. Then rank 0 merges the shards: for each
output k, one ``.npy`` of shape ``(N, ...)``, each shard's rows written at their
dataset indices (dataset order; the padding that evens out the ranks was cut before writing, so no sample
is there twice). Rows go to the file with positioned writes (``os.pwrite``), not a memory map, so the
pages written do not count in the process's memory: peak memory is about one batch, whatever N.
When an output's non-batch dims differ between batches (variable-length sequences) it cannot be one
array: its batches are kept as ``<name>/<j>.pt``, numbered in dataset order. The merged files appear
atomically (temporary names, renamed when complete); the shards are deleted after the merge.

Example::

    paths = trainer.predict(big_dataset, batch_size=256, output_dir="preds")
    logits = numpy.load(paths[0], mmap_mode="r")        # preds/predictions.npy, dataset order
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..distributed import collective

__all__ = ["PredictionWriter"]


class PredictionWriter:
    """Writes this rank's prediction batches to disk and merges them on rank 0 (Note [streamed predictions]).

    Example::

        w = PredictionWriter("preds", rank=0, world_size=1)
        w.write([torch.randn(4, 10)], [0, 1, 2, 3])
        paths = w.finish()                                   # [Path("preds/predictions.npy")]
    """

    def __init__(self, output_dir: str | os.PathLike, rank: int, world_size: int) -> None:
        self.dir = Path(output_dir)
        self.rank, self.world_size = rank, world_size
        self.parts = self.dir / ".parts"
        self.mine = self.parts / f"rank{rank}"
        self.count = 0
        self.rows = 0

    def start(self) -> None:
        """Create the shard folder (rank 0 clears a stale one first); collective."""
        if self.rank == 0:
            if self.parts.exists():
                shutil.rmtree(self.parts)
            self.parts.mkdir(parents=True)
        collective.barrier()
        self.mine.mkdir(parents=True, exist_ok=True)

    def write(self, outputs: list[torch.Tensor], indices: list[int] | None) -> None:
        """Save one batch: its outputs and dataset indices (None: the next rows of an unsharded pass)."""
        n = int(outputs[0].shape[0]) if outputs else 0
        idx = list(range(self.rows, self.rows + n)) if indices is None else [int(i) for i in indices]
        torch.save({"indices": idx, "outputs": [o.contiguous() for o in outputs]}, self.mine / f"{self.count:08d}.pt")
        self.count += 1
        self.rows += n

    def finish(self) -> list[Path]:
        """Merge on rank 0 (collective); every rank returns the merged paths."""
        collective.barrier()
        answer: dict[str, Any] = {}
        if self.rank == 0:
            try:
                answer = {"paths": [str(p) for p in self._merge()]}
                shutil.rmtree(self.parts, ignore_errors=True)
            except Exception as e:  # noqa: BLE001 - every rank raises it below
                answer = {"error": f"{type(e).__name__}: {e}"}
        answer = collective.all_gather_object(answer)[0] if self.world_size > 1 else answer
        if "error" in answer:
            raise RuntimeError(f"predict(output_dir={str(self.dir)!r}): merging the shards failed on rank 0: "
                               f"{answer['error']}")
        return [Path(p) for p in answer["paths"]]

    def _shards(self) -> list[Path]:
        return sorted(self.parts.glob("rank*/*.pt"))

    def _scan(self) -> tuple[int, list[dict[str, Any]], list[tuple[int, Path]]]:
        """Rows in all, per output {shape, dtype, same}, and each shard's first index (one shard in memory)."""
        total, info, firsts = 0, [], []
        seen = torch.zeros(0, dtype=torch.bool)  # one byte per sample: a set of ints would cost ~60
        for path in self._shards():
            shard = torch.load(path, weights_only=True)
            idx = shard["indices"]
            t = torch.tensor(idx, dtype=torch.int64)
            if len(idx) and int(t.max()) >= seen.numel():
                seen = torch.cat([seen, torch.zeros(max(int(t.max()) + 1 - seen.numel(), seen.numel()),
                                                    dtype=torch.bool)])
            if len(idx) and (bool(seen[t].any()) or t.unique().numel() != t.numel()):
                raise ValueError(f"a dataset index was predicted twice (shard {path.name}); the sampler gives a "
                                 "sample to more than one rank")
            seen[t] = True
            total += len(idx)
            if idx:
                firsts.append((min(idx), path))
            for k, o in enumerate(shard["outputs"]):
                if k == len(info):
                    info.append({"shape": tuple(o.shape[1:]), "dtype": o.dtype, "same": True})
                elif tuple(o.shape[1:]) != info[k]["shape"] or o.dtype != info[k]["dtype"]:
                    info[k]["same"] = False
        if total and not bool(seen[:total].all()):
            missing = int((~seen[:total]).nonzero()[0])
            raise ValueError(f"the predicted dataset indices are not 0..{total - 1}: sample {missing} is missing")
        return total, info, sorted(firsts)

    def _merge(self) -> list[Path]:
        total, info, firsts = self._scan()
        names = ["predictions"] if len(info) == 1 else [f"predictions_{k}" for k in range(len(info))]
        arrays, paths = {}, []
        for k, (name, meta) in enumerate(zip(names, info)):
            if meta["same"]:
                final = self.dir / f"{name}.npy"
                tmp = self.dir / f".{name}.npy.tmp"
                arrays[k] = (_NpyRows(tmp, meta["dtype"], total, meta["shape"]), tmp, final)
            else:
                final = self.dir / name
                tmp = self.dir / f".{name}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                arrays[k] = (None, tmp, final)
            paths.append(final)
        for j, (_, path) in enumerate(firsts):  # dataset order of the shards (for the per-batch outputs)
            shard = torch.load(path, weights_only=True)
            idx = torch.tensor(shard["indices"], dtype=torch.int64)
            for k, o in enumerate(shard["outputs"]):
                arr, tmp, _ = arrays[k]
                if arr is not None:
                    arr.put(idx, o)
                else:
                    torch.save(o, tmp / f"{j:08d}.pt")
        for arr, tmp, final in arrays.values():
            if arr is not None:
                arr.close()
            else:
                shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        return paths


class _NpyRows:
    """A ``.npy`` file of ``rows`` x ``shape`` filled row by row at given indices (consecutive runs in one write)."""

    def __init__(self, path: Path, dtype: torch.dtype, rows: int, shape: tuple[int, ...]) -> None:
        np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        self.row_bytes = int(np_dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
        header = {"descr": np.lib.format.dtype_to_descr(np_dtype), "fortran_order": False,
                  "shape": (rows, *shape)}
        with open(path, "wb") as f:
            if rows < 2**31:
                np.lib.format.write_array_header_1_0(f, header)
            else:
                np.lib.format.write_array_header_2_0(f, header)
            self.offset = f.tell()
            f.truncate(self.offset + rows * self.row_bytes)
        self.fd = os.open(path, os.O_WRONLY)

    def put(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        data = values.contiguous().numpy().reshape(len(indices), -1).view("u1")
        order = torch.argsort(indices)
        idx = indices[order]
        data = data[order.numpy()]
        start = 0
        breaks = (torch.nonzero(idx[1:] != idx[:-1] + 1).flatten() + 1).tolist() + [len(idx)]
        for end in breaks:  # one write per run of consecutive dataset indices
            os.pwrite(self.fd, data[start:end].tobytes(), self.offset + int(idx[start]) * self.row_bytes)
            start = end

    def close(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)
