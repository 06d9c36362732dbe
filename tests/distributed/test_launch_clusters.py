"""`fleetlite launch` on clusters: Paddle's launcher flags, a SLURM job's nodes, rendezvous failures in one line.

References: Paddle's `paddle.distributed.launch` flags (python/paddle/distributed/launch/context/args_envs.py:
--ips lists the nodes and this node's rank is its index, --master is the rendezvous server, --rank the node's rank,
-1 meaning assigned on joining, --log_dir holds workerlog.N, --start_port defaults to 6070) and torchrun's options.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fleetlite.distributed.launch import resolve_argv
from fleetlite.distributed.launch_flags import paddle_options, slurm_options
from fleetlite.testing import free_port, run_launch, timeout_scale

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    import fleetlite.distributed as dist

    torch.set_num_threads(1)
    dist.init_parallel_env()
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"worker {dist.get_rank()} says hello", flush=True)
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
                   "node_rank": os.environ.get("GROUP_RANK")}, f)
    dist.destroy_process_group()
""")
_NO_CLUSTER = {k: "" for k in ("SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "PMI_RANK")}


def _script(tmp_path):
    (tmp_path / "w.py").write_text(WORKER)
    (tmp_path / "out").mkdir(exist_ok=True)
    return str(tmp_path / "w.py"), str(tmp_path / "out")


def _records(out, world):
    return [json.loads(open(os.path.join(out, f"rank{r}.json")).read()) for r in range(world)]


def _tv(option: str) -> bool:
    return option not in ("--standalone",)


# ---- Paddle's flags -----------------------------------------------------------------------------------------------

def test_paddle_master_and_rank_become_torchruns_rendezvous():
    # a node rank given: static rendezvous at the master; none (Paddle's -1): c10d assigns ranks on joining
    assert paddle_options(["--master", "10.0.0.1:29555", "--rank", "1", "--nnodes", "2"], _tv)[0] == [
        "--nnodes", "2", "--master_addr", "10.0.0.1", "--master_port", "29555", "--node_rank", "1"]
    assert paddle_options(["--master=10.0.0.1:29555", "--nnodes=2"], _tv)[0] == [
        "--nnodes=2", "--rdzv_backend", "c10d", "--rdzv_endpoint", "10.0.0.1:29555"]
    assert paddle_options(["--master", "10.0.0.1:29555", "--rank", "-1"], _tv)[0][-2:] == [
        "--rdzv_endpoint", "10.0.0.1:29555"]
    assert paddle_options(["--rank", "2", "--nnodes", "3"], _tv)[0] == ["--nnodes", "3", "--node_rank", "2"]
    with pytest.raises(SystemExit, match="--master 'node0' is not HOST:PORT"):
        paddle_options(["--master", "node0"], _tv)
    with pytest.raises(SystemExit, match="--master says where the nodes meet, and so does --rdzv_endpoint"):
        paddle_options(["--master", "a:1", "--rdzv_endpoint", "b:2"], _tv)


def test_paddle_ips_find_this_nodes_rank_from_its_own_address():
    two = "10.0.0.1,10.0.0.2"
    out, _ = paddle_options(["--ips", two, "--nproc_per_node", "4"], _tv, local_addresses=lambda: {"10.0.0.2"})
    assert out == ["--nproc_per_node", "4", "--nnodes", "2", "--master_addr", "10.0.0.1", "--master_port", "6070",
                   "--node_rank", "1"]
    out, _ = paddle_options(["--ips", two, "--start_port", "7000"], _tv, local_addresses=lambda: {"10.0.0.1"})
    assert out[-4:] == ["--master_port", "7000", "--node_rank", "0"]
    # --host names this node, --rank overrides the lookup
    assert paddle_options(["--ips", two, "--host", "10.0.0.2"], _tv, lambda: set())[0][-1] == "1"
    assert paddle_options(["--ips", two, "--rank", "0"], _tv, lambda: {"10.0.0.2"})[0][-1] == "0"
    with pytest.raises(SystemExit, match=r"none of these addresses is this node's \(192.168.1.5\); pass --host"):
        paddle_options(["--ips", two], _tv, local_addresses=lambda: {"192.168.1.5"})
    with pytest.raises(SystemExit, match="--nnodes 3 but --ips lists 2 node"):
        paddle_options(["--ips", two, "--nnodes", "3"], _tv, lambda: {"10.0.0.1"})
    # one address, no port asked for: this node alone, on a free port
    assert paddle_options(["--ips", "127.0.0.1"], _tv)[0] == ["--standalone"]


def test_paddle_device_and_log_options_reach_torchrun():
    env = {}
    argv = resolve_argv(["--devices", "0,1", "--log_dir", "logs", "t.py", "--log_dir", "mine"], env)
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert argv == ["--nproc_per_node", "2", "--log_dir", "logs", "--tee", "3", "--local_ranks_filter", "0",
                    "t.py", "--log_dir", "mine"]  # the script's own --log_dir is left alone


@pytest.mark.timeout(240)
def test_launch_with_paddles_ips_runs_two_workers_and_writes_workerlogs(tmp_path):
    script, out = _script(tmp_path)
    logs = tmp_path / "log"
    res = run_launch(["--ips", "127.0.0.1", "--nproc_per_node", "2", "--log_dir", str(logs), script, out],
                     timeout=200, env=_NO_CLUSTER)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank, r in enumerate(_records(out, 2)):
        assert (r["rank"], r["world"], r["sum"]) == (rank, 2, 3.0)
    for n in (0, 1):  # Paddle's file names, each with that worker's output
        assert f"worker {n} says hello" in (logs / f"workerlog.{n}").read_text()
    assert "worker 0 says hello" in res.stdout and "worker 1 says hello" not in res.stdout  # rank 0 on the console


# ---- SLURM --------------------------------------------------------------------------------------------------------

def test_a_launch_per_node_under_srun_takes_the_nodes_from_slurm():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "31337", "SLURM_JOB_NAME": "train",
           "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2"}  # srun's step variables
    out, note = slurm_options(["--nproc_per_node", "8"], env)
    # the master is the node list's first host; the port Lightning's rule on the job id (15000 + last 4 digits)
    assert out == ["--nproc_per_node", "8", "--nnodes", "2", "--node_rank", "1", "--master_addr", "gpu07",
                   "--master_port", "16337"]
    assert note == "SLURM job 31337: node 1 of 2, master gpu07:16337"
    assert slurm_options(["--nnodes", "4"], env) == (["--nnodes", "4"], None)  # the user's options win
    assert slurm_options([], {**env, "SLURM_JOB_NAME": "interactive"}) == ([], None)
    assert slurm_options([], {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "1"}) == ([], None)
    # srun with several tasks per node: each launch would start its own workers; this node only, and it says why
    _, note = slurm_options([], {**env, "SLURM_STEP_NUM_TASKS": "8"})
    assert note.endswith("srun --ntasks-per-node=1 fleetlite launch ...")
    # the batch script itself (no srun step): it runs on the first node only, so it must not wait for the others
    batch = {k: v for k, v in env.items() if not k.startswith("SLURM_STEP_")}
    out, note = slurm_options([], batch)
    assert out == [] and "not started by srun" in note


@pytest.mark.timeout(300)
def test_two_srun_launches_on_two_nodes_form_one_world(tmp_path):
    script, out = _script(tmp_path)
    port = free_port()
    base = {**_NO_CLUSTER, "SLURM_NTASKS": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "127.0.0.1",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
            "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "MASTER_PORT": str(port)}

    def node(r):
        return run_launch(["--nproc_per_node", "1", script, out], timeout=250,
                          env={**base, "SLURM_PROCID": str(r), "SLURM_NODEID": str(r), "SLURM_LOCALID": "0"})

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(node, range(2)))
    for r, res in enumerate(runs):
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"fleetlite launch: SLURM job 4242: node {r} of 2, master 127.0.0.1:{port}" in res.stderr
    for rank, rec in enumerate(_records(out, 2)):
        assert (rec["rank"], rec["world"], rec["sum"], rec["node_rank"]) == (rank, 2, 3.0, str(rank))


# ---- rendezvous failures ------------------------------------------------------------------------------------------

def _one_line(res):
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, res.stderr[-3000:]
    assert lines[0].startswith("fleetlite launch: ") and "Traceback" not in res.stderr
    return lines[0]


@pytest.mark.timeout(240)
def test_a_node_that_never_joins_is_one_line_naming_the_endpoint(tmp_path):
    script, out = _script(tmp_path)
    port = free_port()
    static = run_launch(["--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port", str(port),
                         "--rdzv_conf", "timeout=3", "--nproc_per_node", "1", script, out], timeout=120)
    line = _one_line(static)
    assert f"did not all join the rendezvous at 127.0.0.1:{port}" in line and "--rdzv_conf timeout=" in line
    port = free_port()
    c10d = run_launch(["--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                       "--rdzv_conf", "join_timeout=3", "--nproc_per_node", "1", script, out], timeout=120)
    line = _one_line(c10d)
    assert f"did not all join the rendezvous at 127.0.0.1:{port}" in line and "join_timeout" in line


@pytest.mark.timeout(240)
def test_an_unreachable_master_and_a_port_in_use_are_one_line_each(tmp_path):
    script, out = _script(tmp_path)
    port = free_port()
    gone = run_launch(["--nnodes", "2", "--node_rank", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
                       "--rdzv_conf", "timeout=2", "--nproc_per_node", "1", script, out], timeout=120)
    assert f"cannot reach the master at 127.0.0.1:{port} within 2 s" in _one_line(gone)
    unknown = run_launch(["--master", "no-such-host.invalid:29555", "--rank", "1", "--nnodes", "2", script, out],
                         timeout=120)
    assert "'no-such-host.invalid' does not resolve" in _one_line(unknown)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        res = run_launch(["--nnodes", "2", "--node_rank", "0", "--master_addr", "127.0.0.1", "--master_port",
                          str(taken), "--rdzv_conf", "timeout=3", "--nproc_per_node", "1", script, out], timeout=120)
    assert f"port {taken} at 127.0.0.1:{taken} is in use" in _one_line(res)


def test_docstring_examples_run():
    import doctest

    from fleetlite.distributed import launch_flags, rendezvous

    assert doctest.testmod(launch_flags).failed == 0 and doctest.testmod(rendezvous).failed == 0


# ---- the clusters page: the blocks that can run on one machine --------------------------------------------------

PAGE = Path(__file__).resolve().parents[2] / "docs" / "clusters.md"
_RUN_MARK = "<!-- clusters-test: run -->"


def _page_blocks() -> tuple[str, list[str]]:
    """The page's train.py (its first python block) and its bash blocks marked to run here."""
    text = PAGE.read_text()
    train = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    runs = re.findall(re.escape(_RUN_MARK) + r"\n```bash\n(.*?)```", text, re.S)
    return train, runs


def test_the_page_marks_its_runnable_blocks():
    _, runs = _page_blocks()
    assert len(runs) == 4  # SLURM, Open MPI, a PyTorchJob, two nodes + --ips


@pytest.mark.timeout(400)
@pytest.mark.parametrize("index", range(4))
def test_a_block_of_the_clusters_page_forms_a_world_of_two(tmp_path, index):
    train, runs = _page_blocks()
    (tmp_path / "train.py").write_text(train)
    code = runs[index]
    for fixed in ("29511", "29512", "29513"):  # the page's ports: free ones here (tests run side by side)
        code = code.replace(fixed, str(free_port()))
    port = free_port()
    if "SLURM_JOB_ID=12345" in code:  # the port SLURM's rule gives: pick a job id whose port is free
        port = next(p for p in range(15000 + os.getpid() % 9000, 25000) if _free(p))
        code = code.replace("SLURM_JOB_ID=12345", f"SLURM_JOB_ID=9{port - 15000:04d}")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("SLURM_", "OMPI_", "PMI_", "PADDLE_", "TORCHELASTIC_", "KUBERNETES_"))}
    env.update(OMP_NUM_THREADS="1", PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{env['PATH']}",
               PYTHONPATH=os.pathsep.join(p for p in (str(PAGE.parents[1]), env.get("PYTHONPATH", "")) if p))
    res = subprocess.run(["bash", "-ec", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=350 * timeout_scale())
    assert res.returncode == 0, res.stderr[-3000:]
    lines = re.findall(r"rank \d+ of \d+: sum \d+", res.stdout)  # two processes share the output: not by line
    assert sorted(set(lines)) == ["rank 0 of 2: sum 3", "rank 1 of 2: sum 3"], res.stdout[-2000:]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
