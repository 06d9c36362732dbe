"""`fleetlite launch`: argv handling (no GPU needed) and real launches, one node and two simulated nodes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetlite.distributed import _bootstrap
from fleetlite.distributed.launch import main, resolve_argv, split_paddle_options
from fleetlite.testing import free_port, run_launch

# A worker that all-reduces its rank and writes what it saw to OUT_DIR/rank<R>.json.
WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import fleetlite.distributed as dist

    torch.set_num_threads(1)
    dist.init_parallel_env()
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    pe = dist.ParallelEnv()
    seen = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(), "argv": sys.argv[2:],
            "backend": torch.distributed.get_backend(), "cuda": torch.cuda.is_available(),
            "main": __name__, "endpoints": pe.trainer_endpoints, "current": pe.current_endpoint,
            "env": {k: v for k, v in os.environ.items() if k.startswith(("PADDLE_", "FLAGS_", "LOCAL_"))}}
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()
""")

FAILING = textwrap.dedent("""
    import torch
    import fleetlite.distributed as dist

    torch.set_num_threads(1)
    dist.init_parallel_env()
    if dist.get_rank() == 1:
        raise RuntimeError("worker one is broken on purpose")
    dist.barrier()  # rank 0 waits for a peer that is gone: the launcher must stop it
""")


def _script(tmp_path, text, name="worker.py"):
    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return str(path), str(out)


def _records(out_dir, world):
    return [json.loads(open(os.path.join(out_dir, f"rank{r}.json")).read()) for r in range(world)]


# ---- argv handling ------------------------------------------------------------------------------------------------

def test_paddle_gpus_option_is_split_from_the_launcher_part_only():
    assert split_paddle_options(["--gpus", "0,1", "train.py", "--gpus", "7"]) == (["train.py", "--gpus", "7"], "0,1")
    assert split_paddle_options(["--selected_gpus=2", "--nnodes", "1", "t.py"]) == (["--nnodes", "1", "t.py"], "2")
    # flags take no value, so the script after them is not mistaken for one (abbreviations included)
    assert split_paddle_options(["--standalone", "t.py", "--gpus", "1"]) == (["--standalone", "t.py", "--gpus", "1"],
                                                                             None)
    assert split_paddle_options(["--stand", "t.py", "--gpus", "1"]) == (["--stand", "t.py", "--gpus", "1"], None)
    assert split_paddle_options(["-m", "--gpus", "3", "pkg.train"]) == (["-m", "pkg.train"], "3")
    for argv in (["--gpus"], ["--gpus", "--nnodes", "1", "t.py"]):
        with pytest.raises(SystemExit, match="--gpus needs a value"):
            split_paddle_options(argv)


def test_paddle_gpus_option_sets_visible_devices_and_process_count():
    env = {}
    assert resolve_argv(["--gpus", "2,3", "t.py", "--lr", "1"], env) == ["--nproc_per_node", "2", "t.py", "--lr", "1"]
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    env = {}  # an explicit process count wins; a --nproc_per_node of the script is not the launcher's
    assert resolve_argv(["--nproc-per-node=1", "--gpus=0,1", "t.py"], env) == ["--nproc-per-node=1", "t.py"]
    assert resolve_argv(["--gpus", "0", "t.py", "--nproc_per_node", "4"], env)[:2] == ["--nproc_per_node", "1"]
    env = {}
    assert resolve_argv(["--nproc_per_node", "2", "t.py"], env) == ["--nproc_per_node", "2", "t.py"] and env == {}
    with pytest.raises(SystemExit, match="comma-separated list of GPU indices"):
        resolve_argv(["--gpus", "gpu0", "t.py"], {})


