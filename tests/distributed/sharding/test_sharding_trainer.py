"""The Trainer under sharding stages 2/3: checkpoints of a stage-3 run resume bit-identically at the same world
size and stage, and on one process with every remaining sample seen once."""

import pytest
import torch
from parity import max_abs_diff
from sharding_helpers import IndexedDataset, StopAt
from torch import nn

import fleetlite
from fleetlite.testing import run_ranks
from fleetlite.trainer import callbacks as C

STAGE3 = {"sharding": True, "sharding_configs": {"stage": 3}}
STAGE1 = {"sharding": True, "sharding_configs": {"stage": 1}}


class Recording(fleetlite.Trainer):
    def train_step(self, batch):
        x, y, idx = batch
        self.__dict__.setdefault("seen", []).extend(idx.tolist())
        return super().train_step((x, y))


def _fit(ckpt, stop=None, resume=None, strategy=STAGE3, epochs=2, async_save=False):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    t = Recording(net, torch.optim.AdamW(net.parameters(), lr=0.02), nn.CrossEntropyLoss(), strategy=strategy,
                  device="cpu")
    t.seen = []
    kw = {"async_save": True} if async_save else {}
    cbs = [C.ModelCheckpoint(ckpt, save_freq=None, save_steps=1, keep_last=2, **kw)]
    cbs += [StopAt(stop)] if stop else []
    t.fit(IndexedDataset(40), epochs=epochs, batch_size=4, callbacks=cbs, resume=resume, verbose=0)

    return t.seen, t.global_step, t.checkpoint_connector.model_state(rank0_only=False)


def _same_world(rank, world, root, strategy, async_save):
    torch.set_num_threads(1)
    _, _, straight = _fit(f"{root}/straight", strategy=strategy, async_save=async_save)
    _fit(f"{root}/b", stop=3, strategy=strategy, async_save=async_save)
    _, steps, resumed = _fit(f"{root}/b", resume="latest", strategy=strategy, async_save=async_save)
    import fleetlite.checkpoint as ckpt

    newest = ckpt.find_newest(f"{root}/b", kind="dir").name
    return all(torch.equal(straight[k], resumed[k]) for k in straight), steps, newest


@pytest.mark.timeout(200)
@pytest.mark.parametrize("strategy, async_save", [(STAGE3, False), (STAGE3, True), (None, True), (STAGE1, True)],
                         ids=["stage3", "stage3-async", "dp-async", "stage1-async"])
def test_resume_is_bit_identical_at_the_same_world_and_stage(tmp_path, strategy, async_save):
    for same, steps, latest in run_ranks(_same_world, args=(str(tmp_path), strategy, async_save), timeout=190):
        assert same and steps == 10 and latest == "step-00000010"  # sharded (DCP) checkpoint directories


def _preempted(rank, world, root):
    import os
    import signal

    torch.set_num_threads(1)

    class Kill(C.Callback):
        def on_train_batch_end(self, step, logs=None):
            if self.trainer.global_step == 3 and rank == 0:
                os.kill(os.getpid(), signal.SIGTERM)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    t = Recording(net, torch.optim.AdamW(net.parameters(), lr=0.02), nn.CrossEntropyLoss(), strategy=STAGE3,
                  device="cpu")
    cbs = [C.ModelCheckpoint(root, save_freq=None, save_steps=1, async_save=True),
           C.Preemption(check_interval_s=0, verbose=0), Kill()]
    t.fit(IndexedDataset(40), epochs=5, batch_size=4, callbacks=cbs, verbose=0)
    import fleetlite.checkpoint as ckpt

    latest = ckpt.find_newest(root, kind="dir")  # right after fit returns: where a job exits 143
    return t.preempted, t.global_step, latest.name, ckpt.validate(latest)["global_step"]


@pytest.mark.timeout(120)
def test_async_save_under_preemption_is_committed_when_fit_returns(tmp_path):
    for preempted, step, latest, saved_step in run_ranks(_preempted, args=(str(tmp_path / "ck"),), timeout=110):
        assert preempted is not None
        assert latest == f"step-{step:08d}" and saved_step == step


