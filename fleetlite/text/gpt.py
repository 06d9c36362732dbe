"""A small GPT on Paddle's hybrid building blocks: plain torch with one process, tensor parallel when
``hybrid_configs['mp_degree'] > 1``, and the same model as a ``PipelineLayer`` description for ``pp_degree > 1``.
Under ``sep_degree > 1`` each rank takes its part of the sequence (``mpu.split_inputs_sequence_dim([ids, targets])``)
and the attention runs over the whole sequence through ``mpu.segment_attention`` (an all-to-all around it).

Blocks (pre-norm): attention ``qkv`` is a ``ColumnParallelLinear(gather_output=False)`` whose output features
are laid out head by head (``[head0: q k v | head1: q k v | ...]``), so each mp rank's slice holds whole heads;
the output projection is a ``RowParallelLinear(input_is_parallel=True)``; the MLP likewise. The token table is
a ``VocabParallelEmbedding``, tied to the output head, whose logits stay split over the vocabulary into a
``ParallelCrossEntropy``.

# Note [gpt init]
Every weight is drawn from its own generator, seeded by ``(seed, the weight's name)``, on the full (unsplit)
tensor; tensor-parallel layers keep their slice. So a model built on any mp/pp degree starts from exactly the
weights a single process builds, whatever each rank builds and in whatever order (biases start at zero).

Example::

    from fleetlite.text.gpt import GPT, GPTConfig
    model = GPT(GPTConfig(width=128, layers=2, heads=4))       # after fleet.init for mp > 1
    loss = model(ids, targets)                                # mean next-token cross entropy
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fleetlite.distributed.fleet import meta_parallel as mpu
from fleetlite.distributed.fleet.meta_parallel.mp_ops import _c_identity

__all__ = ["GPTConfig", "GPT", "gpt_pipeline_descs", "gpt_loss", "mp_world"]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    width: int = 128
    layers: int = 2
    heads: int = 4
    seq_len: int = 32
    mlp_ratio: int = 4
    seed: int = 0          # Note [gpt init]
    init_std: float = 0.02


def mp_world() -> tuple[int, Any]:
    """(mp degree, mp group) of the current fleet topology; (1, None) without fleet.init or with mp = 1."""
    from fleetlite.distributed import fleet

    if not fleet.is_initialized():
        return 1, None
    hcg = fleet.get_hybrid_communicate_group()
    n = hcg.get_model_parallel_world_size()
    return n, (hcg.get_model_parallel_group() if n > 1 else None)


def _init(cfg: GPTConfig, name: str, std: float | None = None):
    """Note [gpt init]: a normal initializer for the full weight named ``name``."""
    def init(w: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(cfg.seed * 7919 + zlib.crc32(name.encode()))
        with torch.no_grad():
            return w.copy_(torch.randn(w.shape, generator=g) * (cfg.init_std if std is None else std))
    return init


def _column(cfg: GPTConfig, n_in: int, n_out: int, name: str) -> nn.Module:
    if mp_world()[0] > 1:
        return mpu.ColumnParallelLinear(n_in, n_out, weight_attr=_init(cfg, name), has_bias=True, gather_output=False)
    return _plain_linear(cfg, n_in, n_out, name)


def _row(cfg: GPTConfig, n_in: int, n_out: int, name: str) -> nn.Module:
    if mp_world()[0] > 1:
        return mpu.RowParallelLinear(n_in, n_out, weight_attr=_init(cfg, name), has_bias=True, input_is_parallel=True)
    return _plain_linear(cfg, n_in, n_out, name)


def _plain_linear(cfg: GPTConfig, n_in: int, n_out: int, name: str) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, device="meta")  # no draws from the global generator
    layer.weight = nn.Parameter(_init(cfg, name)(torch.empty(n_out, n_in)))
    layer.bias = nn.Parameter(torch.zeros(n_out))
    return layer


class Block(nn.Module):
    """A pre-norm transformer block; ``index`` names its weights for Note [gpt init]."""

    def __init__(self, cfg: GPTConfig, index: int) -> None:
        super().__init__()
        n, _ = mp_world()
        if cfg.heads % n or cfg.width % cfg.heads:
            raise ValueError(f"GPT: heads={cfg.heads} must divide width={cfg.width} and be divisible by mp_degree "
                             f"{n} (each mp rank holds whole heads); choose heads accordingly")
        self.heads_local, self.head_dim = cfg.heads // n, cfg.width // cfg.heads
        w, hidden = cfg.width, cfg.mlp_ratio * cfg.width
        self.ln1, self.ln2 = nn.LayerNorm(w), nn.LayerNorm(w)
        self.qkv = _column(cfg, w, 3 * w, f"block{index}.qkv")     # head by head: [q k v] per head
        self.proj = _row(cfg, w, w, f"block{index}.proj")
        self.up = _column(cfg, w, hidden, f"block{index}.up")
        self.down = _row(cfg, hidden, w, f"block{index}.down")

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, self.heads_local, 3, self.head_dim).unbind(3)  # [b, t, h, d]
        a = mpu.segment_attention(q, k, v, is_causal=True)  # under sep: the whole sequence's (all-to-all around it)
        h = h + self.proj(a.reshape(b, t, self.heads_local * self.head_dim))
        return h + self.down(F.gelu(self.up(self.ln2(h))))


class TokenEmbedding(nn.Module):
    """The token table (vocabulary split over mp ranks when mp > 1), also the tied output head (:meth:`logits`)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if mp_world()[0] > 1:
            self.table = mpu.VocabParallelEmbedding(cfg.vocab_size, cfg.width, weight_attr=_init(cfg, "tokens"))
        else:
            self.table = nn.Embedding(cfg.vocab_size, cfg.width, _weight=_init(cfg, "tokens")(
                torch.empty(cfg.vocab_size, cfg.width)))

    @property
    def weight(self) -> torch.Tensor:
        return self.table.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """``h @ table.T``: with mp > 1, this rank's slice of the vocabulary (the gradient of ``h`` summed)."""
        return F.linear(_c_identity(h, mp_world()[1]), self.table.weight)


