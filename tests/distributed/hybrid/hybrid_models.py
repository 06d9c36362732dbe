"""The small models of the parallelism tests, their one-process twins and data, in one module (module level:
run_ranks pickles the rank functions by name; the tests import it as ``hybrid_models``).

Every hybrid model starts from the weights of a seeded single-process reference (this rank's slice of a
tensor-parallel weight, one stage's layers of a pipeline: :func:`copy_from`), so a hybrid run and a one-process
run must agree. The sections:

- set-up: :func:`init_fleet` (fleet.init over a dict of degrees), :func:`local_slice`, :func:`copy_from`,
  :func:`run_cases` (several runs in one launch);
- a tensor-parallel language model (``TPModel``/``RefModel``) and its AdamW loop beside the reference;
- the same layers inside pipeline stages (mp x pp: ``lm_descs``/``lm_reference``);
- pipelines (``*_descs()``: Paddle-style layer descriptions; ``reference(kind)``: the same model written by hand,
  as Paddle's pipeline tests compare against a hand-written model, with the stages' parameter names: global
  layer indices, ``shared_layers.<key>`` for a tied layer);
- the Trainer's runs (``reference_net``, ``tp_net``, ``pipeline_stage``, ``run_trainer``, ``compare``);
- checkpoints (``TPNet``/``RefNet``, ``pipe_descs`` with a tied weight, ``tp_trainer``/``pp_trainer``).
"""

from __future__ import annotations

import torch
import torch.distributed as td
import torch.nn.functional as F
from parity import close, max_abs_diff, worst
from torch import nn
from torch.utils.data import TensorDataset

import fleetlite
from fleetlite.distributed import fleet
from fleetlite.distributed.fleet import fleet as fleet_impl
from fleetlite.distributed.fleet.meta_parallel import (
    ColumnParallelLinear,
    LayerDesc,
    ParallelCrossEntropy,
    PipelineLayer,
    RowParallelLinear,
    SharedLayerDesc,
    VocabParallelEmbedding,
    get_rng_state_tracker,
    is_split,
    model_parallel_random_seed,
)
from fleetlite.metric import Accuracy
from fleetlite.trainer.callbacks import LRScheduler


# -- set-up ---------------------------------------------------------------------------------------------------------
def init_fleet(degrees: dict, pipeline: dict | None = None, **fields):
    """``fleet.init`` afresh with ``degrees`` as ``hybrid_configs``, ``pipeline`` as ``pipeline_configs`` and any
    other strategy ``fields``; returns the hybrid communicate group (the strategy: ``fleet.user_strategy()``)."""
    fleet_impl._reset()
    strategy = fleet.DistributedStrategy(**fields)
    strategy.hybrid_configs = degrees
    if pipeline is not None:
        strategy.pipeline_configs = pipeline
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group()


def local_slice(full, param, hcg):
    """This rank's part of the full tensor ``full`` where ``param`` is a tensor-parallel slice; else ``full``."""
    if not is_split(param):
        return full
    return full.chunk(hcg.get_model_parallel_world_size(), dim=param.split_axis)[hcg.get_model_parallel_rank()]


def copy_from(model, ref, hcg=None, rename=lambda name: name):
    """Load the one-process ``ref``'s weights (and buffers) into ``model``, by name (``rename``: the model's name
    to the reference's): this rank's slice of each tensor-parallel one, this stage's entries of a pipeline."""
    ref_state = ref.state_dict()
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            t.copy_(local_slice(ref_state[rename(name)], t, hcg))


def run_cases(rank, world, cases):
    """Every case of ``cases`` (name -> (function, args, kwargs), each called as ``function(rank, world, *args,
    **kwargs)``) on this rank, in order, by name: several tests' runs of one layout in one ``run_ranks`` launch
    (module-level functions: run_ranks pickles them by name)."""
    return {name: fn(rank, world, *args, **kwargs) for name, (fn, args, kwargs) in cases.items()}


