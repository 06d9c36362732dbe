"""Reading a DCP directory's ``.metadata`` without running code.

Note [safe DCP metadata]
    torch's ``FileSystemReader.read_metadata`` reads ``.metadata`` with a
    plain ``pickle.load``, so a crafted checkpoint directory runs code as
    soon as it is validated or loaded, while every other fleetlite load is
    ``weights_only=True``. :class:`SafeReader` reads it through an
    allow-list: DCP's own metadata dataclasses and enums, ``torch.Size``,
    dtypes, layouts and memory formats, and ``pathlib`` paths; anything else
    is an ``UnpicklingError`` (a ``CheckpointError`` for the user). The
    shards themselves are raw tensor storage, and DCP already reads the
    non-tensor entries with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses
import enum
import pickle
from typing import Any

import torch

__all__ = ["SafeReader", "read_metadata"]

_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
_ALLOWED = {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
            ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _DCP_MODULES and not name.startswith("__"):
            found = super().find_class(module, name)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)):
                return found
        elif module == "torch" and (name == "Size" or isinstance(
                getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format))):
            return getattr(torch, name)
        elif (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a DCP .metadata file (a checkpoint holds "
                                     "only DCP's metadata classes, sizes and dtypes; Note [safe DCP metadata])")


def _reader_class():
    from torch.distributed.checkpoint import FileSystemReader  # ~0.6 s: on use
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReaderImpl(FileSystemReader):
        """torch's ``FileSystemReader`` whose ``read_metadata`` unpickles through the allow-list."""

        def read_metadata(self, *args: Any, **kwargs: Any):
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReaderImpl


def SafeReader(path: str) -> Any:  # noqa: N802 - a class in all but name (built on first use: DCP loads slowly)
    """A ``FileSystemReader`` for ``path`` that reads ``.metadata`` safely (Note [safe DCP metadata])."""
    return _reader_class()(path)


def read_metadata(path: str) -> Any:
    """The DCP metadata of the checkpoint directory ``path``, read safely."""
    return SafeReader(path).read_metadata()
