"""`fleetlite run gpt` end to end in real processes: one process, dp2 x mp2, pp2 and dp2 x pp2 (tiny model).

Reference: the 1-process run. The GPT's weights are drawn alike on any degrees (Note [gpt init]) and every rank
takes its rows of the same global batch, so dp2 x mp2 and dp2 x pp2 must reproduce the 1-process losses step for
step (1e-4); every run's loss must decrease. A hybrid option for another number of ranks is one line, exit 2.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlite.recipe.catalog import config_names, recipe_names
from fleetlite.testing import timeout_scale

REPO = Path(__file__).resolve().parents[2]
TINY = ["train.steps=4", "model.width=64", "data.num_chars=20000", "train.eval_batches=2"]
STEP = re.compile(r"^step \d+/\d+ loss (\d+\.\d+) \| ", re.M)
FINAL = re.compile(r"^final eval loss: (\d+\.\d+)$", re.M)


def fleetlite_run(args: list[str], tmp_path: Path, nproc: int = 1, timeout: float = 150):
    launcher = ["--nproc_per_node", str(nproc)] if nproc > 1 else []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "fleetlite.cli", "run", *launcher, "gpt", *args,
                           f"run_dir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=timeout * timeout_scale())
    return proc


def losses(proc) -> tuple[list[float], float]:
    assert proc.returncode == 0, (f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                                  f"stderr:\n{proc.stderr[-3000:]}")
    steps = [float(v) for v in STEP.findall(proc.stdout)]
    final = FINAL.search(proc.stdout)
    assert len(steps) == 4 and final, proc.stdout
    assert proc.stdout.rstrip().splitlines()[-1] == final.group(0)  # the last line the recipe prints
    return steps, float(final.group(1))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    steps, final = losses(fleetlite_run(TINY, tmp_path_factory.mktemp("ref")))
    assert steps[-1] < steps[0] - 0.3 and final < steps[0]  # it learns
    return steps, final


def test_gpt_is_a_shipped_recipe_with_its_hybrid_group():
    assert "gpt" in recipe_names()
    names = config_names("gpt")
    assert names[0] == "gpt.yaml"
    assert {f"gpt/hybrid/{o}.yaml" for o in ("none", "dp2_mp2", "pp2", "dp2_pp2", "mp2_pp2", "sep2", "mp2_stage3",
                                             "pp2_vpp2")} <= set(names)
    assert not any(n.startswith("gpt/") for n in config_names("cifar10"))  # a recipe's own groups stay its own
    assert "model/resnet18.yaml" not in names


@pytest.mark.timeout(400)
def test_pp2_on_two_ranks_learns(reference, tmp_path):
    steps, _ = losses(fleetlite_run([*TINY, "hybrid=pp2"], tmp_path, nproc=2, timeout=300))
    assert steps[-1] < steps[0] - 0.3
    assert steps == pytest.approx(reference[0], abs=1e-4)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("nproc, hybrid", [(2, "dp2_mp2"), (1, "pp2")])
def test_degrees_that_do_not_match_the_ranks_are_one_line_exit_2(tmp_path, nproc, hybrid):
    proc = fleetlite_run([*TINY, f"hybrid={hybrid}"], tmp_path, nproc=nproc)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "ranks" in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "run" / ".hydra").exists()  # refused before anything ran


@pytest.mark.timeout(200)
def test_pipeline_micro_batches_must_cover_the_batch(tmp_path):
    proc = fleetlite_run([*TINY, "hybrid=pp2", "train.global_batch_size=12"], tmp_path, nproc=2)
    assert proc.returncode == 2 and "micro_batch_size" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("nproc, hybrid", [(1, "none"), (2, "mp2")])
def test_float16_amp_trains_with_loss_scaling(reference, tmp_path, nproc, hybrid):
    """strategy.amp=true (float16): the loop's backward goes through the DistributedOptimizer, which scales the
    loss; the losses stay within float16 rounding of the float32 one-process run."""
    proc = fleetlite_run([*TINY, f"hybrid={hybrid}", "strategy.amp=true"], tmp_path, nproc=nproc, timeout=300)
    steps, final = losses(proc)
    assert steps == pytest.approx(reference[0], abs=1e-2)
    assert final == pytest.approx(reference[1], abs=1e-2)


def one_process_flops_per_token() -> int:
    """torchtitan's 6N + 12LHQT of the TINY GPT in one process: N its parameters but the position table (no
    matmul; the tied token table is the output head's), 2 layers of 4 heads of 64 / 4 over 32 tokens."""
    from fleetlite.text.gpt import GPT, GPTConfig

    gpt = GPT(GPTConfig(width=64, layers=2, heads=4, seq_len=32))
    n = sum(p.numel() for name, p in gpt.named_parameters() if name != "1.pos")
    return 6 * n + 12 * 2 * 4 * 16 * 32


THROUGHPUT = re.compile(r"^step \d+/\d+ loss \d+\.\d+ \| ([\d,]+) tokens/s, ([\d,]+)/device \| (.*)$", re.M)


@pytest.mark.timeout(300)
def test_the_log_has_tokens_per_second_and_mfu_and_the_run_dir_the_trainers_checkpoint(reference, tmp_path):
    """torchtitan's throughput line: tokens/s (per device: over the world size) and MFU, whose peak a CPU does not
    have (said, not made up); FLOPs per token 6N + 12LHQT of the one-process GPT (N: its matmul weights, the tied
    token table once, the position table not). ``train.save_steps=4`` leaves the Trainer's own checkpoint: its
    progress at step 4, the epoch ended, and the weights of the GPT's names."""
    import torch

    import fleetlite.checkpoint as ckpt
    from fleetlite.text.gpt import GPT, GPTConfig
    from fleetlite.trainer.checkpoint_connector import REQUIRED

    proc = fleetlite_run([*TINY, "train.save_steps=4"], tmp_path)
    steps, final = losses(proc)
    assert steps == pytest.approx(reference[0], abs=1e-4) and final == pytest.approx(reference[1], abs=1e-4)
    lines = THROUGHPUT.findall(proc.stdout)
    assert len(lines) == 4, proc.stdout
    for total, per_device, mfu in lines:
        assert int(total.replace(",", "")) > 0 and total == per_device  # one process: one device
        assert mfu == "MFU n/a: peak FLOPs unknown (cpu)"
    assert f"{one_process_flops_per_token():,} FLOPs per token" in proc.stdout
    saved = tmp_path / "run" / "checkpoints" / "epoch-0000"
    state = ckpt.read(saved, REQUIRED).state
    assert state["progress"]["global_step"] == 4 and state["progress"]["epoch_finished"]
    assert ckpt.resolve("latest", saved.parent) == saved
    weights = ckpt.load_full(saved)
    assert weights.keys() == GPT(GPTConfig(width=64, layers=2, heads=4, seq_len=32)).state_dict().keys()
    assert all(torch.isfinite(v).all() for v in weights.values())