# -- a tensor-parallel language model -------------------------------------------------------------------------------
TP_VOCAB, TP_WIDTH, TP_HIDDEN = 16, 8, 12
STEPS, BATCH, CLIP = 5, 4, 0.3  # the tensor-parallel parity runs: AdamW steps, rows per data part, global clip


class TPModel(nn.Module):
    """embedding -> column (no gather) -> gelu -> row -> column head (no gather) -> parallel cross entropy."""

    def __init__(self):
        super().__init__()
        self.emb = VocabParallelEmbedding(TP_VOCAB, TP_WIDTH)
        self.up = ColumnParallelLinear(TP_WIDTH, TP_HIDDEN, has_bias=True, gather_output=False)
        self.down = RowParallelLinear(TP_HIDDEN, TP_WIDTH, input_is_parallel=True)
        self.norm = nn.LayerNorm(TP_WIDTH)
        self.head = ColumnParallelLinear(TP_WIDTH, TP_VOCAB, has_bias=False, gather_output=False)
        self.loss = ParallelCrossEntropy()

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = self.norm(h + self.down(F.gelu(self.up(h))))
        return self.loss(self.head(h), labels).mean()


class RefModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(TP_VOCAB, TP_WIDTH)
        self.up = nn.Linear(TP_WIDTH, TP_HIDDEN)
        self.down = nn.Linear(TP_HIDDEN, TP_WIDTH)
        self.norm = nn.LayerNorm(TP_WIDTH)
        self.head = nn.Linear(TP_WIDTH, TP_VOCAB, bias=False)

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = self.norm(h + self.down(F.gelu(self.up(h))))
        return lm_loss(self.head(h), labels)


def lm_loss(logits, labels):
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten())


def max_param_diff(model, ref, hcg):
    model = getattr(model, "_layers", model)
    ref_params = dict(ref.named_parameters())
    return worst(max_abs_diff(p, local_slice(ref_params[n], p, hcg)) for n, p in model.named_parameters())


def data(steps, batch):
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, TP_VOCAB, (batch, 5), generator=g), torch.randint(0, TP_VOCAB, (batch, 5), generator=g))
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


# -- the language model's layers inside pipeline stages (mp x pp) ---------------------------------------------------
LM_ROWS, LM_MICRO = 8, 2  # rows per step, per micro-batch


class ResBlock(nn.Module):
    """``x + down(act(up(x)))`` of tensor-parallel layers (column, then row), or of plain ones (``tp=False``) under
    the same names."""

    def __init__(self, width, hidden, act=F.gelu, tp=True):
        super().__init__()
        if tp:
            self.up = ColumnParallelLinear(width, hidden, has_bias=True, gather_output=False)
            self.down = RowParallelLinear(hidden, width, input_is_parallel=True)
        else:
            self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.act = act

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


def lm_descs():
    return [LayerDesc(VocabParallelEmbedding, TP_VOCAB, TP_WIDTH), LayerDesc(ResBlock, TP_WIDTH, TP_HIDDEN),
            LayerDesc(nn.LayerNorm, TP_WIDTH),
            LayerDesc(ColumnParallelLinear, TP_WIDTH, TP_VOCAB, has_bias=False, gather_output=True)]