def _part(rank, world, ckpt):
    torch.set_num_threads(1)
    seen, steps, _ = _fit(ckpt, stop=2)
    return seen


@pytest.mark.timeout(200)
def test_stage3_checkpoint_of_two_ranks_resumes_on_one_process_seeing_each_sample_once(tmp_path, clean_dist_env):
    ckpt = str(tmp_path / "ck")
    before = [i for seen in run_ranks(_part, args=(ckpt,), timeout=120) for i in seen]
    assert len(set(before)) == 16
    with pytest.warns(UserWarning):
        after, steps, weights = _fit(ckpt, resume="latest")
    assert sorted(before + after[:24]) == list(range(40))
    assert sorted(after[24:]) == list(range(40)) and steps == 2 + 6 + 10
    assert all(torch.isfinite(v).all() for v in weights.values())


def _net():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


@pytest.mark.timeout(200)
def test_sharded_checkpoint_loads_offline_and_torn_directories_are_never_resumed(tmp_path, clean_dist_env):
    import os
    import shutil

    import fleetlite.checkpoint as ckpt
    from fleetlite.checkpoint import CheckpointError

    root = tmp_path / "ck"
    finals = run_ranks(_part_weights, args=(str(root),), timeout=150)
    latest = ckpt.find_newest(root, kind="dir")
    assert latest is not None and latest.name == "step-00000004" and (latest / ".metadata").is_file()
    plain = _net()
    offline = ckpt.load_full(root, model=plain)  # no process group: full weights into a plain module
    assert all(torch.equal(offline[k], finals[0][k]) for k in finals[0])
    with pytest.raises(CheckpointError, match="does not fit Linear"):
        ckpt.load_full(latest, model=nn.Linear(2, 2))
    # a newer directory that lost a rank's shard, pointed at by `latest`, and a save that died mid-way
    torn = root / "step-00000005"
    shutil.copytree(latest, torn)
    shard = sorted(torn.glob("*.distcp"))[-1]
    shard.unlink()
    (root / "latest").write_text(torn.name)
    shutil.copytree(latest, root / ".step-00000006.tmp-0123abcd")
    with pytest.raises(CheckpointError, match=rf"missing shard file\(s\) \['{shard.name}'\]"):
        ckpt.validate(torn)
    with pytest.warns(UserWarning, match="skipped invalid sharded checkpoint"):
        assert ckpt.find_newest(root, kind="dir") == latest
    with pytest.warns(UserWarning):
        seen, steps, _ = _fit(str(root), resume="auto", epochs=1)
    assert steps == 6 and len(seen) == 8  # resumed from step 4: 4 steps x 2 ranks x 4 samples done, 8 left
    assert not any(p.name.startswith(".step") for p in root.iterdir())  # the dead save's directory was removed
    assert os.path.isdir(root / "step-00000004")


def _part_weights(rank, world, ckpt):
    torch.set_num_threads(1)
    _, _, weights = _fit(ckpt, stop=4)
    return weights


def _evaluate(rank, world, strategy):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    t = fleetlite.Trainer(_net(), torch.optim.AdamW(_net().parameters(), lr=0.02), nn.CrossEntropyLoss(),
                          metrics=fleetlite.metric.Accuracy(), strategy=strategy, device="cpu")
    data = torch.utils.data.TensorDataset(IndexedDataset(9).x, IndexedDataset(9).y)  # 9: a rank gets a padded batch
    logs = t.evaluate(data, batch_size=4, verbose=0)
    preds = t.predict(data, batch_size=4, stack_outputs=True)
    return logs, preds


@pytest.mark.timeout(120)
def test_exact_evaluation_and_predict_under_stage3_match_one_process(clean_dist_env):
    ref_logs, ref_preds = _evaluate(0, 1, None)
    for logs, preds in run_ranks(_evaluate, args=(STAGE3,), timeout=100):
        assert logs["acc"] == ref_logs["acc"] and logs["loss"] == pytest.approx(ref_logs["loss"], rel=1e-6)
        assert torch.allclose(preds, ref_preds, atol=1e-6) and len(preds) == 9