def test_launch_without_a_usable_script_says_so(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        main(["--nproc_per_node", "2", str(tmp_path / "missing.py")])


def test_bootstrap_exports_paddle_variables_and_overwrites_stale_ones():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
           "MASTER_PORT": "500", "PADDLE_TRAINER_ID": "0", "FLAGS_selected_gpus": "5"}  # stale shell values
    _bootstrap.export_paddle_env(env)
    assert env["PADDLE_TRAINER_ID"] == "1" and env["PADDLE_TRAINERS_NUM"] == "2"
    assert env["PADDLE_TRAINER_ENDPOINTS"] == "h:501,h:502" and env["PADDLE_CURRENT_ENDPOINT"] == "h:502"
    assert env["FLAGS_selected_gpus"] == "1"
    # several nodes without torchelastic's store: endpoints are unknown, stale ones are dropped
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
           "MASTER_PORT": "500", "PADDLE_TRAINER_ENDPOINTS": "a:1", "PADDLE_CURRENT_ENDPOINT": "a:1"}
    _bootstrap.export_paddle_env(env)
    assert env["PADDLE_TRAINER_ID"] == "3" and "PADDLE_TRAINER_ENDPOINTS" not in env
    assert "PADDLE_CURRENT_ENDPOINT" not in env


def _run_bootstrap(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["_bootstrap.py", *argv])
    monkeypatch.setattr(sys, "path", [os.path.dirname(_bootstrap.__file__), *sys.path[1:]])
    _bootstrap.main()


def test_bootstrap_runs_scripts_and_modules_as_python_would(tmp_path, clean_dist_env):
    clean_dist_env.chdir(tmp_path)
    probe = "import json, sys\njson.dump([__name__, sys.argv, sys.path[0]], open(sys.argv[1], 'w'))\n"
    (tmp_path / "probe_script.py").write_text(probe)
    (tmp_path / "probe_mod.py").write_text(probe)
    _run_bootstrap(clean_dist_env, "--script", str(tmp_path / "probe_script.py"), "s.json", "--x", "1")
    assert json.loads((tmp_path / "s.json").read_text()) == [
        "__main__", [str(tmp_path / "probe_script.py"), "s.json", "--x", "1"], str(tmp_path)]
    _run_bootstrap(clean_dist_env, "--module", "probe_mod", "m.json")
    name, argv, path0 = json.loads((tmp_path / "m.json").read_text())
    assert (name, argv[1:], path0) == ("__main__", ["m.json"], str(tmp_path))  # found from the cwd, as -m
    assert os.environ["PADDLE_TRAINER_ID"] == "0" and os.environ["PADDLE_TRAINERS_NUM"] == "1"


def test_bootstrap_records_a_failing_script_for_the_launchers_summary(tmp_path, clean_dist_env):
    error_file = tmp_path / "error.json"
    clean_dist_env.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    (tmp_path / "bad.py").write_text("raise KeyError('no such column')\n")
    with pytest.raises(KeyError):
        _run_bootstrap(clean_dist_env, "--script", str(tmp_path / "bad.py"))
    message = json.loads(error_file.read_text())["message"]
    assert "KeyError" in json.dumps(message) and "no such column" in json.dumps(message)


# ---- real launches ------------------------------------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_console_script_launches_two_workers_with_both_conventions(tmp_path):
    exe = shutil.which("fleetlite", path=os.path.dirname(sys.executable))
    assert exe, "the `fleetlite` console script is missing: install the package (pip install -e .)"
    script, out = _script(tmp_path, WORKER)
    res = run_launch(["--nproc_per_node", "2", script, out, "--lr", "0.1"], timeout=80, launcher=[exe, "launch"])
    assert res.returncode == 0, res.stderr[-3000:]
    for rank, r in enumerate(_records(out, 2)):
        assert (r["rank"], r["world"], r["sum"]) == (rank, 2, 3.0)
        assert r["argv"] == ["--lr", "0.1"] and r["main"] == "__main__"
        # init_parallel_env() picks by itself (Note [per-device backends])
        assert r["backend"] == ("cpu:gloo,cuda:nccl" if r["cuda"] else "gloo")
        env = r["env"]
        assert (env["PADDLE_TRAINER_ID"], env["PADDLE_TRAINERS_NUM"]) == (str(rank), "2")
        assert (env["LOCAL_RANK"], env["FLAGS_selected_gpus"]) == (str(rank), str(rank))
        eps = env["PADDLE_TRAINER_ENDPOINTS"].split(",")
        assert len(set(eps)) == 2 and env["PADDLE_CURRENT_ENDPOINT"] == eps[rank]
        assert r["endpoints"] == eps and r["current"] == eps[rank]  # ParallelEnv agrees with the variables


