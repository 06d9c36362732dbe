"""Workers started by a cluster manager (SLURM, Open MPI, MPICH, a Kubeflow PyTorchJob) join the job with no launcher.

The references are the managers' own meanings (SLURM's srun/sbatch manuals, Open MPI's and MPICH's rank
variables) and Lightning's SLURMEnvironment / KubeflowEnvironment (the SLURM port formula, local rank 0 of 1
per pod); the multi-process tests start two plain `python` processes with only the manager's variables and
check the all-reduce against the sum computed here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fleetlite.distributed import cluster
from fleetlite.distributed.env import DistEnvError, read_env
from fleetlite.testing import free_port, timeout_scale

# every variable through which some launcher or manager places a process: removed before each manager's are set
_PLACING = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "MPI_LOCAL", "PADDLE_", "TORCHELASTIC_", "KUBERNETES_", "FLAGS_selected",
             "FLEETLITE_CLUSTER_ENV")

WORKER = textwrap.dedent("""
    import json, logging, os, sys
    import torch
    import fleetlite.distributed as dist

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    dist.init_parallel_env(timeout=60)
    pe = dist.ParallelEnv()
    t = torch.tensor([10.0 ** dist.get_rank()])
    dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
                   "local": [pe.local_rank, dist.env.read_env().local_world_size],
                   "source": dist.env.read_env().source, "backend": torch.distributed.get_backend()}, f)
    dist.destroy_process_group()
