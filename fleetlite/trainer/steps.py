"""The Trainer's step runners: how the batches of a wrapped model are trained, evaluated and predicted.

# Note [step runners]
The Trainer never asks which parallelism runs (Lightning's rule). When it sets up its network it asks the
wrapped model which runner drives it, ``WrappedModel.step_runner`` (a name mapped here, or a factory
``(trainer, wrapped_model) -> runner`` the user gives), and chooses its steps once (:func:`steps_for`). The
Trainer's ``train_step`` / ``eval_step`` / ``predict_step`` and the loops then call that runner, whatever it
is, and branch on nothing:

* :class:`DefaultSteps` (``"default"``: data parallel, sharding, tensor parallel): the Trainer's own steps,
  a forward of the whole model on every rank; ``rows`` 32 (Keras' default batch size); every rank holds the
  outputs.
* :class:`~fleetlite.trainer.hybrid.PipelineSteps` (``"pipeline"``, what ``PipelineParallel`` declares): the
  pipeline's ``train_batch`` / ``eval_batch``, its rows per step, outputs on the last stage sent to the others
  (Note [hybrid trainer]).

A runner answers (:class:`Steps`): the three steps; ``rows`` (the default batch size of evaluate and
predict); ``has_outputs`` (whether this rank computes the outputs, loss and metrics); ``needs_loss`` (whether
``fit`` needs the Trainer's loss); the checks made before any step (``check_fit``, ``check_inference``,
``check_per_batch``); ``share`` (the value of the rank holding the outputs, on every rank of the model
replica); ``agree_buffers`` (Note [agreed buffers]) and ``idle_forward`` (a forward run only because it is
collective). A new parallelism that needs its own steps is a new runner named by its wrapped model, not a
branch in the Trainer.

Example::

    class Logged(DefaultSteps):          # a user's runner: the default steps, each batch counted
        def train_step(self, batch):
            self.trainer.batches_seen = getattr(self.trainer, "batches_seen", 0) + 1
            return super().train_step(batch)

    class MyWrapped(fleetlite.DataParallel):
        step_runner = Logged             # the Trainer drives this model through Logged
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .data_adapter import DataAdapter
from .hybrid import PipelineSteps
from .weighting import weighted_loss

__all__ = ["Steps", "DefaultSteps", "RUNNERS", "steps_for"]


class Steps(Protocol):
    """What the Trainer and its loops ask of a step runner (Note [step runners])."""

    rows: int
    has_outputs: bool
    needs_loss: bool

    def train_step(self, batch: Any) -> dict[str, Any]: ...
    def eval_step(self, batch: Any) -> dict[str, Any]: ...
    def predict_step(self, batch: Any) -> Any: ...
    def check_fit(self, train: DataAdapter, accumulate: int, weighted: bool) -> None: ...
    def check_inference(self, data: DataAdapter, role: str) -> None: ...
    def check_per_batch(self, what: str) -> None: ...
    def share(self, value: Any) -> Any: ...
    def agree_buffers(self) -> None: ...
    def idle_forward(self, batch: Any) -> None: ...


class DefaultSteps:
    """The Trainer's own steps: a forward of the whole model on every rank (Note [step runners]).

    Subclass it for a runner of your own that changes one step and keeps the rest.

    Example::

        steps = DefaultSteps(trainer, trainer.parallel_network)
        steps.rows          # 32: evaluate's and predict's default batch size
    """

    rows = 32
    has_outputs = True  # every rank computes the outputs of its batches
    needs_loss = True  # fit needs the Trainer's loss (unless train_step is overridden)

    def __init__(self, trainer, net) -> None:
        self.trainer, self.net = trainer, net

    # -- steps -------------------------------------------------------------------------------------------------
    def train_step(self, batch: Any) -> dict[str, Any]:
        """Forward, loss (Keras' sample/class weights), backward, optimizer step (at boundaries), metrics."""
        t = self.trainer
        batch, sample = t.weighting.split(batch)  # Keras' sample_weight / class_weight
        inputs, labels = t.split_batch(batch)
        outputs = t.parallel_network(*inputs)
        weights = t.weighting.of_batch(labels, sample)
        loss = (t.compute_loss(outputs, labels) if weights is None
                else weighted_loss(t.loss_fn, t.compute_loss, outputs, labels, weights))
        t.backward(loss)
        t.optimizer_step()
        t.update_metrics(outputs, labels)
        return {"loss": loss}

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """Loss and metrics of a batch (padding already removed, under ``no_grad``)."""
        t = self.trainer
        inputs, labels = t.split_batch(batch)
        outputs = t.network(*inputs)
        t.update_metrics(outputs, labels)
        if t.loss_fn is None or not labels:
            return {}
        return {"loss": t.compute_loss(outputs, labels)}

    def predict_step(self, batch: Any) -> Any:
        """The model's outputs for the batch's inputs (labels, if present, ignored)."""
        t = self.trainer
        inputs, _ = t.split_batch(batch)
        return t.network(*inputs)

    # -- checks, before any step: the whole model runs every batch, nothing to refuse ----------------------------
    def check_fit(self, train: DataAdapter, accumulate: int, weighted: bool) -> None:
        """Nothing to refuse: any batch size, gradient merge and weights train."""

    def check_inference(self, data: DataAdapter, role: str) -> None:
        """Nothing to refuse: any batch size evaluates and predicts."""

    def check_per_batch(self, what: str) -> None:
        """Nothing to refuse: ``fleetlite.Model``'s per-batch calls run the whole model."""

    # -- results and collectives ---------------------------------------------------------------------------------
    def share(self, value: Any) -> Any:
        """``value`` as it is: every rank computed its own."""
        return value

    def agree_buffers(self) -> None:
        """Every rank of the data group takes its first rank's buffers (Note [agreed buffers])."""
        self.net.agree_buffers()

    def idle_forward(self, batch: Any) -> None:
        """A forward whose result is dropped, for a batch of padding only: a sharded (stage 2/3) model's forward
        is collective (it all-gathers parameters), so every rank must run as many as the others."""
        if self.net.is_sharded:
            t = self.trainer
            t.network(*t.split_batch(t.to_device(batch))[0])


#: The runners a wrapped model names by its ``step_runner`` (Note [step runners]).
RUNNERS: dict[str, Callable[[Any, Any], Steps]] = {"default": DefaultSteps, "pipeline": PipelineSteps}


def steps_for(trainer, net) -> Steps:
    """The runner of ``net`` (the wrapped model) for ``trainer``: the one its ``step_runner`` declares, a name of
    :data:`RUNNERS` or a factory ``(trainer, net) -> runner``; a model outside the ``WrappedModel`` protocol runs
    the default steps. Chosen once, when the Trainer sets up its network.

    Example::

        steps = steps_for(trainer, trainer.parallel_network)
        steps.train_step(batch)
    """
    kind = getattr(net, "step_runner", "default")
    factory = RUNNERS.get(kind) if isinstance(kind, str) else kind
    if not callable(factory):
        raise ValueError(f"{type(net).__name__}.step_runner = {kind!r} names no step runner: use one of "
                         f"{sorted(RUNNERS)} or a factory (trainer, wrapped_model) -> runner, e.g. a "
                         "fleetlite.trainer.steps.DefaultSteps subclass")
    return factory(trainer, net)