@pytest.mark.timeout(90)
def test_failing_worker_gives_a_nonzero_exit_naming_the_script_and_error(tmp_path):
    script, _ = _script(tmp_path, FAILING, name="broken.py")
    res = run_launch(["--nproc_per_node", "2", script], timeout=80, env={"FLEETLITE_VERBOSE": "1"},
                     launcher=[sys.executable, "-m", "fleetlite.distributed.launch"])
    assert res.returncode != 0
    assert f"{script} FAILED" in res.stderr
    assert "RuntimeError: worker one is broken on purpose" in res.stderr
    # torchrun's summary lists rank 1's failure; it is not always the "Root Cause": rank 0's barrier now fails
    # at once naming rank 1 (CollectiveError), and torchrun's first observed failure is whichever exits first
    summary = res.stderr.split("Failures:")[-1]
    assert "rank      : 1" in summary, res.stderr[-3000:]


# A plain script (no recipe, no Trainer): rank 1 raises; rank 0 reports what its barrier learnt about rank 1.
PLAIN_RAISES = textwrap.dedent("""
    import os, sys
    import torch
    import fleetlite.distributed as dist

    torch.set_num_threads(1)
    dist.init_parallel_env(timeout=30)
    if dist.get_rank() == 1:
        raise ValueError("plain script breaks on rank 1")
    try:
        dist.barrier()
    except dist.CollectiveError as e:
        with open(os.path.join(sys.argv[1], "survivor.txt"), "w") as f:
            f.write(str(e))
        raise
""")


@pytest.mark.timeout(120)
def test_plain_script_error_reaches_the_survivor_and_the_launch_is_quiet(tmp_path):
    script, out = _script(tmp_path, PLAIN_RAISES, name="plain.py")
    log = tmp_path / "launch.log"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LOGLEVEL", "FLEETLITE_VERBOSE")}
    env["FLEETLITE_LAUNCH_LOG"] = str(log)
    res = subprocess.run([sys.executable, "-m", "fleetlite.cli", "launch", "--nproc_per_node", "2", script, out],
                         capture_output=True, text=True, env=env, timeout=100)
    assert res.returncode == 1
    # the bootstrap told the peers (issue: a swallowed relative import in _tell_peers used to drop it)
    survivor = open(os.path.join(out, "survivor.txt")).read()
    assert "rank 1 raised ValueError: plain script breaks on rank 1" in survivor
    lines = res.stderr.strip().splitlines()
    assert lines and all(ln.startswith("fleetlite launch: a worker failed: rank ") for ln in lines), res.stderr
    assert len(lines) <= 2 and any(ln.startswith("fleetlite launch: a worker failed: rank 1 (") and
                                   "ValueError: plain script breaks on rank 1" in ln for ln in lines)
    assert "OMP_NUM_THREADS" not in res.stderr and "Traceback" not in res.stderr
    report = log.read_text()
    assert "Traceback" in report and "plain script breaks on rank 1" in report and f"{script} FAILED" in report


# A script that calls spawn() itself (the shared dp_basic.py without its --launched flag).
SPAWNS = textwrap.dedent("""
    import sys
    import torch
    import fleetlite.distributed as dist

    def work(out_dir):
        torch.set_num_threads(1)
        dist.init_parallel_env()
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        print(f"spawned rank {dist.get_rank()} sum {t.item():g}", flush=True)

    if __name__ == "__main__":
        dist.spawn(work, args=(sys.argv[1],), nprocs=2)
""")


