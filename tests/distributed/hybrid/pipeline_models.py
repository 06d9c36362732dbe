"""Tiny pipeline models for the pipeline tests (module level: run_ranks pickles the rank functions by name).

Each ``*_descs()`` returns Paddle-style layer descriptions; ``reference(kind)`` builds the same model as a plain
torch module written by hand (as Paddle's pipeline tests compare against a hand-written model), seeded, with the
parameter names of the stages (global layer indices, ``shared_layers.<key>`` for a tied layer), so every rank
copies the same initial weights into its stage and the reference never runs fleetlite's pipeline code.
"""

import torch
from torch import nn

from fleetlite.distributed.fleet.meta_parallel import LayerDesc, SharedLayerDesc

VOCAB, HIDDEN = 32, 8


def mlp_descs():
    return [LayerDesc(nn.Linear, 6, 12), nn.Tanh(), LayerDesc(nn.Linear, 12, 12), nn.Tanh(),
            LayerDesc(nn.Linear, 12, 4)]


def mlp_batch(step, rows=8, rank=0):
    g = torch.Generator().manual_seed(100 + step * 10 + rank)
    return torch.randn(rows, 6, generator=g), torch.randint(0, 4, (rows,), generator=g)


class EmbeddingPipe(nn.Module):
    """(tokens, extra int tensor) -> (embeddings, extra): a tuple crosses the stage boundary, as Paddle's test."""

    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)

    @property
    def embedding_weight(self):
        return self.word_embeddings.weight

    def forward(self, args):
        x1, x2 = args
        return self.word_embeddings(x1), x2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, args):
        h, x2 = args
        return torch.tanh(self.fc(h)) + 0.01 * x2.unsqueeze(-1).float(), x2


def _logits(embedding, args):
    return args[0] @ embedding.embedding_weight.t()


def tied_loss(logits, labels):
    """Labels arrive as the tuple ``(y,)`` the user gave (Paddle's LossNet indexes ``y1[0]``)."""
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels[0].reshape(-1))


def tied_descs():
    return [SharedLayerDesc("embed", EmbeddingPipe, shared_weight_attr="embedding_weight"),
            LayerDesc(Block), LayerDesc(Block),
            SharedLayerDesc("embed", EmbeddingPipe, forward_func=_logits, shared_weight_attr="embedding_weight")]


def tied_batch(step, rows=8, rank=0):
    g = torch.Generator().manual_seed(200 + step * 10 + rank)
    x1 = torch.randint(0, VOCAB, (rows, 3), generator=g)
    x2 = torch.randint(0, 5, (rows, 3), generator=g)
    y = torch.randint(0, VOCAB, (rows, 3), generator=g)
    return (x1, x2), (y,)


class MlpReference(nn.Sequential):
    """``mlp_descs`` by hand."""

    def __init__(self):
        super().__init__(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 4))


class TiedReference(nn.Module):
    """``tied_descs`` by hand: one embedding whose weight is also the output projection."""

    def __init__(self):
        super().__init__()
        self.shared_layers = nn.ModuleDict({"embed": EmbeddingPipe()})
        self.add_module("1", Block())
        self.add_module("2", Block())

    def forward(self, x1, x2):
        h, _ = getattr(self, "2")(getattr(self, "1")(self.shared_layers["embed"]((x1, x2))))
        return h @ self.shared_layers["embed"].word_embeddings.weight.t()


class EmbeddingReference(nn.Module):
    """``embedding_layers`` by hand: embedding, projection, bias; the output is the tuple (projection, x2)."""

    def __init__(self):
        super().__init__()
        for i, layer in enumerate(embedding_layers()):
            self.add_module(str(i), layer)

    def forward(self, x1, x2):
        h = (x1, x2)
        for layer in self.children():
            h = layer(h)
        return h


def reference(kind: str) -> nn.Module:
    """The single-process reference of ``kind`` ("mlp", "tied", "embedding"), from seed 0."""
    torch.manual_seed(0)
    return {"mlp": MlpReference, "tied": TiedReference, "embedding": EmbeddingReference}[kind]()


def copy_from(stage, ref):
    """Load the reference's weights into this stage (the names match: global layer indices)."""
    ref_state = ref.state_dict()
    with torch.no_grad():
        for name, t in stage.state_dict().items():
            t.copy_(ref_state[name])


class MatmulNet(nn.Module):
    """Paddle's hybrid_parallel_pp_embedding.py layers: built modules (not descriptions), a tuple output."""

    def __init__(self):
        super().__init__()
        self.softmax_weight = nn.Parameter(torch.randn(HIDDEN, VOCAB) * 0.3)

    def forward(self, args):
        x1, x2 = args
        return x1 @ self.softmax_weight, x2


class BiasNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax_bias = nn.Parameter(torch.randn(VOCAB) * 0.1)

    def forward(self, args):
        fc, x2 = args
        return (fc + self.softmax_bias).reshape(-1, VOCAB), x2


def embedding_loss(args, y1):
    """Paddle's LossNet: the last stage's output is the tuple (projection, x2); labels the tuple (y1,)."""
    projection, _ = args
    return nn.functional.cross_entropy(projection, y1[0].reshape(-1))


def embedding_layers():
    return [EmbeddingPipe(), MatmulNet(), BiasNet()]


# -- interleaved (virtual) stages ----------------------------------------------------------------------------------
def deep_descs():
    """Eight layers: pp2 x 2 virtual stages gives four chunks of two (chunks 0, 2 on stage 0; 1, 3 on stage 1)."""
    return [LayerDesc(nn.Linear, 6, 12), nn.Tanh(), LayerDesc(nn.Linear, 12, 12), nn.Tanh(),
            LayerDesc(nn.Linear, 12, 12), nn.Tanh(), LayerDesc(nn.Linear, 12, 4), nn.Identity()]


class DeepReference(nn.Sequential):
    """``deep_descs`` by hand."""

    def __init__(self):
        super().__init__(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 12), nn.Tanh(),
                         nn.Linear(12, 4), nn.Identity())


class Scale(nn.Module):
    """(logits) -> logits * a learned scalar: a layer after the tied head."""

    def __init__(self):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(1.25))

    def forward(self, logits):
        return logits * self.alpha


def tied_tail_descs():
    """The tied embedding/head on one stage in two chunks (with seg_method=[0, 1, 2, 3] and pp2 x 2 virtual
    stages: chunk 0 the embedding and chunk 2 the head on stage 0; the Block and the Scale on stage 1)."""
    return [SharedLayerDesc("embed", EmbeddingPipe, shared_weight_attr="embedding_weight"), LayerDesc(Block),
            SharedLayerDesc("embed", EmbeddingPipe, forward_func=_logits, shared_weight_attr="embedding_weight"),
            LayerDesc(Scale)]


class TiedTailReference(nn.Module):
    """``tied_tail_descs`` by hand."""

    def __init__(self):
        super().__init__()
        self.shared_layers = nn.ModuleDict({"embed": EmbeddingPipe()})
        self.add_module("1", Block())
        self.add_module("3", Scale())

    def forward(self, x1, x2):
        h, _ = getattr(self, "1")(self.shared_layers["embed"]((x1, x2)))
        return getattr(self, "3")(h @ self.shared_layers["embed"].word_embeddings.weight.t())


def reference_more(kind: str) -> nn.Module:
    """The single-process reference of ``kind`` ("deep", "tied_tail"), from seed 0."""
    torch.manual_seed(0)
    return {"deep": DeepReference, "tied_tail": TiedTailReference}[kind]()
