"""SUPERVISOR_RESUME_FROM: a path, "" (fresh start: the supervisor knows there is nothing), or unset (unknown)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from supervisor.campaign import CampaignPaths
from supervisor.config import Config
from supervisor.driver.loop import Supervisor


def _sup(checkpoint_dir: str) -> Supervisor:
    sup = Supervisor.__new__(Supervisor)  # only the fields _step_env reads
    sup.paths, sup.job_id = CampaignPaths(Path("/c")), "7"
    cfg = Config()
    sup.config = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, checkpoint_dir=checkpoint_dir))
    return sup


@pytest.mark.parametrize(("ckpt_dir", "resume", "expected"), [
    ("", None, None),                   # nobody knows where checkpoints are: left unset, never "fresh start"
    ("/ck", None, ""),                  # known directory, nothing valid in it: fresh start
    ("/ck", "/ck/step_1", "/ck/step_1"),
    ("", "/ck/step_1", "/ck/step_1"),
])
def test_resume_env(ckpt_dir, resume, expected, monkeypatch):
    monkeypatch.setenv("SUPERVISOR_RESUME_FROM", "/inherited/from/the/batch/env")
    env = _sup(ckpt_dir)._step_env(resume)
    assert env.get("SUPERVISOR_RESUME_FROM") == expected
