"""Shared test fixtures: a clean launcher environment, load-scaled timeouts (Note [test timeouts]) and the
process-global state restored around every test (Note [test isolation]). Multi-process helpers live in
:mod:`fleetlite.testing`."""

from __future__ import annotations

import os
import random
import signal
import weakref
from pathlib import Path

import pytest

#: Variables through which a launcher tells a process its place in the job.
LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
    "FLAGS_selected_gpus", "PADDLE_DISTRI_BACKEND", "FLEETLITE_COLLECTIVE_TIMEOUT",
)


#: The Paddle documentation programs ported to fleetlite: ``shared/examples`` beside the checkout (CI clones the
#: repository with ``shared/`` next to it).
EXAMPLES = Path(__file__).resolve().parents[2] / "shared" / "examples"


def find_examples(path: Path = EXAMPLES) -> Path:
    """``path`` when it is a folder; missing, a failure under CI (``CI`` set: its clone has them), else a skip."""
    if not path.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"the examples are missing at {path}: CI clones with shared/ beside it", pytrace=False)
        pytest.skip(f"examples not found at {path} (shared/examples beside the checkout)")
    return path


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    """``shared/examples`` beside the checkout (:func:`find_examples`)."""
    return find_examples()


@pytest.fixture
def clean_dist_env(monkeypatch):
    """Run the test as a plain single process: no launcher variable is set.

    The whole environment is restored afterwards, including variables the code
    under test sets itself (``init_parallel_env``, the launch bootstrap).
    """
    saved = dict(os.environ)
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


def pytest_configure(config):
    """Scale every timeout with the machine's load (Note [test timeouts])

    # Note [test timeouts]
    Timeouts are there to turn a hang into a failure, not to time anything. On a busy 2-core CI machine a
    correct multi-process test runs several times slower than alone, so every timeout (pytest-timeout's
    markers and ini value, run_ranks/run_launch) is multiplied by FLEETLITE_TEST_TIMEOUT_SCALE, which
    defaults to 2, or to the load per core at start when that is higher.
    """
    if "FLEETLITE_TEST_TIMEOUT_SCALE" not in os.environ:
        try:
            load = os.getloadavg()[0] / (os.cpu_count() or 1)
        except OSError:
            load = 0.0
        os.environ["FLEETLITE_TEST_TIMEOUT_SCALE"] = f"{max(2.0, load):.2f}"


def pytest_collection_modifyitems(config, items):
    from fleetlite.testing import timeout_scale

    scale = timeout_scale()
    base = float(config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0] if marker and marker.args else marker.kwargs.get("timeout", base)
                        if marker else base)
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(seconds * scale), append=False)


# -- process-global state, restored around every test and every module -----------------------------------
# Note [test isolation]
# Every test starts from the process state the session started with, whatever ran before it and in whatever
# order: the fixtures below save and restore, around each test (and each module, for what module-scoped
# fixtures set up), the environment, the working directory, the signal handlers, the random generators,
# torch's global switches, the process group (destroyed when the test created it) and fleetlite's
# process-wide state (fleet.init's strategy and topology, the default static program, one-time warnings,
# the side groups). They save and restore, so a module-scoped fixture's own fleet.init or environment stays in
# place for the tests of its module. Checked by tests/test_harness.py (a second file sees nothing of a first).

#: fleetlite's module-level state: (module, attribute). Containers are restored in place (others hold them).
PROCESS_STATE = (
    ("fleetlite.distributed.collective", "_warned_single"),
    ("fleetlite.distributed.collective", "_warned_once"),
    ("fleetlite.distributed.collective", "_group_timeout"),
    ("fleetlite.distributed.agreement", "_side_groups"),
    ("fleetlite.distributed.faults", "_peers"),
    ("fleetlite.distributed.faults", "_monitor_error"),
    ("fleetlite.distributed.faults", "_prefix"),
    ("fleetlite.distributed.faults", "_generation"),
    ("fleetlite.distributed.monitor", "_monitor"),
    ("fleetlite.static.program", "_default"),
    ("fleetlite.utils.user_warning", "_SEEN"),
    ("fleetlite.vision.image", "_backend"),
)
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def _copy(value):
    if isinstance(value, weakref.WeakSet):
        return weakref.WeakSet(value)
    if isinstance(value, (list, dict, set)):
        return type(value)(value)
    return value


def _put_back(owner, name, saved):
    current = getattr(owner, name)
    if isinstance(saved, list) and isinstance(current, list):
        current[:] = saved
    elif isinstance(saved, (dict, set)) and type(current) is type(saved):
        current.clear()
        current.update(saved)
    else:
        setattr(owner, name, _copy(saved))


def snapshot():
    """Save the process-global state; returns a function that puts it back (Note [test isolation])."""
    import importlib

    import numpy as np
    import torch
    import torch.distributed as tdist

    from fleetlite.distributed.fleet import context

    env, cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in signal.valid_signals() if s not in _UNCATCHABLE}
    modules = {m: importlib.import_module(m) for m in {m for m, _ in PROCESS_STATE}}
    saved = {(m, a): _copy(getattr(modules[m], a)) for m, a in PROCESS_STATE}
    fleet_state = {k: _copy(v) for k, v in vars(context.state).items()}
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    switches = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(),
                torch.are_deterministic_algorithms_enabled())
    had_group = tdist.is_available() and tdist.is_initialized()

    def restore():
        if tdist.is_available() and tdist.is_initialized() and not had_group:
            from fleetlite.distributed import destroy_process_group

            destroy_process_group()
        for (m, a), value in saved.items():
            _put_back(modules[m], a, value)
        for k, v in fleet_state.items():
            setattr(context.state, k, _copy(v))
        for s, handler in handlers.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        dtype, grad, threads, deterministic = switches
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if torch.are_deterministic_algorithms_enabled() != deterministic:
            torch.use_deterministic_algorithms(deterministic)
        os.chdir(cwd)
        for k in set(os.environ) | set(env):
            if k == "PYTEST_CURRENT_TEST":  # pytest's own, set per phase
                continue
            if k not in env:
                del os.environ[k]
            elif os.environ.get(k) != env[k]:
                os.environ[k] = env[k]

    return restore


@pytest.fixture(autouse=True, scope="module")
def _isolate_module():
    """What a module (its module-scoped fixtures included) changed does not reach the next module."""
    restore = snapshot()
    yield
    restore()


@pytest.fixture(autouse=True)
def _isolate_test():
    """What a test changed does not reach the next test (Note [test isolation])."""
    restore = snapshot()
    yield
    restore()
