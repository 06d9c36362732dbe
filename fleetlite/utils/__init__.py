"""Small helpers shared across layers (no imports of higher layers)."""

from .atomic import atomic_open, atomic_write_text, fsync_dir, temp_name

__all__ = ["atomic_open", "atomic_write_text", "fsync_dir", "temp_name"]
