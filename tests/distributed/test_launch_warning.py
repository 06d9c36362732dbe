"""`fleetlite launch` warns when it starts more processes than the node has GPUs (or, without one, CPU cores).

Reference: a user's report, `--nproc_per_node 256` on 2 cores started without a word and thrashed for minutes.
"""

from __future__ import annotations

import pytest

from fleetlite.distributed import launch


def test_the_warning_names_the_processes_the_cores_and_the_fix():
    text = launch.oversubscription_warning(256, cpu_cores=2, gpus=0)
    assert text.startswith("--nproc_per_node 256 starts 256 processes on 2 CPU cores: ")
    assert "use --nproc_per_node 2 or fewer" in text
    gpu = launch.oversubscription_warning(16, cpu_cores=64, gpus=8)
    assert gpu.startswith("--nproc_per_node 16 starts 16 processes on 8 GPU(s)") and "8 or fewer" in gpu
    assert launch.oversubscription_warning(2, cpu_cores=2, gpus=0) is None
    assert launch.oversubscription_warning(8, cpu_cores=2, gpus=8) is None  # a GPU per rank: cores do not matter


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nproc, warned", [(2, True), (1, False)])
def test_launch_warns_before_starting_more_ranks_than_cores(tmp_path, monkeypatch, capsys, nproc, warned):
    script = tmp_path / "noop.py"
    script.write_text("print('ran')\n")
    monkeypatch.setattr(launch, "_cpu_cores", lambda: 1)
    monkeypatch.setattr(launch, "_gpu_count", lambda: 0)
    assert launch.main(["--nproc_per_node", str(nproc), str(script)]) == 0
    err = capsys.readouterr().err
    line = "fleetlite launch: warning: --nproc_per_node 2 starts 2 processes on 1 CPU cores: "
    assert (line in err) is warned, err