def lm_reference():
    """``lm_descs`` as a plain torch model (its parameter names are the stages' global layer indices)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(TP_VOCAB, TP_WIDTH), ResBlock(TP_WIDTH, TP_HIDDEN, tp=False),
                         nn.LayerNorm(TP_WIDTH),
                         nn.Linear(TP_WIDTH, TP_VOCAB, bias=False))


# -- pipelines ------------------------------------------------------------------------------------------------------
PP_VOCAB, PP_HIDDEN = 32, 8


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
        self.word_embeddings = nn.Embedding(PP_VOCAB, PP_HIDDEN)

    @property
    def embedding_weight(self):
        return self.word_embeddings.weight

    def forward(self, args):
        x1, x2 = args
        return self.word_embeddings(x1), x2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(PP_HIDDEN, PP_HIDDEN)

    def forward(self, args):
        h, x2 = args
        return torch.tanh(self.fc(h)) + 0.01 * x2.unsqueeze(-1).float(), x2


def _logits(embedding, args):
    return args[0] @ embedding.embedding_weight.t()


def tied_loss(logits, labels):
    """Labels arrive as the tuple ``(y,)`` the user gave (Paddle's LossNet indexes ``y1[0]``)."""
    return nn.functional.cross_entropy(logits.reshape(-1, PP_VOCAB), labels[0].reshape(-1))


def tied_descs():
    return [SharedLayerDesc("embed", EmbeddingPipe, shared_weight_attr="embedding_weight"),
            LayerDesc(Block), LayerDesc(Block),
            SharedLayerDesc("embed", EmbeddingPipe, forward_func=_logits, shared_weight_attr="embedding_weight")]


def tied_batch(step, rows=8, rank=0):
    g = torch.Generator().manual_seed(200 + step * 10 + rank)
    x1 = torch.randint(0, PP_VOCAB, (rows, 3), generator=g)
    x2 = torch.randint(0, 5, (rows, 3), generator=g)
    y = torch.randint(0, PP_VOCAB, (rows, 3), generator=g)
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


class MatmulNet(nn.Module):
    """Paddle's hybrid_parallel_pp_embedding.py layers: built modules (not descriptions), a tuple output."""

    def __init__(self):
        super().__init__()
        self.softmax_weight = nn.Parameter(torch.randn(PP_HIDDEN, PP_VOCAB) * 0.3)

    def forward(self, args):
        x1, x2 = args
        return x1 @ self.softmax_weight, x2


class BiasNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax_bias = nn.Parameter(torch.randn(PP_VOCAB) * 0.1)

    def forward(self, args):
        fc, x2 = args
        return (fc + self.softmax_bias).reshape(-1, PP_VOCAB), x2


def embedding_loss(args, y1):
    """Paddle's LossNet: the last stage's output is the tuple (projection, x2); labels the tuple (y1,)."""
    projection, _ = args
    return nn.functional.cross_entropy(projection, y1[0].reshape(-1))


def embedding_layers():
    return [EmbeddingPipe(), MatmulNet(), BiasNet()]


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


REFERENCES = {"mlp": MlpReference, "tied": TiedReference, "embedding": EmbeddingReference, "deep": DeepReference,
              "tied_tail": TiedTailReference}


def reference(kind: str) -> nn.Module:
    """The single-process reference of ``kind`` (a key of ``REFERENCES``), from seed 0."""
    torch.manual_seed(0)
    return REFERENCES[kind]()


# -- the Trainer's runs ---------------------------------------------------------------------------------------------
N_TRAIN, N_EVAL = 48, 37  # 37: the last evaluation batches are short and padded across ranks
TOL = 1e-5


def dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x, y)


def reference_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


class TPMlp(nn.Module):
    """``reference_net``'s layers, the first two tensor-parallel (column, then row: the output is replicated)."""

    def __init__(self):
        super().__init__()
        self.l0 = ColumnParallelLinear(6, 16, has_bias=True, gather_output=False)
        self.l2 = RowParallelLinear(16, 16, input_is_parallel=True)
        self.l4 = nn.Linear(16, 3)

    def forward(self, x):
        return self.l4(torch.tanh(self.l2(torch.tanh(self.l0(x)))))


def _ref_name(name: str) -> str:
    """TPMlp's ``l0.weight`` is the reference's ``0.weight``."""
    return name[1:]


def tp_net() -> TPMlp:
    """A TPMlp holding this rank's slices of the reference's weights (after fleet.init)."""
    ref = reference_net()
    net = TPMlp()
    copy_from(net, ref, fleet.get_hybrid_communicate_group(), rename=_ref_name)
    return net