class PositionEmbedding(nn.Module):
    """Adds a learned position embedding (replicated on every mp rank)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.pos = nn.Parameter(_init(cfg, "positions")(torch.empty(cfg.seq_len, cfg.width)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        start = mpu.sequence_offset(h.shape[1])  # under sep: this rank's part of the sequence
        return h + self.pos[start: start + h.shape[1]]


def gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy; vocabulary-split logits go through ``ParallelCrossEntropy``."""
    n, group = mp_world()
    if n > 1:
        return mpu.ParallelCrossEntropy(mp_group=group)(logits, targets).mean()
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


class GPT(nn.Module):
    """token + position embedding -> ``layers`` blocks -> final norm -> tied head; ``forward(ids, targets)`` is
    the mean loss (``targets=None``: the logits, split over the vocabulary when mp > 1).

    # Note [gpt names]
    The layers are registered under the names a ``PipelineLayer`` of :func:`gpt_pipeline_descs` gives them (the
    token table ``shared_layers.embed``, then ``1`` the positions, ``2 ..`` the blocks, the final norm), in the
    same order, so one state dict (and one AdamW state, keyed by parameter name) fits every layout: a checkpoint
    saved with pp = 2 loads into one process or mp = 2 and back (DCP reshards the slices and stages).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.shared_layers = nn.ModuleDict({"embed": TokenEmbedding(cfg)})
        layers = [PositionEmbedding(cfg), *(Block(cfg, i) for i in range(cfg.layers)), nn.LayerNorm(cfg.width)]
        for index, layer in enumerate(layers, start=1):
            self.add_module(str(index), layer)

    @property
    def embed(self) -> TokenEmbedding:
        return self.shared_layers["embed"]

    @property
    def position(self) -> PositionEmbedding:
        return self.get_submodule("1")

    @property
    def blocks(self) -> list[Block]:
        return [self.get_submodule(str(i)) for i in range(2, 2 + self.cfg.layers)]

    @property
    def norm(self) -> nn.LayerNorm:
        return self.get_submodule(str(2 + self.cfg.layers))

    def forward(self, ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        h = self.position(self.embed(ids))
        for block in self.blocks:
            h = block(h)
        logits = self.embed.logits(self.norm(h))
        return logits if targets is None else gpt_loss(logits, targets)


def _tied_logits(embed: TokenEmbedding, h: torch.Tensor) -> torch.Tensor:
    return embed.logits(h)


def gpt_pipeline_descs(cfg: GPTConfig) -> list[Any]:
    """The same GPT as a ``PipelineLayer`` list: the token table shared by the first and last stage (its names
    are :class:`GPT`'s, Note [gpt names])."""
    return [mpu.SharedLayerDesc("embed", TokenEmbedding, None, "weight", cfg),
            mpu.LayerDesc(PositionEmbedding, cfg),
            *[mpu.LayerDesc(Block, cfg, i) for i in range(cfg.layers)],
            mpu.LayerDesc(nn.LayerNorm, cfg.width),
            mpu.SharedLayerDesc("embed", TokenEmbedding, _tied_logits, "weight", cfg)]
