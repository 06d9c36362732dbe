"""Synchronised batch normalisation that also runs on the CPU (gloo).

``torch.nn.SyncBatchNorm`` only synchronises CUDA (and a few accelerator)
tensors and raises on CPU inputs. :class:`SyncBatchNorm` subclasses it: on
those devices it defers to torch's kernels; on the CPU it runs the same
algorithm with plain tensor ops and ``torch.distributed`` collectives.

Note [sync bn reductions]
    Forward: every rank computes per-channel (count, mean, M2) of its local
    batch, the triples are all-gathered, and merged with Chan's parallel
    formula (exact and stable, unlike E[x^2] - E[x]^2). Backward: the
    per-channel sums of ``dy`` and ``dy * x_hat`` are all-reduced (summed) so
    the input gradient accounts for every rank's use of the shared mean and
    variance; weight and bias gradients stay local (the data-parallel engine
    averages them like any other gradient). This is exactly what torch's CUDA
    implementation computes.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn as nn

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]


def _reduce_dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _channel_view(t: torch.Tensor, ndim: int) -> torch.Tensor:
    return t.view(1, -1, *([1] * (ndim - 2)))


class _SyncBatchNormCPU(torch.autograd.Function):
    """See Note [sync bn reductions]."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group):
        dims = _reduce_dims(x)
        xf = x.float()
        channels = x.shape[1]
        local_n = x.numel() // channels
        if local_n > 0:
            local_mean = xf.mean(dims)
            local_m2 = (xf - _channel_view(local_mean, x.dim())).square().sum(dims)
        else:
            local_mean = xf.new_zeros(channels)
            local_m2 = xf.new_zeros(channels)
        packed = torch.cat([xf.new_full((1,), float(local_n)), local_mean, local_m2])
        world = tdist.get_world_size(group)
        gathered = [torch.empty_like(packed) for _ in range(world)]
        tdist.all_gather(gathered, packed, group=group)
        stats = torch.stack(gathered).double()
        counts, means, m2s = stats[:, :1], stats[:, 1:1 + channels], stats[:, 1 + channels:]
        total = counts.sum()
        if total <= 1:
            raise ValueError(f"SyncBatchNorm expected more than 1 value per channel across all ranks when "
                             f"training, got {int(total.item())}; use a larger batch or call model.eval()")
        mean = (counts * means).sum(0) / total
        m2 = (m2s + counts * (means - mean).square()).sum(0)
        var = m2 / total
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                unbiased = var * (total / (total - 1))
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        mean = mean.float()
        invstd = torch.rsqrt(var.float() + eps)
        x_hat = (xf - _channel_view(mean, x.dim())) * _channel_view(invstd, x.dim())
        y = x_hat
        if weight is not None:
            y = y * _channel_view(weight.float(), x.dim())
        if bias is not None:
            y = y + _channel_view(bias.float(), x.dim())
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.total = float(total.item())
        ctx.group = group
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x_hat, invstd, weight = ctx.saved_tensors
        dims = _reduce_dims(x_hat)
        dyf = dy.float()
        sum_dy_local = dyf.sum(dims)
        sum_dy_xhat_local = (dyf * x_hat).sum(dims)
        grad_weight = sum_dy_xhat_local.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy_local.to(weight.dtype if weight is not None else dy.dtype) \
            if ctx.has_bias and ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            sums = torch.cat([sum_dy_local, sum_dy_xhat_local])
            tdist.all_reduce(sums, group=ctx.group)
            channels = x_hat.shape[1]
            mean_dy = sums[:channels] / ctx.total
            mean_dy_xhat = sums[channels:] / ctx.total
            scale = invstd if weight is None else invstd * weight.float()
            nd = x_hat.dim()
            grad_x = (dyf - _channel_view(mean_dy, nd) - x_hat * _channel_view(mean_dy_xhat, nd)) \
                * _channel_view(scale, nd)
            grad_x = grad_x.to(dy.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(nn.SyncBatchNorm):
    """Batch normalisation whose statistics are computed over the whole distributed batch, on any device.

    Same constructor and behaviour as :class:`torch.nn.SyncBatchNorm` (it is a
    subclass); CUDA tensors use torch's kernels, CPU tensors a gloo path with
    the same results. Without a process group (or with one rank) it is plain
    batch norm. Convert a model with :meth:`convert_sync_batchnorm`.

    Example::

        import torch, torch.nn as nn
        from fleetlite.nn import SyncBatchNorm
        model = SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)))
        y = model(torch.randn(4, 3, 8, 8))   # statistics of all ranks' batches when distributed
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.device.type != "cpu" or not self._needs_sync():
            return super().forward(input)
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        running_mean = running_var = None
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            momentum = 1.0 / float(self.num_batches_tracked.item()) if self.momentum is None else self.momentum
            running_mean, running_var = self.running_mean, self.running_var
        group = self.process_group or tdist.group.WORLD
        return _SyncBatchNormCPU.apply(input, self.weight, self.bias, running_mean, running_var, self.eps,
                                       momentum, group)

    def _needs_sync(self) -> bool:
        if not self.training or not (tdist.is_available() and tdist.is_initialized()):
            return False
        return tdist.get_world_size(self.process_group or tdist.group.WORLD) > 1

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group=None) -> nn.Module:
        """Replace every ``BatchNorm*d`` in ``module`` by :class:`SyncBatchNorm`, sharing parameters and buffers.

        Returns the converted module (a new object when ``module`` itself is a batch norm layer).
        """
        out = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group, bias=module.bias is not None)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


def convert_sync_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """Function form of :meth:`SyncBatchNorm.convert_sync_batchnorm`."""
    return SyncBatchNorm.convert_sync_batchnorm(module, process_group)
