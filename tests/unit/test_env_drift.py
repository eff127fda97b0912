"""A launch that resumes from a checkpoint written in another environment says so (decisions/env_drift.py,
driver/env_now.py): journaled (env_changed), alerted L2 once, shown by the report; unknown is never a change."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

from supervisor.checkpoint.manifest import MANIFEST_NAME, Manifest
from supervisor.decisions import campaign_state
from supervisor.decisions import events as ev
from supervisor.decisions.env_drift import drift
from supervisor.driver.context import Context
from supervisor.driver.env_now import EnvCheck, probe, saved_fingerprint
from supervisor.report_view import render_text

SAVED = {"python": "3.11.7", "torch": "2.4.1", "cuda": "12.4", "nccl": "2.21.5", "driver": "550.54.15",
         "git_commit": "a" * 40, "world_size": 16}  # fmt: skip


def test_each_field_both_sides_know_and_that_differs_is_one_line():
    now = {**SAVED, "torch": "2.5.0", "world_size": 12, "git_commit": "b" * 40}
    assert drift(SAVED, now) == ("torch 2.4.1 -> 2.5.0", f"code (git commit) {'a' * 12} -> {'b' * 12}",
                                 "world size 16 -> 12")  # fmt: skip
    assert drift(SAVED, SAVED) == ()


def test_what_one_side_does_not_know_is_never_a_difference():
    assert drift(SAVED, {"python": "3.11.7", "cuda": None, "driver": "", "nccl": True, "torch": ["2.5"]}) == ()
    assert drift({}, SAVED) == ()


def test_the_probe_reads_the_campaign_interpreter_without_importing_torch():
    now = probe(sys.executable, str(Path(__file__).parent))
    assert now["python"] == sys.version.split()[0]
    assert now["torch"] == importlib.metadata.version("torch")
    assert now["git_commit"] is None or len(now["git_commit"]) == 40
    assert probe("/nonexistent/python", None)["driver"] is None  # a probe that cannot run: unknown, no error


def write_checkpoint(root: Path, world: int, **env: Any) -> Path:
    ckpt = root / "checkpoint-10"
    ckpt.mkdir(parents=True)
    (ckpt / MANIFEST_NAME).write_bytes(Manifest(step=10, time=1.0, world_size=world, hash_algorithm="crc32",
                                                files=(), env=env).to_json())  # fmt: skip
    return ckpt


def test_a_relaunch_on_fewer_ranks_with_another_torch_is_journaled_and_alerted_once(tmp_path):
    ckpt = write_checkpoint(tmp_path, 16, python="3.11.7", torch="2.4.1")
    assert saved_fingerprint(str(ckpt)) == {"python": "3.11.7", "torch": "2.4.1", "world_size": 16}
    journal: list[dict[str, Any]] = []
    alerts: list[tuple[str, tuple[str, ...]]] = []
    probes: list[str] = []

    def fake_probe(python: str, cwd: str | None) -> dict[str, Any]:
        probes.append(python)
        return {"python": "3.11.7", "torch": "2.5.0"}

    check = EnvCheck(Context.of(journal.append), python="python3", cwd=None,
                     alert=lambda c, d, n: alerts.append((c, d)), probe_now=fake_probe)  # fmt: skip
    nodes = tuple(f"n{i}" for i in range(3))
    assert check.resumed(str(ckpt), nodes, 4) == ("torch 2.4.1 -> 2.5.0", "world size 16 -> 12")
    check.resumed(str(ckpt), nodes, 4)  # the next relaunch from the same checkpoint: said once
    assert probes == ["python3"] and len(alerts) == 1 and [e["type"] for e in journal] == [ev.ENV_CHANGED]
    report = campaign_state.fold(journal).report(10.0)
    assert report["environment_changes"][0]["differences"] == ["torch 2.4.1 -> 2.5.0", "world size 16 -> 12"]
    assert f"resumed from {ckpt} in another environment: torch 2.4.1 -> 2.5.0; world size 16 -> 12" in \
        render_text(report)  # fmt: skip


def test_a_checkpoint_without_a_manifest_or_no_resume_says_nothing(tmp_path):
    journal: list[dict[str, Any]] = []
    check = EnvCheck(Context.of(journal.append), python="python3", cwd=None, alert=lambda c, d, n: None,
                     probe_now=lambda p, c: {"torch": "9"})  # fmt: skip
    plain = tmp_path / "last.pt"
    plain.write_bytes(b"x")
    assert check.resumed(str(plain), ("n1",), 2) == () and check.resumed(None, ("n1",), 2) == () and journal == []


def test_torchrun_workers_count_in_the_world_size_and_an_unknown_count_is_no_difference(tmp_path):
    """Under ``srun torchrun --nproc-per-node=2`` srun runs one task per node: the world is nodes x workers. A cold
    relaunch after a torchrun launch said "world size 4 -> 2" before (srun's tasks counted); where the workers per
    node cannot be read (``--nproc-per-node=gpu``) the world size is unknown, never a difference."""
    from supervisor.decisions.placement import TrainingLayout
    from supervisor.driver.launcher import TrainingLauncher

    ckpt = write_checkpoint(tmp_path, 4, python="3.11.7", torch="2.4.1")

    def launcher(*command: str) -> TrainingLauncher:
        return TrainingLauncher(Context.of(lambda e: None), start=None, layout=TrainingLayout(("n1", "n2"), 1),  # type: ignore[arg-type]
                                command=command, cwd=None, srun_args=(), job_id="7", restart_count=0,
                                campaign=tmp_path, log_dir=tmp_path, node_addresses={}, checkpoint_dir_known=True,
                                environ={})  # fmt: skip

    check = EnvCheck(Context.of(lambda e: None), python="python3", cwd=None, alert=lambda c, d, n: None,
                     probe_now=lambda p, c: {"python": "3.11.7", "torch": "2.4.1"})  # fmt: skip
    readable = launcher("torchrun", "--nproc-per-node=2", "train.py")
    assert readable.known_ranks_per_node == 2 and check.resumed(str(ckpt), ("n1", "n2"), 2) == ()
    unreadable = launcher("torchrun", "--nproc-per-node=gpu", "train.py")
    assert unreadable.known_ranks_per_node is None and check.resumed(str(ckpt), ("n1", "n2"), None) == ()
    assert launcher("python", "train.py").known_ranks_per_node == 1
    assert check.resumed(str(ckpt), ("n1", "n2"), 1) == ("world size 4 -> 2",)


def test_the_alert_is_l2_with_every_difference_and_what_to_do():
    from fakes import recording_notifier

    from supervisor.decisions import policy

    journal: list[dict[str, Any]] = []
    sent: list[Any] = []
    notifier = recording_notifier(journal, sent)
    notifier.env_changed("/ck/checkpoint-10", ("torch 2.4.1 -> 2.5.0", "world size 16 -> 12"), ("n1", "n2"))
    (alert,) = sent
    assert (alert.tier, alert.cls) == ("L2", "environment") and alert.empty_fields() == []
    assert "torch 2.4.1 -> 2.5.0; world size 16 -> 12" in alert.message and "relaunch" in alert.suggested_action
    assert [(e["kind"], e["tier"]) for e in journal] == [(policy.ALERT, "L2")]
    notifier.close()
