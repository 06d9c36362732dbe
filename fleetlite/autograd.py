"""``PyLayer``: Paddle's custom autograd layer on ``torch.autograd.Function``."""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionMeta

__all__ = ["PyLayer", "PyLayerContext"]


class PyLayerContext:
    """What ``ctx`` offers inside a PyLayer, beyond torch's context: Paddle's ``saved_tensor()``."""

    def saved_tensor(self):
        """The tensors given to ``ctx.save_for_backward`` (Paddle's name for ``saved_tensors``)."""
        return self.saved_tensors


class _PyLayerMeta(FunctionMeta):
    def __init__(cls, name, bases, attrs):
        super().__init__(name, bases, attrs)
        backward_cls = cls.__dict__.get("_backward_cls")
        if backward_cls is not None and not issubclass(backward_cls, PyLayerContext):
            # give the ctx object Paddle's methods
            backward_cls.saved_tensor = PyLayerContext.saved_tensor


class PyLayer(torch.autograd.Function, metaclass=_PyLayerMeta):
    """A custom autograd layer written Paddle style.

    Subclass it with static ``forward(ctx, *args)`` and ``backward(ctx, *grads)``;
    call it with ``MyLayer.apply(...)``. ``ctx.save_for_backward`` /
    ``ctx.saved_tensor()`` keep tensors for backward.

    Example::

        class cus_tanh(PyLayer):
            @staticmethod
            def forward(ctx, x):
                y = torch.tanh(x)
                ctx.save_for_backward(y)
                return y

            @staticmethod
            def backward(ctx, dy):
                (y,) = ctx.saved_tensor()
                return dy * (1 - torch.square(y))

        x = torch.randn(3, requires_grad=True)
        cus_tanh.apply(x).sum().backward()
    """
