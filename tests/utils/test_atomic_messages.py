"""Artifacts get the usual file mode, and an unwritable place is explained."""

import os

import pytest
import torch

from fleetlite.trainer.export import export_model


def test_safetensors_export_has_the_mode_of_every_other_artifact(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open(..., "w") gives under this umask (0644 usually)
    out = export_model(torch.nn.Linear(2, 2), tmp_path / "net.safetensors", config={"a": 1})
    assert oct(out.stat().st_mode & 0o777) == oct(plain.stat().st_mode & 0o777)
    assert oct((tmp_path / "net.json").stat().st_mode & 0o777) == oct(plain.stat().st_mode & 0o777)


def test_a_deleted_working_directory_is_named_not_no_such_file(tmp_path):
    # in this process (a fresh one only imported torch again): the working directory is put back at once
    from fleetlite.checkpoint import CheckpointError, probe_writable

    gone = tmp_path / "gone"
    gone.mkdir()
    here = os.getcwd()
    os.chdir(gone)
    os.rmdir(gone)
    try:
        with pytest.raises(CheckpointError) as e:
            probe_writable("runs/a")
    finally:
        os.chdir(here)
    assert "working directory no longer exists" in str(e.value)
