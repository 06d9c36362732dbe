"""Checkpoint files: weights_only round trip, atomic writes under a real crash, refusal of unsafe files,
clear errors for missing/truncated/corrupted files, newest-valid lookup with fallback, RNG states."""

import os
import random
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import torch

from fleetlite.checkpoint import (
    LATEST_FILE,
    CheckpointError,
    capture_rng_state,
    check_plain,
    find_newest,
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    save_checkpoint,
)


def _state(v=1.0):
    return {"model": {"w": torch.full((64, 64), v)}, "progress": {"epoch": 2, "global_step": 17},
            "rng": [capture_rng_state()], "config": {"lr": 0.1, "layers": [1, 2], "name": None}}


def test_roundtrip_is_plain_weights_only(tmp_path):
    p = save_checkpoint(_state(), tmp_path / "a.pt", latest=True)
    raw = torch.load(p, weights_only=True)  # the contract: plain torch.load with weights_only works
    assert raw["format"] == "fleetlite.checkpoint" and raw["progress"]["global_step"] == 17
    s = load_checkpoint(tmp_path / LATEST_FILE)
    assert torch.equal(s["model"]["w"], torch.full((64, 64), 1.0)) and s["config"]["layers"] == [1, 2]
    assert os.path.samefile(tmp_path / LATEST_FILE, p)
    assert set(os.listdir(tmp_path)) == {"a.pt", LATEST_FILE}


def test_non_plain_values_are_refused_before_writing(tmp_path):
    with pytest.raises(TypeError, match=r"state\['cb'\]\['fn'\].*builtins.function"):
        save_checkpoint({"cb": {"fn": lambda: 0}}, tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(TypeError, match="key of type"):
        check_plain({(1, 2): 3})


class _Planted:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_file_needing_arbitrary_unpickling_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    evil = _Planted()
    evil.marker = marker
    path = tmp_path / "evil.pt"
    torch.save({"format": "fleetlite.checkpoint", "version": 1, "model": {}, "x": evil}, path)
    with pytest.raises(CheckpointError, match="refused: loading it needs arbitrary unpickling") as e:
        load_checkpoint(path)
    assert e.value.path == str(path)
    assert not marker.exists()  # the planted callable never ran


def test_missing_truncated_corrupted_and_foreign_files(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "nope.pt")
    good = save_checkpoint(_state(), tmp_path / "good.pt")
    data = good.read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"trunc\.pt.*truncated or corrupted"):
        load_checkpoint(tmp_path / "trunc.pt")
    # flip one byte inside the tensor data: torch would load it silently, the CRC check does not
    with zipfile.ZipFile(good) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("data/0"))
    flipped = bytearray(data)
    flipped[info.header_offset + 200 + 64] ^= 0xFF
    (tmp_path / "flip.pt").write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="CRC"):
        load_checkpoint(tmp_path / "flip.pt")
    torch.save({"w": torch.zeros(2)}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="not a fleetlite checkpoint"):
        load_checkpoint(tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="lacks"):
        load_checkpoint(good, require=("optimizer",))
    newer = dict(_state(), version=99)
    torch.save({"format": "fleetlite.checkpoint", **newer}, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError, match="newer"):
        load_checkpoint(tmp_path / "newer.pt")


_CRASH = """
import os, sys, torch
import fleetlite.checkpoint as ck
real_fsync = os.fsync
def crash(fd):  # the bytes are written but not yet renamed into place: die like a SIGKILL would
    os._exit(17)
os.fsync = crash
ck.save_checkpoint({"model": {"w": torch.full((64, 64), 2.0)}, "progress": {}}, sys.argv[1], latest=True)
"""


@pytest.mark.timeout(60)
def test_crash_during_save_keeps_previous_checkpoint(tmp_path):
    target = tmp_path / "step-00000010.pt"
    save_checkpoint(_state(1.0), target, latest=True)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CRASH), str(target)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 17, proc.stderr
    leftovers = [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert leftovers, "the crashed writer should have left its temporary file behind"
    assert torch.equal(load_checkpoint(target)["model"]["w"], torch.full((64, 64), 1.0))
    assert torch.equal(load_checkpoint(tmp_path / LATEST_FILE)["model"]["w"], torch.full((64, 64), 1.0))
    assert [p.name for p in list_checkpoints(tmp_path)] == [target.name]  # temporary files are ignored


def test_write_failure_reports_and_keeps_previous(tmp_path, monkeypatch):
    target = tmp_path / "c.pt"
    save_checkpoint(_state(1.0), target)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match="No space left.*previous checkpoint, if any, is unchanged"):
        save_checkpoint(_state(3.0), target)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(target)["model"]["w"], torch.full((64, 64), 1.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_latest_lookup_falls_back_to_newest_valid(tmp_path):
    assert find_newest(tmp_path) is None
    a = save_checkpoint(_state(1.0), tmp_path / "step-00000001.pt", latest=True)
    b = save_checkpoint(_state(2.0), tmp_path / "step-00000002.pt", latest=True)
    os.utime(a, (1_000_000, 1_000_000))
    assert find_newest(tmp_path) == tmp_path / LATEST_FILE
    # damage the newest file (latest.pt is a hard link to it): both are skipped with a warning
    b.write_bytes(b.read_bytes()[:100])
    with pytest.warns(UserWarning, match=r"skipped invalid checkpoint.*latest\.pt.*falling back to step-00000001"):
        found = find_newest(tmp_path)
    assert found == a
    a.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="no valid checkpoint"):
        assert find_newest(tmp_path) is None


def test_rng_capture_restore_roundtrip(tmp_path):
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    np.random.randn()  # leaves a cached gaussian in numpy's legacy state
    st = capture_rng_state()
    save_checkpoint({"rng": st}, tmp_path / "r.pt")
    want = (torch.rand(3), random.random(), np.random.randn(2))
    restore_rng_state(load_checkpoint(tmp_path / "r.pt")["rng"])
    got = (torch.rand(3), random.random(), np.random.randn(2))
    assert torch.equal(want[0], got[0]) and want[1] == got[1] and np.array_equal(want[2], got[2])
