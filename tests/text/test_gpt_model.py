"""The recipe's GPT (fleetlite.text.gpt): the same weights and losses on any degrees (Note [gpt init]).

References: the single-process GPT. mp = 2 on 2 ranks gives its loss and its gradient norm; the pipeline
description run as one stage gives its loss; the corpus and batches are deterministic.
"""

import pytest
import torch

from fleetlite.testing import run_ranks
from fleetlite.text.corpus import VOCAB_SIZE, batch_of_windows, decode, encode, synthetic_corpus
from fleetlite.text.gpt import GPT, GPTConfig, gpt_loss, gpt_pipeline_descs

CFG = GPTConfig(width=32, layers=2, heads=4, seq_len=16)


def _data():
    return batch_of_windows(encode(synthetic_corpus(4000, seed=1)), 4, CFG.seq_len, seed=0, step=0)


def _reference():
    model = GPT(CFG)
    x, y = _data()
    loss = model(x, y)
    loss.backward()
    norm = torch.sqrt(sum(p.grad.square().sum() for p in model.parameters()))
    return loss.item(), norm.item()


def test_corpus_and_batches_are_deterministic_bytes():
    text = synthetic_corpus(1000, seed=3)
    assert text == synthetic_corpus(1000, seed=3) != synthetic_corpus(1000, seed=4) and len(text) == 1000
    assert decode(encode(text)) == text and int(encode(text).max()) < VOCAB_SIZE
    x, y = _data()
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(x, _data()[0])


def test_pipeline_description_as_one_stage_is_the_same_model():
    from fleetlite.distributed.fleet.meta_parallel import PipelineLayer

    x, y = _data()
    stage = PipelineLayer(gpt_pipeline_descs(CFG), num_stages=1, loss_fn=gpt_loss)
    assert stage(x).shape == (4, CFG.seq_len, VOCAB_SIZE)
    assert gpt_loss(stage(x), y).item() == pytest.approx(_reference()[0], abs=1e-6)


def _mp2(rank, world):
    from fleetlite.distributed import fleet
    from fleetlite.distributed.fleet.meta_parallel import is_split
    from fleetlite.distributed.fleet.meta_parallel.hybrid_clip import global_norm_hybrid

    s = fleet.DistributedStrategy()
    s.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 1}
    fleet.init(is_collective=True, strategy=s)
    model = GPT(CFG)
    assert any(is_split(p) for p in model.parameters())
    x, y = _data()
    loss = model(x, y)
    loss.backward()
    return loss.item(), global_norm_hybrid(model.parameters(), fleet.get_hybrid_communicate_group()).item()


@pytest.mark.timeout(200)
def test_mp2_gives_the_single_process_loss_and_gradient_norm():
    ref_loss, ref_norm = _reference()
    for loss, norm in run_ranks(_mp2, world_size=2, timeout=180):
        assert loss == pytest.approx(ref_loss, abs=1e-5) and norm == pytest.approx(ref_norm, rel=1e-5)