def full_tp_weights(net: nn.Module, rename: bool = True) -> dict[str, torch.Tensor]:
    """The full weights under the reference's names: slices gathered over the tensor-parallel group."""
    hcg = fleet.get_hybrid_communicate_group()
    group, size = hcg.get_model_parallel_group(), hcg.get_model_parallel_world_size()
    out = {}
    for name, p in net.named_parameters():
        t = p.detach().contiguous()
        if is_split(p) and size > 1:
            parts = [torch.empty_like(t) for _ in range(size)]
            td.all_gather(parts, t, group=group)
            t = torch.cat(parts, dim=p.split_axis)
        out[_ref_name(name) if rename else name] = t.clone()
    return out


def pipeline_descs(tp: bool = False):
    """The reference's layers as a pipeline description; ``tp``: the first two tensor-parallel (mp x pp)."""
    if tp:
        return [LayerDesc(ColumnParallelLinear, 6, 16, has_bias=True, gather_output=False), nn.Tanh(),
                LayerDesc(RowParallelLinear, 16, 16, input_is_parallel=True), nn.Tanh(), LayerDesc(nn.Linear, 16, 3)]
    return [LayerDesc(nn.Linear, 6, 16), nn.Tanh(), LayerDesc(nn.Linear, 16, 16), nn.Tanh(),
            LayerDesc(nn.Linear, 16, 3)]


def pipeline_stage(loss_fn: nn.Module | None, tp: bool = False) -> PipelineLayer:
    """This rank's stage (after fleet.init with pp), holding the reference's weights of its layers (sliced)."""
    hcg = fleet.get_hybrid_communicate_group()
    stage = PipelineLayer(pipeline_descs(tp), loss_fn=loss_fn, topology=hcg.topology())
    copy_from(stage, reference_net(), hcg)
    return stage


def all_stage_weights(stage: nn.Module) -> dict[str, torch.Tensor]:
    """Every stage's full weights (keys are global layer indices): slices gathered over the tensor-parallel
    group, then the stages' over the pipe group."""
    hcg = fleet.get_hybrid_communicate_group()
    mine = full_tp_weights(stage, rename=False)
    parts = [None] * hcg.get_pipe_parallel_world_size()
    td.all_gather_object(parts, mine, group=hcg.get_pipe_parallel_group())
    return {k: v for p in parts for k, v in p.items()}


def run_trainer(net: nn.Module, strategy, batch_size: int, eval_batch: int, epochs: int = 2, clip=None,
                loss: nn.Module | None = None):
    """fit (with eval_data), evaluate and predict; the same calls on every kind of run."""
    torch.set_num_threads(1)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
    t = fleetlite.Trainer(net, opt, loss, metrics=Accuracy(topk=(1, 2)), strategy=strategy, device="cpu")
    if clip is not None:
        t.compile(**clip)
    train, test = dataset(N_TRAIN, 1), dataset(N_EVAL, 2)
    sched = LRScheduler(torch.optim.lr_scheduler.StepLR(opt, 2, 0.5), by_step=True)  # the Trainer's own rules
    history = t.fit(train, eval_data=test, epochs=epochs, batch_size=batch_size, shuffle=True, seed=3, verbose=0,
                    callbacks=[sched])
    return t, {"history": history.history, "evaluate": t.evaluate(test, batch_size=eval_batch, verbose=0),
               "predict": t.predict(test, batch_size=eval_batch, stack_outputs=True)}


def more_predictions(t, batch: int, out_dir) -> dict:
    """predict of the inputs alone (no labels) and streamed to ``out_dir`` (merged .npy, dataset order)."""
    import numpy as np

    x = dataset(N_EVAL, 2).tensors[0]
    paths = t.predict(dataset(N_EVAL, 2), batch_size=batch, output_dir=out_dir)
    return {"predict_x": t.predict((x,), batch_size=batch, stack_outputs=True),
            "predict_file": torch.from_numpy(np.load(paths[0]))}


def stat_scores(t) -> list[int]:
    """A torchmetrics metric of counts (tp, fp, tn, fn, support): gathered over more ranks than the data group,
    every count would be doubled."""
    import torchmetrics

    t.compile(metrics=torchmetrics.classification.MulticlassStatScores(num_classes=3, average="micro"))
    return t.evaluate(dataset(N_EVAL, 2), batch_size=8, verbose=0)["multiclassstatscores"]