""")


def _base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PLACING and not k.startswith(_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    root = str(Path(cluster.__file__).resolve().parents[2])  # this checkout's fleetlite
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _run_two(tmp_path, per_rank: list[dict[str, str]]) -> tuple[list[dict], list[str]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), str(out)], env={**_base_env(), **extra},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for extra in per_rank]
    logs = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=120 * timeout_scale())
            logs.append(err)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(len(per_rank))], logs


def _slurm_port_and_job() -> tuple[int, str]:
    """A free port that SLURM's rule (15000 + the job id's last 4 digits) gives, and that job id."""
    for offset in range(1000, 10000, 97):
        port = 15000 + (os.getpid() + offset) % 10000
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port, f"77{port - 15000:04d}"
    pytest.skip("no free port in 15000..24999")


@pytest.mark.timeout(300)
def test_two_srun_tasks_form_one_world_from_slurms_variables(tmp_path):
    port, job = _slurm_port_and_job()
    # what `srun -N1 -n2 python worker.py` gives each task (one node: the list is that node)
    common = {"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": job,
              "SLURM_JOB_NAME": "train", "SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0"}
    records, logs = _run_two(tmp_path, [{**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)}
                                        for r in range(2)])
    for rank, r in enumerate(records):
        assert (r["rank"], r["world"], r["sum"], r["local"], r["source"]) == (rank, 2, 11.0, [rank, 2], "slurm")
        assert r["backend"] == "gloo"
    # the one line saying which environment was found; the port is Lightning's rule on the job id
    assert f"rank 1 of 2 (local rank 1 of 2), master localhost:{port}, from slurm" in logs[1]


@pytest.mark.timeout(300)
def test_two_mpirun_ranks_form_one_world_from_open_mpis_variables(tmp_path):
    port = free_port()
    common = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "MASTER_PORT": str(port),
              # mpirun inside a SLURM allocation: the batch script's variables must not win over MPI's
              "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "job"}
    records, _ = _run_two(tmp_path, [{**common, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_RANK": str(r)}
                                     for r in range(2)])
    for rank, r in enumerate(records):
        assert (r["rank"], r["world"], r["sum"], r["local"], r["source"]) == (rank, 2, 11.0, [rank, 2], "openmpi")


@pytest.mark.timeout(300)
def test_two_pytorchjob_pods_form_one_world_each_local_rank_0_of_1(tmp_path):
    port = free_port()
    # the Kubeflow training operator's variables (one process per pod); no LOCAL_RANK, no LOCAL_WORLD_SIZE
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
              "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_PORT": "tcp://10.96.0.1:443"}
    records, _ = _run_two(tmp_path, [{**common, "RANK": str(r)} for r in range(2)])
    for rank, r in enumerate(records):
        assert (r["rank"], r["world"], r["sum"], r["local"], r["source"]) == (rank, 2, 11.0, [0, 1], "kubeflow")


# ---- the variables alone ------------------------------------------------------------------------------------------

def test_slurm_variables_of_the_issue_give_rank_1_of_2_on_the_first_listed_node():
    e = read_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODELIST": "node[0-1]", "SLURM_NNODES": "2",
                  "SLURM_LOCALID": "0", "SLURM_JOB_ID": "4312345"})
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size) == (1, 2, 0, 1)
    assert (e.master_addr, e.master_port, e.source) == ("node0", 15000 + 2345, "slurm")
    assert e.trainer_endpoints == ()  # other nodes' endpoints are not made up
    # MASTER_ADDR / MASTER_PORT win over the node list and the job id
    e = read_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "node[0-1]", "SLURM_NNODES": "2",
                  "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29555"})
    assert (e.master_addr, e.master_port) == ("10.0.0.9", 29555)


def test_slurm_host_lists_expand_as_slurm_writes_them():
    # scontrol show hostnames semantics: zero padding kept, ranges and single numbers, several lists
    assert cluster.expand_hostlist("node[0-1]") == ["node0", "node1"]
    assert cluster.expand_hostlist("gpu[008-010,013],cpu5") == ["gpu008", "gpu009", "gpu010", "gpu013", "cpu5"]
    assert cluster.expand_hostlist("rack[1-2]-n[1,3]") == ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]
    assert cluster.expand_hostlist("single") == ["single"]
    with pytest.raises(cluster.ClusterEnvError, match="not N or N-M"):
        cluster.expand_hostlist("node[a-b]")


def test_an_interactive_slurm_shell_and_the_opt_out_are_not_a_job():
    shell = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_NODELIST": "n[1-4]"}
    assert read_env({**shell, "SLURM_JOB_NAME": "interactive"}).source == "none"
    assert read_env({**shell, "SLURM_JOB_NAME": "bash"}).world_size == 1
    assert read_env({**shell, "SLURM_JOB_NAME": "x", "FLEETLITE_CLUSTER_ENV": "none"}).source == "none"
    with pytest.raises(DistEnvError, match="FLEETLITE_CLUSTER_ENV='lsf' is not one of"):
        read_env({**shell, "FLEETLITE_CLUSTER_ENV": "lsf"})


def test_launchers_win_over_the_manager_that_started_them():
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "n[1-2]", "SLURM_NNODES": "2"}
    torchrun = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n1",
                "MASTER_PORT": "29400"}
    assert read_env({**slurm, **torchrun}).rank == 5  # `srun fleetlite launch`: the launcher's workers
    paddle = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ENDPOINTS": "a:1,b:2"}
    assert read_env({**slurm, **paddle}).source == "paddle"


def test_mpich_and_intel_mpi_need_a_master_address_on_several_nodes():
    e = read_env({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
                  "MASTER_ADDR": "h0", "MASTER_PORT": "29500"})
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.source) == (3, 4, 1, 2, "mpich")
    with pytest.raises(DistEnvError, match=r"PMI_SIZE=4 \(mpich\) but MASTER_ADDR and MASTER_PORT is not set.*mpirun"):
        read_env({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    with pytest.raises(DistEnvError, match="OMPI_COMM_WORLD_RANK=2 is outside 0..1"):
        read_env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_PORT": "1"})
    with pytest.raises(DistEnvError, match="SLURM_NTASKS='x' is not an integer"):
        read_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "x"})


def test_a_pytorchjob_pod_is_local_rank_0_of_1_and_invents_no_endpoints():
    pod = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
           "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    e = read_env(pod)
    assert (e.rank, e.local_rank, e.local_world_size, e.source) == (1, 0, 1, "kubeflow")
    assert e.trainer_endpoints == () and e.current_endpoint == ""
    # torchrun inside the pod sets the local variables itself: those are used
    e = read_env({**pod, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (e.local_rank, e.local_world_size, e.source) == (1, 2, "torchrun")


def test_docstring_examples_run():
    import doctest

    assert doctest.testmod(cluster).failed == 0


def test_a_nodes_task_count_comes_from_slurms_layout_at_its_node_index():
    # srun -n 7 on 4 nodes: SLURM_TASKS_PER_NODE=2(x3),1; the 4th node (SLURM_NODEID=3) runs 1 task
    task = {"SLURM_NTASKS": "7", "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert read_env({**task, "SLURM_PROCID": "6", "SLURM_NODEID": "3", "SLURM_LOCALID": "0"}).local_world_size == 1
    assert read_env({**task, "SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_LOCALID": "1"}).local_world_size == 2
    assert cluster.tasks_per_node("4(x2)") == [4, 4] and cluster.tasks_per_node("3") == [3]
