"""``ParallelExecutor``: Paddle's single-process multi-device data parallelism, on PyTorch modules.

One process holds one replica of the program's module per device (``CPU_NUM``
copies on the CPU, one per visible GPU with ``use_cuda=True``). ``run`` splits
the fed batch across them (Note [split rule] in ``_feed``), runs each,
averages the gradients through flat bucket buffers (Note [gradient buckets]
in ``_replicas``), applies one optimizer step to the program's module
(Note [replica 0 is the user's module]) and concatenates the fetched values.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping, Sequence

import torch

from ..distributed import collective
from ..distributed.env import read_env
from ._feed import concat_fetch, prepare_feed
from ._replicas import ReplicaSet, broadcast_from_rank0, clone_module
from .program import Program, default_main_program
from .strategy import BuildStrategy, ExecutionStrategy

__all__ = ["ParallelExecutor"]


def _cpu_num() -> int:
    raw = os.environ.get("CPU_NUM")
    if raw is None or not raw.strip():
        os.environ["CPU_NUM"] = "1"  # as Paddle does
        return 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"CPU_NUM={raw!r} must be a positive integer: the number of CPU replicas the "
                         "ParallelExecutor runs (e.g. export CPU_NUM=2)")
    return n


def _places(use_cuda: bool) -> list[torch.device]:
    if not use_cuda:
        return [torch.device("cpu")] * _cpu_num()
    if not torch.cuda.is_available():
        raise RuntimeError("ParallelExecutor(use_cuda=True) but torch sees no CUDA device; pass use_cuda=False "
                           "to run CPU_NUM replicas on the CPU, or install a CUDA build of torch")
    count = torch.cuda.device_count()
    selected = read_env().selected_gpus or tuple(range(count))
    bad = [g for g in selected if not 0 <= g < count]
    if bad:
        raise ValueError(f"FLAGS_selected_gpus names GPU(s) {bad} but only {count} are visible "
                         "(CUDA_VISIBLE_DEVICES); fix one of the two")
    return [torch.device("cuda", g) for g in selected]


class ParallelExecutor:
    """Run a :class:`Program` data-parallel on several devices of one process (Paddle's ``ParallelExecutor``).

    Args:
        use_cuda: one replica per visible GPU (``FLAGS_selected_gpus`` if set);
            False: ``CPU_NUM`` replicas on the CPU (``CPU_NUM`` is set to 1 when unset).
        loss_name: the key of the scalar loss in forward's output dict. With it
            and an optimizer in the program, each ``run`` is one training step.
        main_program: the :class:`Program`; default ``default_main_program()``.
        share_vars_from: a training executor that has already run; this
            (evaluation) executor then uses its parameters, always current.
        exec_strategy / build_strategy: see :class:`ExecutionStrategy`, :class:`BuildStrategy`.
        num_trainers / trainer_id: with ``num_trainers > 1``, one executor per
            process (``fleetlite launch``); gradients are averaged over the
            devices of all processes.
        scope: must be None (variables live in the program's module).

    The module is moved to the first device. Only the first device's
    batch-norm statistics are kept, as with DDP's ``broadcast_buffers``.

    Example::

        import os, torch
        from fleetlite.static import ParallelExecutor, Program

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 1)

            def forward(self, x, y):
                pred = self.fc(x)
                return {"pred": pred, "loss": torch.nn.functional.mse_loss(pred, y)}

        os.environ["CPU_NUM"] = "2"
        net = Net()
        prog = Program(net, torch.optim.SGD(net.parameters(), lr=0.1))
        exe = ParallelExecutor(use_cuda=False, loss_name="loss", main_program=prog)
        loss, pred = exe.run(["loss", "pred"], feed={"x": torch.randn(8, 4), "y": torch.randn(8, 1)})
        assert loss.shape == (2,) and pred.shape == (8, 1)
    """

    def __init__(self, use_cuda: bool, loss_name: str | None = None, main_program: Program | None = None,
                 share_vars_from: ParallelExecutor | None = None, exec_strategy: ExecutionStrategy | None = None,
                 build_strategy: BuildStrategy | None = None, num_trainers: int = 1, trainer_id: int = 0,
                 scope: object = None) -> None:
        program = main_program if main_program is not None else default_main_program()
        if not isinstance(program, Program):
            raise TypeError(f"main_program must be a fleetlite.static.Program (Program(module, optimizer)); "
                            f"got {type(program).__name__}")
        if loss_name is not None and not isinstance(loss_name, str):
            raise TypeError(f"loss_name must be the str key of the loss in forward's output dict; got {loss_name!r}")
        if scope is not None:
            raise ValueError("scope is not supported: variables live in the program's module; pass scope=None")
        self._build = build_strategy if build_strategy is not None else BuildStrategy()
        self._exec = exec_strategy if exec_strategy is not None else ExecutionStrategy()
        self._build._check()
        self._exec._check()
        self._check_trainers(num_trainers, trainer_id)
        self._program = program
        self._loss_name = loss_name
        self._use_cuda = bool(use_cuda)
        self._places = _places(self._use_cuda)
        self._trains = loss_name is not None and program.optimizer is not None and not program.for_test
        self._share = self._check_share(share_vars_from)
        self._set: ReplicaSet | None = None
        self._generation = 0  # bumped whenever the replicas are rebuilt
        self._bound: list[torch.nn.Module] | None = None  # share_vars_from with another module: bound copies
        self._bound_generation = -1
        self._broadcast_done = False
        self._has_run = False
        self._runs = 0
        if self._share is None:
            program.module.to(self._places[0])

    # ---- construction checks ----------------------------------------------------------------------

    def _check_trainers(self, num_trainers: int, trainer_id: int) -> None:
        for name, v in (("num_trainers", num_trainers), ("trainer_id", trainer_id)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name} must be an int; got {v!r}")
        if num_trainers < 1 or not 0 <= trainer_id < num_trainers:
            raise ValueError(f"num_trainers={num_trainers}, trainer_id={trainer_id}: need num_trainers >= 1 and "
                             "0 <= trainer_id < num_trainers")
        self._num_trainers = num_trainers
        if num_trainers == 1:
            if collective.get_world_size() > 1:
                warnings.warn(f"ParallelExecutor(num_trainers=1) in a process group of {collective.get_world_size()}"
                              " processes: gradients are averaged within this process only, so the processes' "
                              "models will drift apart; pass num_trainers=world size and trainer_id=rank",
                              stacklevel=3)
            return
        if not collective.is_initialized():
            env = read_env()
            if env.world_size != num_trainers:
                raise RuntimeError(f"num_trainers={num_trainers} but this process was started with world size "
                                   f"{env.world_size}: start one process per trainer with `fleetlite launch "
                                   f"--nproc_per_node {num_trainers} script.py` (or call fleet.init() first)")
            collective.init_parallel_env()
        world, rank = collective.get_world_size(), collective.get_rank()
        if world != num_trainers or rank != trainer_id:
            raise ValueError(f"num_trainers={num_trainers}, trainer_id={trainer_id} disagree with the process group "
                             f"(world size {world}, rank {rank}); pass num_trainers=fleet.worker_num(), "
                             "trainer_id=fleet.worker_index()")

    def _check_share(self, other: ParallelExecutor | None) -> ParallelExecutor | None:
        if other is None:
            return None
        if not isinstance(other, ParallelExecutor):
            raise TypeError(f"share_vars_from must be a ParallelExecutor; got {type(other).__name__}")
        if not other._has_run:
            raise RuntimeError("share_vars_from: the training executor has not run yet, so it has no variables to "
                               "share; call train_exe.run(...) at least once before building this executor "
                               "(Paddle has the same rule)")
        if other._places != self._places or other._num_trainers != self._num_trainers:
            raise ValueError(f"share_vars_from: this executor runs on {len(self._places)} {self._places[0].type} "
                             f"device(s) x {self._num_trainers} trainer(s) but the shared one on "
                             f"{len(other._places)} {other._places[0].type} device(s) x {other._num_trainers}; "
                             "use the same use_cuda, CPU_NUM and num_trainers for both")
        if self._trains:
            raise ValueError("share_vars_from is for evaluation executors, but this one would train (it has "
                             "loss_name and an optimizer); use main_program.clone(for_test=True) or drop loss_name")
        if self._program.module is not other._program.module:
            theirs = {n: t for n, t in other._program.module.named_parameters()}
            for n, p in self._program.module.named_parameters():
                q = theirs.get(n)
                if q is None or q.shape != p.shape or q.dtype != p.dtype:
                    found = "missing" if q is None else f"{tuple(q.shape)} {q.dtype}"
                    raise ValueError(f"share_vars_from: parameter {n!r} ({tuple(p.shape)} {p.dtype}) has no match in "
                                     f"the training program's module ({found}); the evaluation module must use the "
                                     "same parameter names and shapes")
        return other

    # ---- replicas -------------------------------------------------------------------------------------

    @property
    def places(self) -> list[torch.device]:
        """The devices of this process's replicas, in split order."""
        return list(self._places)

    @property
    def device_count(self) -> int:
        """Number of replicas in this process."""
        return len(self._places)

    def _ensure_set(self) -> ReplicaSet:
        module = self._program.module
        if self._set is not None and not self._set.is_current(module):
            self.drop_local_exe_scopes()  # the user replaced parameter objects: rebuild from scratch
        if self._set is None:
            module.to(self._places[0])
            if self._num_trainers > 1 and not self._broadcast_done:
                broadcast_from_rank0(module)
                self._broadcast_done = True
            self._set = ReplicaSet(module, self._places, self._build.fuse_grad_size_in_MB)
            self._generation += 1
        self._set.sync()
        return self._set

    def _replicas(self) -> list[torch.nn.Module]:
        if self._share is None:
            return self._ensure_set().replicas
        owner = self._share
        shared = owner._ensure_set()
        module = self._program.module
        if module is owner._program.module:
            return shared.replicas
        if self._bound is None or self._bound_generation != owner._generation:
            self._bound = []
            for k, rep in enumerate(shared.replicas):
                theirs = dict(rep.named_parameters())
                theirs.update(dict(rep.named_buffers()))
                mine = {n for n, _ in module.named_parameters()} | {n for n, _ in module.named_buffers()}
                self._bound.append(clone_module(module, self._places[k], {n: theirs[n] for n in mine if n in theirs}))
            self._bound_generation = owner._generation
        flags = [m.training for m in module.modules()]
        for rep in self._bound:
            for m, f in zip(rep.modules(), flags):
                m.training = f
        return self._bound

    def drop_local_exe_scopes(self) -> None:
        """Free the per-device state (replica copies, gradient buffers); the next run rebuilds it identically."""
        if self._set is not None:
            self._set.free()
            self._set = None
        self._bound = None
        self._bound_generation = -1

    # ---- run ----------------------------------------------------------------------------------------------

    def run(self, fetch_list: Sequence[str] | str | None, feed: Mapping | Sequence[Mapping] | None = None,
            feed_dict: Mapping | None = None, return_numpy: bool = True) -> list:
        """One step (training with ``loss_name`` and an optimizer, else forward only); returns the fetched values.

        ``feed``: a dict split along dimension 0 across devices, or a list of
        one dict per device. Each fetched name comes back concatenated along
        dimension 0 across devices (a scalar: one value per device), as numpy
        arrays (``return_numpy=True``) or tensors on the first device.
        The gradient is the mean of the devices' loss gradients
        (``CoeffNumDevice``): for a mean loss that is the whole-batch gradient
        when every device gets the same number of samples; with an uneven
        split it weights the devices equally (as Paddle does).
        """
        if feed is not None and feed_dict is not None:
            raise ValueError("pass the batch as feed= or as feed_dict= (its old name), not both")
        feed = feed if feed is not None else feed_dict
        names = self._fetch_names(fetch_list)
        hint = (f"{len(self._places)} visible GPUs" if self._use_cuda else f"CPU_NUM={len(self._places)}")
        feeds = prepare_feed(feed, self._places, hint)
        replicas = self._replicas()
        rs = self._set if self._share is None else None
        if self._trains:
            rs.prepare_grads()
        scale = 1.0
        if self._build.gradient_scale_strategy == BuildStrategy.GradientScaleStrategy.CoeffNumDevice:
            scale = 1.0 / (len(replicas) * self._num_trainers)
        fetched: list[dict[str, torch.Tensor]] = []
        with self._modes(replicas), torch.set_grad_enabled(self._trains):
            for k, (rep, f) in enumerate(zip(replicas, feeds)):
                out = rep(**f)
                self._check_output(out, names, k)
                if self._trains:
                    loss = out[self._loss_name]
                    self._check_loss(loss)
                    torch.autograd.backward(loss, grad_tensors=torch.full_like(loss, scale))
                fetched.append({n: out[n].detach() if isinstance(out[n], torch.Tensor) else out[n] for n in names})
                del out
        if self._trains:
            rs.reduce(distributed=self._num_trainers > 1)
            self._program.optimizer.step()
        result = [concat_fetch(n, [d[n] for d in fetched], return_numpy) for n in names]
        self._has_run = True
        self._runs += 1
        if self._runs % self._exec.num_iteration_per_drop_scope == 0:
            self.drop_local_exe_scopes()
        return result

    @contextlib.contextmanager
    def _modes(self, replicas: list[torch.nn.Module]):
        """Evaluation programs (``clone(for_test=True)``) run every replica in eval mode, restored afterwards."""
        if not self._program.for_test:
            yield
            return
        saved = [[m.training for m in r.modules()] for r in replicas]
        for r in replicas:
            r.eval()
        try:
            yield
        finally:
            for r, flags in zip(replicas, saved):
                for m, f in zip(r.modules(), flags):
                    m.training = f

    @staticmethod
    def _fetch_names(fetch_list) -> list[str]:
        if fetch_list is None:
            return []
        if isinstance(fetch_list, str):
            return [fetch_list]
        if not isinstance(fetch_list, (list, tuple)) or not all(isinstance(n, str) for n in fetch_list):
            raise TypeError(f"fetch_list must be a list of str names of forward's output dict; got {fetch_list!r}")
        return list(fetch_list)

    def _check_output(self, out, names: list[str], k: int) -> None:
        if not isinstance(out, Mapping):
            raise TypeError(f"the program's module returned a {type(out).__name__} on device {k}; its forward must "
                            "return a dict of named tensors (the names run() can fetch)")
        wanted = names + ([self._loss_name] if self._trains else [])
        missing = [n for n in wanted if n not in out]
        if missing:
            raise KeyError(f"{missing} not in the forward's output names {sorted(out)}; fetch_list and loss_name "
                           "must name keys of the dict forward returns")

    def _check_loss(self, loss) -> None:
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
            what = f"shape {tuple(loss.shape)}, {loss.dtype}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(f"loss {self._loss_name!r} must be a floating scalar tensor ({what}); reduce it in "
                             "forward, e.g. loss.mean()")
        if not loss.requires_grad:
            raise ValueError(f"loss {self._loss_name!r} does not require grad, so there is nothing to train; check "
                             "that forward computes it from trainable parameters (not under torch.no_grad())")

    def __repr__(self) -> str:
        return (f"ParallelExecutor(places={self._places}, loss_name={self._loss_name!r}, "
                f"num_trainers={self._num_trainers}, trains={self._trains})")
