"""Fixtures shared by the client's unit tests (a file that defines its own ``env``/``slot_dir`` keeps it): a process
with no supervision variables set, and a slot directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.client import api


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("SUPERVISOR_SLOT_DIR", "SUPERVISOR_RESUME_FROM", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                 "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    api._reset_for_tests()
    yield monkeypatch
    api._reset_for_tests()


@pytest.fixture
def slot_dir(tmp_path: Path, env: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "slots"
    d.mkdir(mode=0o700)
    env.setenv("SUPERVISOR_SLOT_DIR", str(d))
    return d
