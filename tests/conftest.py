"""Shared test fixtures (kept minimal). Multi-process helpers live in :mod:`fleetlite.testing`."""

from __future__ import annotations

import os

import pytest

#: Variables through which a launcher tells a process its place in the job.
LAUNCHER_VARS = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS", "PADDLE_CURRENT_ENDPOINT",
    "FLAGS_selected_gpus", "PADDLE_DISTRI_BACKEND", "FLEETLITE_COLLECTIVE_TIMEOUT",
)


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
