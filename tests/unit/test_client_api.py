"""The public client API against a real slot, as the agent reads it: beats, phases, requests and
acknowledgements; and the promise never to raise into the training loop for supervisor-side
problems (missing or insecure slot directory, a mapping that went away, odd arguments)."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest

from supervisor import client
from supervisor.client import api
from supervisor.client import slot as S


def _read(slot_dir: Path, rank: int = 0) -> S.SlotRecord:
    rec = S.read_slot(S.slot_path(slot_dir, rank))
    assert rec is not None
    return rec


def test_step_and_phase_reach_the_slot(slot_dir: Path) -> None:
    client.step(0, loss=2.5)
    client.step(1, loss=float("inf"))
    rec = _read(slot_dir)
    assert (rec.step, rec.loss, rec.beats, rec.phase_name) == (1, math.inf, 2, "step")
    assert rec.rank_flags & S.RANK_FLAG_STACK_DUMPS
    with client.phase("eval"):
        assert _read(slot_dir).phase_name == "eval"
        with client.phase("checkpoint"):
            assert _read(slot_dir).rank_flags & S.RANK_FLAG_IN_CHECKPOINT
        assert _read(slot_dir).phase_name == "eval"
    assert _read(slot_dir).phase_name == "step"
    client.phase("data")  # without `with`: stays until changed
    assert _read(slot_dir).phase_name == "data"


def test_the_client_measures_its_checkpoint_stall(slot_dir: Path) -> None:
    """The time spent in checkpoint phases (outermost blocks only, failed ones too) is what the goodput ledger
    calls checkpoint stall: measured here, by the rank, not estimated by the supervisor."""
    import time

    client.step(5)
    assert _read(slot_dir).ckpt_ms == 0
    with client.phase("checkpoint"):
        with client.phase("checkpoint"):  # nested: counted once
            time.sleep(0.06)
        with client.phase("other"):
            time.sleep(0.02)
    first = _read(slot_dir)
    assert 80 <= first.ckpt_ms < 2000 and first.last_ckpt_step == 5
    with pytest.raises(RuntimeError), client.phase("checkpoint"):
        time.sleep(0.03)
        raise RuntimeError("disk full")
    assert _read(slot_dir).ckpt_ms >= first.ckpt_ms + 30


def test_the_client_measures_its_state_load(slot_dir: Path) -> None:
    """The time in restore phases (outermost blocks, failed ones too) and how many ended: what splits a restart's
    start-up into loading the state and the rest (rendezvous, model build, first step) in the report."""
    import time

    client.step(5)
    assert (_read(slot_dir).restore_ms, _read(slot_dir).restores) == (0, 0)
    with client.phase("restore"):
        with client.phase("restore"):  # nested (a helper that marks its own load): counted once
            time.sleep(0.05)
        with client.phase("data"):
            time.sleep(0.02)
    first = _read(slot_dir)
    assert 70 <= first.restore_ms < 2000 and first.restores == 1
    with pytest.raises(OSError), client.phase("restore"):
        time.sleep(0.03)
        raise OSError("torn shard")
    again = _read(slot_dir)
    assert again.restore_ms >= first.restore_ms + 30 and again.restores == 2
    assert again.ckpt_ms == 0  # a restore is not a checkpoint stall


def test_rank_identity_prefers_torchrun_over_slurm(slot_dir: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv("SLURM_PROCID", "1")  # under `srun torchrun`, PROCID numbers the node
    env.setenv("SLURM_LOCALID", "0")
    env.setenv("SLURM_NTASKS", "2")
    env.setenv("RANK", "6")
    env.setenv("LOCAL_RANK", "2")
    env.setenv("WORLD_SIZE", "8")
    client.step(0)
    rec = _read(slot_dir, 6)
    assert (rec.rank, rec.local_rank, rec.world_size) == (6, 2, 8)


def test_slurm_identity_without_torchrun(slot_dir: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv("SLURM_PROCID", "3")
    env.setenv("SLURM_LOCALID", "1")
    env.setenv("SLURM_NTASKS", "4")
    client.step(0)
    rec = _read(slot_dir, 3)
    assert (rec.rank, rec.local_rank, rec.world_size, rec.pid) == (3, 1, 4, os.getpid())


def test_loss_accepts_ints_and_tensor_likes(slot_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    client.step(0, loss=torch.tensor(0.75))
    assert _read(slot_dir).loss == 0.75
    client.step(1, loss=3)
    assert _read(slot_dir).loss == 3.0
    client.step(2, loss=torch.tensor(float("nan")))
    assert math.isnan(_read(slot_dir).loss)


def test_bad_arguments_warn_once_and_never_raise(slot_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    client.step(0, loss=1.0)
    client.step(1, loss="not a number")  # type: ignore[arg-type]
    client.step(2, loss=[1, 2])  # type: ignore[arg-type]
    rec = _read(slot_dir)
    assert (rec.step, rec.loss, rec.loss_step) == (2, 1.0, 0)  # the beat counted, the bad loss did not
    client.step(3.0, loss=0.5)  # type: ignore[arg-type]
    assert _read(slot_dir).step == 3
    client.step(object())  # type: ignore[arg-type]
    assert _read(slot_dir).step == 3
    err = capsys.readouterr().err
    assert err.count("client.step(loss=...) needs a float") == 1
    assert err.count("client.step(i=...) needs an int step") == 1
    client.step(4, loss=0.25)
    assert _read(slot_dir).step == 4  # still supervised after bad arguments


def test_requests_and_acknowledgement_through_the_api(slot_dir: Path) -> None:
    client.step(0)
    reader = S.open_slot_for_reading(S.slot_path(slot_dir, 0))
    assert not client.should_checkpoint()
    reader.set_control_flags(S.FLAG_CHECKPOINT)
    assert client.should_checkpoint() and not client.should_stop()
    with pytest.raises(RuntimeError), client.phase("checkpoint"):
        raise RuntimeError("disk full")
    assert client.should_checkpoint()  # a failed checkpoint does not acknowledge
    with client.phase("checkpoint"):
        pass
    assert not client.should_checkpoint()
    reader.set_control_flags(S.FLAG_STOP)
    assert client.should_checkpoint() and client.should_stop()
    reader.close()


def test_missing_slot_dir_warns_once_and_runs_unsupervised(
    tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env.setenv("SUPERVISOR_SLOT_DIR", str(tmp_path / "gone"))
    for i in range(3):
        client.step(i)
    assert not client.should_stop() and not client.is_supervised()
    err = capsys.readouterr().err
    assert err.count("supervisor.client: warning: cannot use SUPERVISOR_SLOT_DIR=") == 1
    assert "(fix: " in err
    assert not (tmp_path / "gone").exists()


def test_insecure_slot_dir_is_refused(tmp_path: Path, env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    env.setenv("SUPERVISOR_SLOT_DIR", str(d))
    client.step(0)
    assert not client.is_supervised() and list(d.iterdir()) == []
    assert "mode 0700" in capsys.readouterr().err


def test_slot_going_away_degrades_to_no_op(slot_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    client.step(0)
    shutil.rmtree(slot_dir)  # the agent cleaned up under us: the mapping still works
    client.step(1)
    assert api._writer is not None
    api._writer.close()  # the mapping itself is gone
    client.step(2)
    with client.phase("checkpoint"):
        pass
    assert client.should_checkpoint() is False and client.should_stop() is False
    assert not client.is_supervised()
    assert capsys.readouterr().err.count("training continues without supervisor heartbeats") == 1


def test_forked_child_does_not_write_the_slot(slot_dir: Path) -> None:
    client.step(5)
    pid = os.fork()
    if pid == 0:  # a DataLoader-style worker
        try:
            client.step(999)
            code = 0 if not client.is_supervised() else 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _read(slot_dir).step == 5


def test_fast_path_binding_and_the_imported_wrapper_agree(slot_dir: Path) -> None:
    from supervisor.client import step as imported_step  # bound before the first call: the wrapper

    imported_step(0, loss=1.0)
    assert api._writer is not None and client.step == api._writer.beat  # the hot path skips the wrapper
    client.step(1, loss=2.0)
    imported_step(2)
    rec = _read(slot_dir)
    assert (rec.step, rec.loss, rec.loss_step, rec.beats) == (2, 2.0, 1, 3)
    api._writer.close()
    client.step(3)  # fails inside the writer: degrades, and the module points back at the wrapper
    assert client.step is api.step and not client.is_supervised()


def test_slot_dir_template_is_filled_per_node(tmp_path: Path, env: pytest.MonkeyPatch) -> None:
    # One srun line serves every node; several slurmd may share a host (the local test cluster).
    node_dir = tmp_path / "node3-77"
    node_dir.mkdir(mode=0o700)
    env.setenv("SUPERVISOR_SLOT_DIR", str(tmp_path / "{node}-{job}"))
    env.setenv("SLURMD_NODENAME", "node3")
    env.setenv("SLURM_JOB_ID", "77")
    client.step(4)
    assert _read(node_dir).step == 4