def compare(got: dict, ref: dict) -> list[str]:
    """What differs by more than TOL between two runs' results (empty when they agree; a NaN on either side
    differs, see tests/parity.py)."""
    bad = []
    for key in ref["history"]:
        a, b = torch.tensor(got["history"][key]), torch.tensor(ref["history"][key])
        if not _close(a, b):
            bad.append(f"history[{key}]: {a.tolist()} vs {b.tolist()}")
    if set(got["evaluate"]) != set(ref["evaluate"]):
        bad.append(f"evaluate keys {sorted(got['evaluate'])} vs {sorted(ref['evaluate'])}")
    for key, v in ref["evaluate"].items():
        if not _close(got["evaluate"].get(key, float("nan")), v):
            bad.append(f"evaluate[{key}]: {got['evaluate'].get(key)} vs {v}")
    if "stat_scores" in ref and got.get("stat_scores") != ref["stat_scores"]:
        bad.append(f"torchmetrics counts {got.get('stat_scores')} vs {ref['stat_scores']}")
    for key in ("predict", "predict_x", "predict_file"):
        if key in got and not _close(got[key], ref["predict"]):
            bad.append(f"{key}: shapes {tuple(got[key].shape)} / {tuple(ref['predict'].shape)}")
    for key, w in ref["weights"].items():
        if key not in got["weights"] or not _close(got["weights"][key], w):
            bad.append(f"weight {key}")
    return bad


def _close(a, b) -> bool:
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    return a.shape == b.shape and close(a, b, TOL)


# -- checkpoints ----------------------------------------------------------------------------------------------------
# ``TPNet`` (mp slices) and ``RefNet`` (plain) share parameter names and, seeded alike, initial weights (the
# tensor-parallel layers draw the full weight and keep their slice). ``pipe_descs()`` is a pipeline with a weight
# shared by its first and last layer; ``PipelineLayer(pipe_descs(), num_stages=1)`` is its single-process model.
IN, HIDDEN, OUT = 6, 8, 6


class TPNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = ColumnParallelLinear(IN, HIDDEN, has_bias=True, gather_output=False)
        self.down = RowParallelLinear(HIDDEN, OUT, input_is_parallel=True)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class TPDropNet(TPNet):
    """``TPNet`` with dropout on the sharded activations, under the model-parallel RNG tracker (its state must be
    checkpointed per rank for a bit-identical resume)."""

    def forward(self, x):
        h = torch.relu(self.up(x))
        with get_rng_state_tracker().rng_state():
            h = nn.functional.dropout(h, 0.3, self.training)
        return self.down(h)


class RefNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(IN, HIDDEN)
        self.down = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Batches:
    """The same batches on every rank: a plain iterable of ``(x, y)``, which the Trainer does not split over ranks
    (a tensor-parallel group must see the same rows; how data parallel splits the data is not what these tests
    are about)."""

    def __init__(self, n=6, rows=8):
        g = torch.Generator().manual_seed(7)
        self.items = [(torch.randn(rows, IN, generator=g), torch.randint(0, OUT, (rows,), generator=g))
                      for _ in range(n)]

    def __iter__(self):
        return iter(self.items)


def batches(n=6, rows=8):
    return Batches(n, rows)


def degrees(dp=1, mp=1, pp=1, sharding=1) -> dict:
    return {"dp_degree": dp, "mp_degree": mp, "pp_degree": pp, "sharding_degree": sharding}


def tp_trainer(mp=2, dp=1, lr=0.05, dropout=False, sharding=1):
    """A Trainer over ``TPNet`` (mp > 1) or ``RefNet`` (mp = 1), seeded alike: the same full initial weights;
    ``dropout``: ``TPDropNet``, the tracker seeded afresh; ``sharding``: stage 1 over that many ranks."""
    init_fleet(degrees(dp=dp, mp=mp, sharding=sharding))
    if dropout:
        model_parallel_random_seed(5)
    torch.manual_seed(0)
    net = TPDropNet() if dropout else TPNet() if mp > 1 else RefNet()
    return fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=lr), nn.CrossEntropyLoss())


