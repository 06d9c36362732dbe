"""fleetlite.static: Paddle's static-graph entry points for data parallelism, on PyTorch modules.

``ParallelExecutor`` runs a :class:`Program` (a module returning a dict of
named tensors, plus its optimizer) on several devices of one process: the
fed batch is split across devices, gradients are averaged, one optimizer
step is taken and fetched values are concatenated.

Example::

    import os, torch
    from fleetlite import static

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x):
            out = self.fc(x)
            return {"out": out, "loss": out.pow(2).mean()}

    os.environ.setdefault("CPU_NUM", "2")
    net = Net()
    static.default_main_program(static.Program(net, torch.optim.SGD(net.parameters(), lr=0.1)))
    exe = static.ParallelExecutor(use_cuda=False, loss_name="loss")
    (loss,) = exe.run(["loss"], feed={"x": torch.randn(8, 4)})
"""

from .input_spec import InputSpec
from .parallel_executor import ParallelExecutor
from .program import Program, default_main_program, program_guard
from .strategy import BuildStrategy, ExecutionStrategy

__all__ = ["ParallelExecutor", "Program", "default_main_program", "program_guard", "BuildStrategy",
           "ExecutionStrategy", "InputSpec"]
