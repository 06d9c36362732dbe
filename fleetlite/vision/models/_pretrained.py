"""``pretrained=True`` in Paddle's model builders: refused here, with the way to load weights from a file."""

from __future__ import annotations


def refuse_pretrained(arch: str, pretrained: bool, torchvision_name: str | None = None) -> None:
    """Raise when ``pretrained`` is true: nothing is downloaded; say how to load a weights file instead."""
    if not pretrained:
        return
    tv = (f" torchvision's ImageNet weights have the same parameter names: "
          f"net.load_state_dict(torchvision.models.{torchvision_name}(weights='DEFAULT').state_dict()) where "
          "torchvision can download them.") if torchvision_name else ""
    raise RuntimeError(
        f"{arch}(pretrained=True): fleetlite does not download pretrained weights (Paddle's .pdparams files are "
        f"fetched from Paddle's servers and are in Paddle's format). Build the model with pretrained=False and "
        f"load a PyTorch state dict you have: net.load_state_dict(torch.load(PATH, weights_only=True)), or "
        f"fleetlite.utils.weights.load_safetensors(net, PATH) for a .safetensors file.{tv}")
