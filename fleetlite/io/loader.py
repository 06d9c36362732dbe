"""``TensorLoader``: the batched tensor input pipeline (airbench-style), iterable like a loader; and
``DataLoader``: torch's DataLoader, callable as Paddle's is (``for data in loader():``).

The whole split stays one uint8 tensor on the training device. Each step
takes the indices of this rank's batch from a :class:`DistributedBatchSampler`,
gathers those images, and applies per-sample random crop and horizontal flip
and the float conversion with normalisation, batched on tensors.

Note [augmentation seeds]
    The crop offsets and flips of an epoch are drawn once per pass for every
    sample *index* from ``(seed, epoch)``, not per batch. So a sample's
    augmentation does not depend on the batch layout: it is the same on one
    rank or eight, before and after a resume, and padding repeats of a sample
    get the same pixels as the sample itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from .image_ops import PAD_MODES, crop_flip, normalize, normalize_params
from .sampler import DistributedBatchSampler

__all__ = ["TensorLoader", "DataLoader"]


class DataLoader(torch.utils.data.DataLoader):
    """torch's ``DataLoader`` (same arguments and behaviour), also callable as Paddle's ``paddle.io.DataLoader``:
    ``loader()`` returns a fresh iterator, so a Paddle loop ``for data in train_loader():`` runs unchanged.

    Example::

        import torch
        from fleetlite.io import DataLoader, TensorDataset
        loader = DataLoader(TensorDataset(torch.arange(6.0)), batch_size=4)
        for (x,) in loader():        # Paddle's spelling
            pass
        for (x,) in loader:          # torch's
            pass
    """

    def __call__(self) -> Iterator[Any]:
        return self.__iter__()


class TensorLoader:
    """Batches of normalised (optionally augmented) images from uint8 tensors, per rank.

    Args:
        images: uint8 ``(N, C, H, W)`` tensor (``Cifar10(...).as_tensors()[0]``).
        labels: int64 ``(N,)`` tensor.
        batch_size: local batch size.
        shuffle, drop_last, seed, num_replicas, rank: as for
            :class:`~fleetlite.io.DistributedBatchSampler` (``.batch_sampler``).
        augment: random crop (``padding`` pixels, ``pad_mode``) and horizontal
            flip per sample; turn off for evaluation.
        mean, std: per-channel normalisation (in [0, 1] units); default none (mean 0, std 1: the
            pixels scaled to [0, 1], as torchvision's ``ToTensor``). CIFAR-10's are
            ``fleetlite.vision.transforms.CIFAR10_MEAN`` / ``CIFAR10_STD``.
        channels_last: return images in channels_last memory format.
        device: where images live and batches are made (default: the images' device).
        pad_mode: ``"zeros"`` (torchvision's ``RandomCrop(padding=4)``),
            ``"reflect"`` (airbench) or ``"replicate"``.
        padding: crop padding in pixels.

    Example::

        from fleetlite.io import TensorLoader
        from fleetlite.vision.datasets import SyntheticCifar10
        from fleetlite.vision.transforms import CIFAR10_MEAN, CIFAR10_STD
        x, y = SyntheticCifar10(size=1000).as_tensors()
        loader = TensorLoader(x, y, batch_size=256, num_replicas=1, rank=0, mean=CIFAR10_MEAN, std=CIFAR10_STD)
        for epoch in range(2):
            loader.set_epoch(epoch)
            for images, labels in loader:   # float32 (256, 3, 32, 32), int64 (256,)
                pass
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, shuffle: bool = True,
                 drop_last: bool = False, augment: bool = True, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, channels_last: bool = False,
                 device: torch.device | str | None = None, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None, pad_mode: str = "zeros", padding: int = 4):
        if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4:
            raise TypeError(f"images must be a uint8 tensor of shape (N, C, H, W), got "
                            f"{getattr(images, 'dtype', type(images).__name__)} of shape "
                            f"{tuple(getattr(images, 'shape', ()))}; use dataset.as_tensors() for CIFAR-10")
        if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.dtype != torch.int64:
            raise TypeError(f"labels must be an int64 tensor of shape (N,), got "
                            f"{getattr(labels, 'dtype', type(labels).__name__)} of shape "
                            f"{tuple(getattr(labels, 'shape', ()))}")
        if labels.shape[0] != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels: they must pair up")
        c = images.shape[1]
        mean = (0.0,) * c if mean is None else mean
        std = (1.0,) * c if std is None else std
        if len(mean) != c or len(std) != c:
            raise ValueError(f"mean and std need one value per channel ({c}), got {len(mean)} and {len(std)}")
        if pad_mode not in PAD_MODES:
            raise ValueError(f"pad_mode={pad_mode!r} is not one of {PAD_MODES}")
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding={padding!r} must be an integer >= 0")
        if augment and pad_mode == "reflect" and padding >= min(images.shape[2:]):
            raise ValueError(f"reflect padding needs padding < image size, got padding={padding}; "
                             "use pad_mode='zeros' or a smaller padding")
        self.device = torch.device(device) if device is not None else images.device
        self.images = images.to(self.device)
        self.labels = labels.to(self.device)
        self.batch_sampler = DistributedBatchSampler(range(images.shape[0]), batch_size, num_replicas, rank,
                                                     shuffle, drop_last, seed)
        self.batch_size = self.batch_sampler.batch_size
        self.augment, self.channels_last = bool(augment), bool(channels_last)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.pad_mode, self.padding = pad_mode, padding
        self._norm: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _norm_params(self, device: torch.device, dtype: torch.dtype = torch.float32):
        """mean/std as scale and bias on ``device``: made once per device and dtype, not copied per batch."""
        key = (device, dtype)
        if key not in self._norm:
            self._norm[key] = normalize_params(self.mean, self.std, device, dtype)
        return self._norm[key]

    # -- iteration ---------------------------------------------------------------------------------------------

    def _augmentation(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # Note [augmentation seeds]: per sample index, from (seed, epoch) only; drawn on the host (the same
        # values on every device) and sent to the device in one copy, from pinned memory without blocking
        rng = np.random.default_rng([self.batch_sampler.seed, epoch, 1])
        n = self.images.shape[0]
        dy = rng.integers(0, 2 * self.padding + 1, n)
        dx = rng.integers(0, 2 * self.padding + 1, n)
        flip = rng.integers(0, 2, n)
        table = torch.from_numpy(np.stack([dy, dx, flip]).astype(np.int64))
        table = table.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" \
            else table.to(self.device)
        return table[0], table[1], table[2].bool()

    def _indices(self) -> Iterator[torch.Tensor]:
        """Each batch's indices on the loader's device: slices of the pass's order, copied there once."""
        sampler = self.batch_sampler
        if hasattr(sampler, "device_batches"):
            yield from sampler.device_batches(self.device)
            return
        for indices in sampler:  # another sampler with the protocol: one pinned, non-blocking copy per batch
            idx = torch.tensor(indices, dtype=torch.int64)
            yield (idx.pin_memory() if self.device.type == "cuda" else idx).to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.batch_sampler.epoch  # the epoch the sampler's next pass uses
        aug = self._augmentation(epoch) if self.augment else None
        for idx in self._indices():
            x = self.images.index_select(0, idx)
            if aug is not None:
                x = crop_flip(x, aug[0][idx], aug[1][idx], aug[2][idx], self.padding, self.pad_mode)
            yield (normalize(x, self.mean, self.std, self.channels_last, params=self._norm_params(x.device)),
                   self.labels.index_select(0, idx))

    def __call__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A fresh iterator, as ``iter(loader)``: Paddle's ``for data in loader():``."""
        return self.__iter__()

    def __len__(self) -> int:
        return len(self.batch_sampler)

    @property
    def num_samples(self) -> int:
        """Images in the whole split (all ranks together)."""
        return int(self.images.shape[0])

    # -- sampler delegation ------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.batch_sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """Shuffle order and augmentation of epoch ``epoch`` (see ``DistributedBatchSampler.set_epoch``)."""
        self.batch_sampler.set_epoch(epoch)

    def num_valid(self, batch_index: int) -> int:
        """Leading real samples of local batch ``batch_index`` (the rest pad the last batches)."""
        return self.batch_sampler.num_valid(batch_index)

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Position, epoch and seed; augmentation is a function of them (Note [augmentation seeds])."""
        return {"sampler": self.batch_sampler.state_dict(consumed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "sampler" not in state:
            raise ValueError(f"not a TensorLoader state (expected a dict with 'sampler'), got {state!r:.200}")
        self.batch_sampler.load_state_dict(state["sampler"])

    set_state_dict = load_state_dict  # Paddle's name

    def __repr__(self) -> str:
        return (f"TensorLoader(n={self.num_samples}, batch_size={self.batch_size}, augment={self.augment}, "
                f"device={self.device}, sampler={self.batch_sampler!r})")
