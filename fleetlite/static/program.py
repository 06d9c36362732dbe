"""``Program``: what a Paddle static program is to the ParallelExecutor, in PyTorch terms.

A Program pairs a module whose ``forward`` takes the feed names as keyword
arguments and returns a dict of named tensors (the fetchable names) with the
optimizer that trains it. ``default_main_program`` / ``program_guard`` keep
Paddle's notion of a default program.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["Program", "default_main_program", "program_guard"]


class Program:
    """A module (feed names in, dict of named tensors out) and an optional optimizer.

    Args:
        module: ``forward(**feed)`` must return a ``dict`` of tensors.
        optimizer: built on ``module.parameters()``; with it (and the
            executor's ``loss_name``) each ``run`` is a training step.

    ``clone(for_test=True)`` gives the evaluation program: the same module, no
    optimizer, run in ``eval()`` mode (dropout off, batch-norm statistics
    frozen), as Paddle's ``main_program.clone(for_test=True)``.

    Example::

        import torch
        from fleetlite.static import Program

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 2)

            def forward(self, x, y):
                logits = self.fc(x)
                return {"logits": logits, "loss": torch.nn.functional.cross_entropy(logits, y)}

        net = Net()
        prog = Program(net, torch.optim.SGD(net.parameters(), lr=0.1))
        test_prog = prog.clone(for_test=True)
    """

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"Program(module=...) needs a torch.nn.Module whose forward takes the feed names as "
                            f"keyword arguments and returns a dict of tensors; got {type(module).__name__}")
        if optimizer is not None:
            _check_optimizer(module, optimizer)
        self.module = module
        self.optimizer = optimizer
        self.for_test = False

    def clone(self, for_test: bool = False) -> Program:
        """A program over the same module; ``for_test=True`` drops the optimizer and runs in eval mode."""
        out = Program(self.module, None if for_test else self.optimizer)
        out.for_test = bool(for_test) or self.for_test
        return out

    def __repr__(self) -> str:
        opt = type(self.optimizer).__name__ if self.optimizer is not None else None
        return f"Program(module={type(self.module).__name__}, optimizer={opt}, for_test={self.for_test})"


def _check_optimizer(module: torch.nn.Module, optimizer) -> None:
    if not callable(getattr(optimizer, "step", None)):
        raise TypeError(f"Program(optimizer=...) needs an object with a step() method (a torch.optim.Optimizer); "
                        f"got {type(optimizer).__name__}")
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return
    owned = {id(p) for p in module.parameters()}
    for gi, group in enumerate(groups):
        for pi, p in enumerate(group.get("params", [])):
            if id(p) not in owned:
                raise ValueError(
                    f"the optimizer's param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)}) is not a "
                    "parameter of the program's module, so the executor could never update it; build the "
                    "optimizer from module.parameters() of the same module object")


_default: list[Program] = []


def default_main_program(program: Program | None = None) -> Program:
    """Set (with an argument) or return the default program used when ``main_program`` is not given.

    Example::

        import torch
        from fleetlite.static import Program, default_main_program

        default_main_program(Program(torch.nn.Identity()))
        assert isinstance(default_main_program(), Program)
    """
    if program is not None:
        if not isinstance(program, Program):
            raise TypeError(f"default_main_program(program) needs a fleetlite.static.Program; got "
                            f"{type(program).__name__} (wrap a module: Program(module, optimizer))")
        _default[:] = [program]
        return program
    if not _default:
        raise RuntimeError("no default main program is set: call fleetlite.static.default_main_program("
                           "Program(module, optimizer)) first, or pass main_program= to the executor")
    return _default[-1]


@contextlib.contextmanager
def program_guard(main_program: Program, startup_program: object = None) -> Iterator[Program]:
    """Make ``main_program`` the default inside the ``with`` block (``startup_program`` is accepted and unused).

    Example::

        import torch
        from fleetlite.static import Program, program_guard, default_main_program

        prog = Program(torch.nn.Identity())
        with program_guard(prog):
            assert default_main_program() is prog
    """
    if not isinstance(main_program, Program):
        raise TypeError(f"program_guard(main_program) needs a fleetlite.static.Program; got "
                        f"{type(main_program).__name__}")
    saved = list(_default)
    _default[:] = [main_program]
    try:
        yield main_program
    finally:
        _default[:] = saved
