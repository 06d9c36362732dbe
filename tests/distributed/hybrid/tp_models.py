"""A small tensor-parallel language model and its single-process twin, for the hybrid parity tests."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from parity import max_abs_diff, worst

import fleetlite.distributed.fleet as fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    ParallelCrossEntropy,
    RowParallelLinear,
    VocabParallelEmbedding,
    is_split,
)

VOCAB, WIDTH, HIDDEN = 16, 8, 12


class TPModel(nn.Module):
    """embedding -> column (no gather) -> gelu -> row -> column head (no gather) -> parallel cross entropy."""

    def __init__(self):
        super().__init__()
        self.emb = VocabParallelEmbedding(VOCAB, WIDTH)
        self.up = ColumnParallelLinear(WIDTH, HIDDEN, has_bias=True, gather_output=False)
        self.down = RowParallelLinear(HIDDEN, WIDTH, input_is_parallel=True)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = ColumnParallelLinear(WIDTH, VOCAB, has_bias=False, gather_output=False)
        self.loss = ParallelCrossEntropy()

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = self.norm(h + self.down(F.gelu(self.up(h))))
        return self.loss(self.head(h), labels).mean()


class RefModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = self.norm(h + self.down(F.gelu(self.up(h))))
        return F.cross_entropy(self.head(h).flatten(0, -2), labels.flatten())


def init_mp(degrees):
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = degrees
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group()


def local_slice(full, param, hcg):
    if not is_split(param):
        return full
    return full.chunk(hcg.get_model_parallel_world_size(), dim=param.split_axis)[hcg.get_model_parallel_rank()]


def copy_from(model, ref, hcg):
    with torch.no_grad():
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            p.copy_(local_slice(ref_params[name], p, hcg))


def max_param_diff(model, ref, hcg):
    model = getattr(model, "_layers", model)
    ref_params = dict(ref.named_parameters())
    return worst(max_abs_diff(p, local_slice(ref_params[n], p, hcg)) for n, p in model.named_parameters())


def data(steps, batch):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, VOCAB, (batch, 5), generator=g), torch.randint(0, VOCAB, (batch, 5), generator=g))
            for _ in range(steps)]


def train_with_reference(model, opt, ref, ref_opt, steps, rows, part, parts, clip, after_backward=None):
    """``steps`` AdamW steps of the hybrid ``model`` on its ``part`` of ``parts`` data parts (``rows`` rows each)
    beside the single-process ``ref`` on the whole batch, clipped by ``clip`` (torch's ``clip_grad_norm_`` for the
    reference; the hybrid optimizer clips through its ``hybrid_clip``). ``after_backward(step)``: called between
    the hybrid backward and step. Returns (losses, reference losses, norms, reference norms), one per step."""
    losses, ref_losses, norms, ref_norms = [], [], [], []
    for step, (ids, labels) in enumerate(data(steps, rows * parts)):
        part_rows = slice(part * rows, (part + 1) * rows)
        loss = model(ids[part_rows], labels[part_rows])
        loss.backward()
        if after_backward is not None:
            after_backward(step)
        opt.step()
        opt.clear_grad()
        losses.append(loss.item())
        norms.append(opt.hybrid_clip.last_norm.item())
        ref_loss = ref(ids, labels)
        ref_loss.backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip).item())
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(ref_loss.item())
    return losses, ref_losses, norms, ref_norms
