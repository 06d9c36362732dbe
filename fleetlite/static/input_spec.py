"""Paddle's ``paddle.static.InputSpec``: the shape, dtype and name of a model input (``None``/-1: any size).

``fleetlite.Model(net, inputs=[InputSpec(...)], labels=[...])`` uses the specs as Paddle does: their number
splits a batch into inputs and labels, their shapes feed ``Model.summary()``, and a model with input specs
can be saved for inference before it has run.

Example::

    from fleetlite.static import InputSpec
    spec = InputSpec([None, 1, 28, 28], "float32", "image")
    assert spec.shape == (None, 1, 28, 28) and spec.name == "image"
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["InputSpec"]


class InputSpec:
    """Shape (``None`` or -1 for a free dimension), dtype name and name of one input (Paddle's class).

    Example::

        InputSpec([None, 20], "float32", "x")
    """

    def __init__(self, shape: Sequence[int | None] | int, dtype: str = "float32", name: str | None = None,
                 stop_gradient: bool = False) -> None:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        for d in shape:
            if d is not None and (isinstance(d, bool) or not isinstance(d, int) or (d < 1 and d != -1)):
                raise ValueError(f"InputSpec shape {shape}: each dimension must be a positive int, None or -1")
        self.shape = shape
        self.dtype = str(dtype).replace("paddle.", "").replace("torch.", "")
        self.name = name
        self.stop_gradient = stop_gradient

    def __repr__(self) -> str:
        return f"InputSpec(shape={self.shape}, dtype={self.dtype}, name={self.name})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputSpec) and (self.shape, self.dtype, self.name) == (other.shape, other.dtype,
                                                                                         other.name)

    __hash__ = None  # mutable, like Paddle's