@pytest.mark.timeout(240)
def test_spawn_inside_launch_works_with_one_process_and_fails_at_once_with_several(tmp_path):
    script, out = _script(tmp_path, SPAWNS, name="spawns.py")
    one = run_launch(["--nproc_per_node", "1", script, out], timeout=150)  # used to hang for the whole timeout
    assert one.returncode == 0, one.stderr[-3000:]
    assert "spawned rank 0 sum 3" in one.stdout and "spawned rank 1 sum 3" in one.stdout
    two = run_launch(["--nproc_per_node", "2", script, out], timeout=80)
    assert two.returncode == 1
    lines = two.stderr.strip().splitlines()
    # one line per failed rank, root cause first; the second rank may raise the same error or be stopped
    # by the launcher (SIGTERM) before it gets there, whichever comes first
    assert 1 <= len(lines) <= 2 and "SpawnError: spawn() was called in rank" in lines[0], two.stderr
    assert all(ln.startswith("fleetlite launch: a worker failed: rank ") for ln in lines), two.stderr


@pytest.mark.parametrize("value", ["0", "abc", "-1", ""])
def test_bad_process_count_is_one_clear_line(value):
    with pytest.raises(SystemExit) as info:
        resolve_argv(["--nproc_per_node", value, "t.py"], environ={})
    assert str(info.value).startswith(f"fleetlite launch: --nproc_per_node {value!r} must be a positive number")
    with pytest.raises(SystemExit, match="must be a positive number"):
        main([f"--nproc_per_node={value}", "t.py"])


def test_process_count_is_checked_against_the_gpu_list():
    env = {}
    with pytest.raises(SystemExit, match=r"--nproc_per_node 3 starts more processes than --gpus 0,1 lists \(2\)"):
        resolve_argv(["--gpus", "0,1", "--nproc_per_node", "3", "t.py"], env)
    assert env == {}  # refused before anything was set
    assert resolve_argv(["--gpus", "0,1", "--nproc_per_node", "1", "t.py"], env) == ["--nproc_per_node", "1", "t.py"]
    assert resolve_argv(["--nproc_per_node", "auto", "t.py"], {}) == ["--nproc_per_node", "auto", "t.py"]


@pytest.mark.timeout(120)
def test_two_nodes_simulated_on_this_machine_form_one_world(tmp_path):
    script, out = _script(tmp_path, WORKER)
    args = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", f"127.0.0.1:{free_port()}", "--rdzv_id", "fleetlite-test", script, out]
    with ThreadPoolExecutor(2) as pool:
        node_runs = list(pool.map(lambda _: run_launch(args, timeout=100), range(2)))
    for res in node_runs:
        assert res.returncode == 0, res.stderr[-3000:]
    records = _records(out, 2)
    eps = records[0]["env"]["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert len(set(eps)) == 2  # gathered from both nodes
    for rank, r in enumerate(records):
        assert (r["rank"], r["world"], r["sum"]) == (rank, 2, 3.0)
        assert (r["env"]["LOCAL_RANK"], r["env"]["LOCAL_WORLD_SIZE"]) == ("0", "1")  # one process per node
        assert r["env"]["PADDLE_TRAINER_ID"] == str(rank) and r["env"]["PADDLE_TRAINERS_NUM"] == "2"
        assert r["env"]["PADDLE_TRAINER_ENDPOINTS"].split(",") == eps
        assert r["env"]["PADDLE_CURRENT_ENDPOINT"] == eps[rank] and r["current"] == eps[rank]


def test_docstring_examples_run():
    import doctest

    from fleetlite.distributed import launch

    result = doctest.testmod(launch)
    assert result.attempted >= 2 and result.failed == 0
