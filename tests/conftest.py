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