class Shared(nn.Module):
    """The first layer, whose weight the last layer reuses (a tied head)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(IN, IN)

    @property
    def weight(self):
        return self.proj.weight

    def forward(self, x):
        return torch.tanh(self.proj(x))


def _head(shared, x):
    return x @ shared.weight.t()


def pipe_descs():
    return [SharedLayerDesc("tied", Shared, shared_weight_attr="weight"), LayerDesc(nn.Linear, IN, HIDDEN), nn.Tanh(),
            LayerDesc(nn.Linear, HIDDEN, IN), SharedLayerDesc("tied", Shared, forward_func=_head,
                                                              shared_weight_attr="weight")]


PIPE = {"accumulate_steps": 2, "micro_batch_size": 4}


def pipe_layer(loss, topology=None, num_stages=None):
    torch.manual_seed(0)  # the stages' layers draw in order from one seed: load a common start instead
    return PipelineLayer(pipe_descs(), num_stages=num_stages, topology=topology, loss_fn=loss)


def pipe_batch(step, rows=8):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(rows, IN, generator=g), torch.randint(0, IN, (rows,), generator=g)


def start_weights():
    """The single-process pipeline's initial weights (every stage loads its entries of them)."""
    torch.manual_seed(1)
    return PipelineLayer(pipe_descs(), num_stages=1).state_dict()


def pp_trainer(dp=1, pp=2):
    hcg = init_fleet(degrees(dp=dp, pp=pp), PIPE)
    loss = nn.CrossEntropyLoss()  # the PipelineLayer's loss_fn is the Trainer's loss (one object)
    layer = pipe_layer(loss, topology=hcg.topology())
    layer.load_state_dict({k: v for k, v in start_weights().items() if k in layer.state_dict()})
    return fleetlite.Trainer(layer, torch.optim.AdamW(layer.parameters(), lr=0.05), loss)


def pp_steps(trainer, start, stop):
    trainer.setup(training=True)
    for step in range(start, stop):
        trainer.parallel_network.train_batch(list(pipe_batch(step)), trainer.optimizer)


class OneStage(nn.Module):
    """The one-stage PipelineLayer's layers under the same names, as a plain module (``fleet.distributed_model``
    takes a PipelineLayer only with pp_degree > 1)."""

    def __init__(self):
        super().__init__()
        layer = PipelineLayer(pipe_descs(), num_stages=1)
        for name, child in layer.named_children():
            self.add_module(name, child)
        self._run = [layer]  # not registered: its parameters are the ones above

    def forward(self, x):
        return self._run[0](x)


def single_pipe_trainer():
    """pp = 1 in one process: the one-stage PipelineLayer of the same descs (its state's keys)."""
    net = OneStage()
    return fleetlite.Trainer(net, torch.optim.AdamW(net.parameters(), lr=0.05), nn.CrossEntropyLoss())


def opt_state(trainer):
    """This rank's optimizer state, by parameter name (the slices' and this stage's)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    opt = getattr(trainer.optimizer, "inner_opt", trainer.optimizer)
    return {k: {n: v.clone() for n, v in e.items()}
            for k, e in get_optimizer_state_dict(trainer.network, opt)["state"].items()}


def mp_pp_descs(tp=True):
    """Tensor-parallel blocks inside pipeline stages (mp x pp); ``tp=False``: the single-process layers."""
    return [LayerDesc(ResBlock, IN, HIDDEN, torch.relu, tp), LayerDesc(nn.LayerNorm, IN),
            LayerDesc(ResBlock, IN, HIDDEN, torch.relu, tp),
            LayerDesc(ColumnParallelLinear, IN, OUT, has_bias=False, gather_output=True) if tp else
            LayerDesc(nn.Linear, IN, OUT, bias=False)]
