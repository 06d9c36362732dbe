"""torch DDP's constructor arguments next to Paddle's, resolved and checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Settings", "resolve", "UNSUPPORTED"]

# DDP arguments that change what is reduced; not built here (a clear error, never silently ignored)
UNSUPPORTED = {
    "delay_all_reduce_named_params": None, "param_to_hook_all_reduce": None, "mixed_precision": None,
    "skip_all_reduce_unused_params": False, "bucket_cap_mb_list": None,
}


@dataclass
class Settings:
    """The resolved constructor arguments (Paddle names and torch DDP aliases merged)."""

    module: nn.Module
    group: object
    comm_buffer_size: float
    last_comm_buffer_size: float
    device_ids: list[int] | None
    output_device: int | None
    forward_sync_buffers: bool
    init_sync_buffers: bool


def _pick(paddle_name: str, paddle_value, ddp_name: str, ddp_value, default):
    if paddle_value is not None and ddp_value is not None and paddle_value != ddp_value:
        raise ValueError(f"DataParallel got {paddle_name}={paddle_value!r} and its torch DDP alias "
                         f"{ddp_name}={ddp_value!r}, which disagree; give only one of them")
    if paddle_value is not None:
        return paddle_value
    return ddp_value if ddp_value is not None else default


def _device_index(d) -> int | None:
    if d is None:
        return None
    if isinstance(d, torch.device):
        return d.index if d.index is not None else 0
    if isinstance(d, str):
        return _device_index(torch.device(d))
    return int(d)


def resolve(layers, module, group, process_group, device_mesh, comm_buffer_size, bucket_cap_mb,
            last_comm_buffer_size, device_ids, output_device, dim, broadcast_buffers, forward_sync_buffers,
            extra: dict) -> Settings:
    """Check every argument and merge the aliases; raises ``TypeError``/``ValueError`` naming the argument."""
    if layers is not None and module is not None and layers is not module:
        raise ValueError("DataParallel got both `layers` (Paddle) and `module` (torch DDP); give one model")
    model = layers if layers is not None else module
    if model is None:
        raise TypeError("DataParallel needs the model to wrap: DataParallel(model, ...)")
    if not isinstance(model, nn.Module):
        raise TypeError(f"DataParallel wraps an nn.Module, got {type(model).__name__}")
    for name, value in extra.items():
        if name not in UNSUPPORTED:
            raise TypeError(f"DataParallel got an unexpected keyword argument {name!r}")
        if value != UNSUPPORTED[name]:
            raise NotImplementedError(
                f"DataParallel does not implement torch DDP's {name}={value!r}; use torch DDP for that "
                "feature, or leave the argument at its default")
    if group is not None and process_group is not None and group is not process_group:
        raise ValueError("DataParallel got `group` (Paddle) and its torch DDP alias `process_group` with "
                         "different groups; give only one of them")
    pg = group if group is not None else process_group
    if device_mesh is not None:
        if pg is not None:
            raise RuntimeError("Cannot specify both process_group and device_mesh arguments.")
        if device_mesh.ndim != 1:
            raise RuntimeError(f"Only 1D device mesh is supported, but got {device_mesh}.")
        pg = device_mesh.get_group(mesh_dim=0)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim={dim!r} must be an int (torch DDP's scatter dimension; inputs are not split here)")
    size = _pick("comm_buffer_size", comm_buffer_size, "bucket_cap_mb", bucket_cap_mb, 25)
    params = [p for p in model.parameters()]
    devices = {p.device for p in params}
    if device_ids is not None:
        if isinstance(device_ids, (int, str, torch.device)):
            raise TypeError(f"device_ids={device_ids!r} must be a list with one device, e.g. [local_rank]")
        device_ids = [_device_index(d) for d in device_ids]
        if len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
    out_dev = _device_index(output_device)
    if device_ids or out_dev is not None:
        types = {d.type for d in devices}
        if types != {"cuda"} or len(devices) != 1:
            raise ValueError(
                f"DataParallel: device_ids={device_ids} / output_device={output_device!r} name one accelerator, "
                f"but the module's parameters are on {sorted(map(str, devices))}. Move the model first "
                "(model.to(f'cuda:{local_rank}')), or leave device_ids/output_device out for CPU modules.")
        index = next(iter(devices)).index
        if device_ids and device_ids[0] != index:
            raise ValueError(f"DataParallel: device_ids={device_ids} but the module is on cuda:{index}; move it "
                             f"with model.to('cuda:{device_ids[0]}') or pass device_ids=[{index}]")
        if out_dev is None:
            out_dev = device_ids[0] if device_ids else None
    if forward_sync_buffers is not None:
        fwd, init = bool(forward_sync_buffers), True
    else:
        fwd = init = True if broadcast_buffers is None else bool(broadcast_buffers)
    return Settings(model, pg, size, 1 if last_comm_buffer_size is None else last_comm_buffer_size,
                    device_ids or None, out_dev, fwd, init)