def _other_stage(rank, world, root, first, then):
    torch.set_num_threads(1)
    _, _, straight = _fit(f"{root}/straight", strategy=first)
    _fit(f"{root}/b", stop=3, strategy=first, async_save=True)  # a DCP directory at any stage
    _, steps, resumed = _fit(f"{root}/b", resume="latest", strategy=then)
    return max_abs_diff(straight, resumed), steps


@pytest.mark.timeout(300)
@pytest.mark.parametrize("first, then", [(STAGE3, {"sharding": True, "sharding_configs": {"stage": 2}}),
                                         (STAGE1, None), (None, STAGE1), (STAGE1, STAGE3)],
                         ids=["stage3-to-2", "stage1-to-dp", "dp-to-stage1", "stage1-to-3"])
def test_checkpoint_resumes_at_another_stage(tmp_path, first, then):
    for diff, steps in run_ranks(_other_stage, args=(str(tmp_path), first, then), timeout=190):
        assert steps == 10 and diff <= 1e-6  # DCP reshards the optimizer state to the other layout


def test_foreign_model_checkpoint_is_a_clear_error(tmp_path, clean_dist_env):
    import fleetlite.checkpoint as ckpt
    from fleetlite.checkpoint import CheckpointError

    with pytest.warns(UserWarning):  # one process: not sharded, but async_save writes a DCP directory
        _fit(str(tmp_path), stop=1, strategy=None, async_save=True)
    other = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))
    with pytest.raises(CheckpointError, match=r"another model: missing \[\], unexpected \['4.bias', '4.weight'\], "
                                              r"different shapes \['2.bias', '2.weight'\]"):
        ckpt.load({"model": other.state_dict()}, ckpt.find_newest(tmp_path, kind="dir"))


def _data48_fit(ckpt, stop=None, resume=None, strategy=STAGE3):
    torch.manual_seed(0)
    net = _net()
    t = Recording(net, torch.optim.AdamW(net.parameters(), lr=0.02), nn.CrossEntropyLoss(), strategy=strategy,
                  device="cpu")
    t.seen = []
    cbs = [C.ModelCheckpoint(ckpt, save_freq=None, save_steps=1, keep_last=2)] + ([StopAt(stop)] if stop else [])
    t.fit(IndexedDataset(48), epochs=2, batch_size=4, callbacks=cbs, resume=resume, verbose=0)
    return t.seen, t.global_step


def _four_then_two(rank, world, ckpt, stage):
    torch.set_num_threads(1)
    if world == 4:
        return _data48_fit(ckpt, stop=2)  # 2 steps x 4 ranks x 4 samples of the epoch's 48
    return _data48_fit(ckpt, resume="latest", strategy={"sharding": True, "sharding_configs": {"stage": stage}})


@pytest.mark.timeout(300)
def test_stage3_checkpoint_of_four_ranks_resumes_on_two_ranks_at_stage2_seeing_each_sample_once(tmp_path):
    ckpt = str(tmp_path / "ck")
    first = run_ranks(_four_then_two, world_size=4, args=(ckpt, 3), timeout=150)
    before = [i for seen, _ in first for i in seen]
    assert len(before) == 32 and len(set(before)) == 32 and all(steps == 2 for _, steps in first)
    import fleetlite.checkpoint as dcp_ckpt

    meta = dcp_ckpt.validate(dcp_ckpt.find_newest(ckpt, kind="dir"))
    assert (meta["world_size"], meta["stage"], meta["global_step"]) == (4, 3, 2)
    second = run_ranks(_four_then_two, args=(ckpt, 2), timeout=150)
    rest = [i for seen, _ in second for i in seen[:8]]  # the epoch's remaining 16 samples: 2 steps x 2 ranks x 4
    assert sorted(before + rest) == list(range(48))
    assert sorted(i for seen, _ in second for i in seen[8:]) == list(range(48))  # the next epoch, once each
    assert all(steps == 2 + 2 + 6 for _, steps in second)
