"""fleetlite.seed_everything returns a generator as paddle.seed does (torch's default CPU generator)."""

import torch

import fleetlite


def test_seed_everything_returns_the_seeded_default_generator():
    gen = fleetlite.seed_everything(123)
    assert isinstance(gen, torch.Generator) and gen is torch.default_generator
    assert gen.initial_seed() == 123
    first = torch.rand(3, generator=gen)
    fleetlite.seed_everything(123)
    assert torch.equal(torch.rand(3), first)  # the global draws follow the same generator
