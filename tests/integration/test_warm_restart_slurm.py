"""Warm restart on the real local Slurm (issue 23): README's usage with ``[run] warm_restart = "on"`` and a user-style
program that wraps its training in ``client.restartable`` (tests/integration/programs/warm_train.py: gloo, three
ranks on three nodes, ``torch.save`` checkpoints). A rank SIGKILLed from outside, or stopped (SIGSTOP: a hang, its
peers blocked in a collective): the supervisor does not kill the step; it has the hung rank's stack saved and the
rank alone killed, orders the two survivors (waiting in their processes) onto a new rendezvous and starts only the
dead rank again, as its own job step on its node. A rank whose own training raises (app_error) waits in its process
and lets go of its group, whose connections close (the client imported dynamo before the group was built): its peers'
collectives fail, they wait too, and all three restart in their processes, nobody killed or started again. The kept
ranks keep their pids, the restart is journaled as the next launch (``warm``, generation 1, the ranks started again),
the campaign completes, and the final weights are bitwise those of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from campaign_tools import cancel, launches, wait_for
from matrix_tools import rank_pid_on, submit_program, wait_printed
from test_warm_restart_client import WORLD, base_env, free_port, start_rank, wait_all

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
PROGRAM = Path(__file__).parent / "programs" / "warm_train.py"
STEPS = 30


def uninterrupted(tmp: Path, steps: int = STEPS) -> dict[str, torch.Tensor]:
    tmp.mkdir()
    env = base_env(tmp, free_port())
    wait_all({r: start_rank(r, env, tmp, "plain", steps) for r in range(WORLD)}, tmp)
    return torch.load(tmp / "final.pt", weights_only=True)


def starts(text: str) -> list[tuple[int, int, int, int]]:
    """(rank, pid, generation, step) of every ``start`` line."""
    return [tuple(map(int, m)) for m in re.findall(r"start rank=(\d+) pid=(\d+) generation=(\d+) step=(\d+)", text)]  # type: ignore[misc]


@pytest.mark.parametrize(("fault", "standbys"), [("kill", "off"), ("kill", "auto"), ("stop", "auto"), ("hang", "auto"),
                                                  ("hang-early", "auto"), ("raise", "auto")])  # fmt: skip
def test_a_killed_or_hung_rank_is_started_again_alone_and_the_survivors_keep_their_processes(
    tmp_path: Path, fault: str, standbys: str
) -> None:
    out = tmp_path / "final.pt"
    # hang: rank 1 sleeps once the hang timeout is learned (the stall probe names it from the stacks);
    # hang-early: during the warm-up (timeout 300 s), so its peers' gloo collectives time out on it first (15 s)
    extra = {"raise": ("--raise-at-step", "12"), "hang": ("--hang-at-step", "70"),
             "hang-early": ("--hang-at-step", "12", "--pg-timeout", "15")}.get(fault, ())  # fmt: skip
    config = f'[run]\nwarm_restart = "on"\nstandbys = "{standbys}"\n'
    # (hang at 70: 14 s of steps, about 40 step-time samples, well past the 20 of the learned timeout's warm-up,
    # whose 300 s timeout would outlast the test; at 50 a loaded machine's fewer agent reports left a margin of a third)
    steps = 90 if fault == "hang" else STEPS
    camp = submit_program(tmp_path, "--out", str(out), *extra, steps=steps, ckpt_every=5, step_time=0.2, nodes=3,
                          config=config, program=PROGRAM)  # fmt: skip
    try:
        pids = {r: rank_pid_on(camp, r) for r in range(WORLD)}
        if fault == "kill" and standbys == "auto":  # once the pool is up: rank 1 goes to n2's standby, not a new step
            pool = wait_for("the standbys to start", lambda: camp.of_type("standbys"), 120)[0]
            assert sorted(pool["started"].values()) == sorted(launches(camp)[0]["nodes"]), pool
        if fault in ("kill", "stop"):  # (raise, hang: rank 1's training raises at step 12, or sleeps, by itself)
            wait_printed(camp, 1, 12)
            os.kill(pids[1], signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        first, again = launches(camp)
        assert first.get("warm") is True and "generation" not in first, first
        replaced = [] if fault == "raise" else [1]  # a rank that raised waits in its process: nothing to replace
        assert again["warm"] is True and again["generation"] == 1 and again["replaced_ranks"] == replaced, again
        assert again["resume_tier"] == "filesystem" and again["resume_step"] % 5 == 0, again
        skipped = camp.of_type("warm_restart_skipped")
        assert not skipped, skipped
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == {"stop": "hang", "hang": "hang", "hang-early": "hang", "kill": "unknown",
                                         "raise": "app_error"}[fault], interruption  # fmt: skip
        kinds = [a["kind"] for a in camp.of_type("action")]
        assert "kill_step" not in kinds, kinds
        if fault == "raise":  # it let go of its group (its sockets closed: dynamo imported first), its peers failed
            assert not [a for a in camp.of_type("action") if a["kind"] == "kill_ranks"], kinds  # and nobody was killed
        if fault.startswith("hang") or fault == "stop":  # its stack saved, then it alone killed; the step was not
            killed = [a for a in camp.of_type("action") if a["kind"] == "kill_ranks"]
            assert killed and killed[0]["target"] == ["1"], kinds
            assert [s["rank"] for s in camp.of_type("stacks") if s["result"] == "stacks_saved"], camp.of_type("stacks")
        logs = camp.root.glob("logs/*/")
        log_dir = next(d for d in logs if (d / "train-1.log").exists())
        seen = starts((log_dir / "train-1.log").read_text(errors="replace"))
        for r in (0, 1, 2) if fault == "raise" else (0, 2):  # the kept ranks: generations 0 and 1 in one process
            assert [(g, s) for rank, pid, g, s in seen if rank == r and pid == pids[r]] == \
                [(0, 0), (1, again["resume_step"])], seen  # fmt: skip
        taken = again.get("standby_ranks")
        if fault == "raise":  # no rank started again
            assert not list(log_dir.glob("train-*-g1-r1.log")) and not taken, again
        else:
            if fault == "kill" and standbys == "auto":
                assert list(taken) == ["1"], again
            if standbys == "off":
                assert taken is None and not camp.of_type("standbys"), again
            log = f"train-1-standby-{taken['1']}.log" if taken else "train-*-g1-r1.log"
            started = starts(next(log_dir.glob(log)).read_text(errors="replace"))
            assert [(rank, g, s) for rank, _, g, s in started] == [(1, 1, again["resume_step"])], started
            assert started[0][1] != pids[1]
        want = uninterrupted(tmp_path / "plain", steps)
        got = torch.load(out, weights_only=True)
        assert all(torch.equal(got[k], want[k]) for k in want), "the warm restart changed the training"
        report = camp.report()
        assert [a["outcome"]["class"] if a["outcome"] else None for a in report["attempts"]][-1] == "completed"
    finally:
        cancel(camp.job_id)


def standby_pid(ident: str) -> int:
    """The pid of standby ``ident``'s process (``python -m supervisor.client.standby`` with its id, not the srun
    that started it; one host)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        try:
            if cmdline and Path(cmdline[0]).name.startswith("python") and "supervisor.client.standby" in cmdline and \
                    proc.environ().get("SUPERVISOR_STANDBY") == ident:  # fmt: skip
                return int(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no process for standby {ident}")


@pytest.mark.parametrize("fallback", ["ignores-order", "second-fault", "standby-stopped"])
def test_a_warm_restart_that_cannot_go_on_falls_back_to_a_cold_relaunch(tmp_path: Path, fallback: str) -> None:
    """Rank 1 SIGKILLed; then either rank 2 waits but never takes its restart order (a client that cannot read
    it), or the rank taking over rank 1 fails at its start (a second fault during the warm restart), or the standby
    given rank 1 was stopped before the fault (SIGSTOP) and never shows up as it (the kept ranks wait for it in the
    rendezvous: given up after 60 s, a hang naming rank 1 and blaming no node). None may wedge the job: the warm
    restart is given up (``warm_restart_skipped`` says why), the step is killed and the training relaunched cold,
    and it completes with the weights of an uninterrupted run."""
    out = tmp_path / "final.pt"
    extra = {"ignores-order": ("--ignore-order-rank", "2"), "second-fault": ("--fail-generation", "1")}.get(fallback, ())
    steps = 2 * STEPS if fallback == "standby-stopped" else STEPS
    camp = submit_program(tmp_path, "--out", str(out), *extra, steps=steps, ckpt_every=5, step_time=0.2, nodes=3,
                          config='[run]\nwarm_restart = "on"\n', program=PROGRAM)  # fmt: skip
    stopped: int | None = None
    try:
        pid = rank_pid_on(camp, 1)
        if fallback == "standby-stopped":
            pool = wait_for("the standbys to start", lambda: camp.of_type("standbys"), 120)[0]["started"]
            node = launches(camp)[0]["nodes"][1]
            stopped = standby_pid(next(ident for ident, n in pool.items() if n == node))
            os.kill(stopped, signal.SIGSTOP)
        wait_printed(camp, 1, 12)
        os.kill(pid, signal.SIGKILL)
        ended = wait_for("the campaign to complete", camp.ended, 300)
        assert ended["state"] == "completed", ended
        first, warm, cold = launches(camp)
        assert warm.get("generation") == 1 and warm["replaced_ranks"] == [1], warm
        assert "generation" not in cold and cold["resume_tier"] == "filesystem", cold
        skipped = camp.of_type("warm_restart_skipped")
        want = "rank 2 did not take the restart order" if fallback == "ignores-order" else "second fault"
        assert skipped and want in skipped[-1]["why"], skipped
        if fallback == "second-fault":  # the taking-over rank's own log is read: its error is the evidence
            second = camp.of_type("interruption")[1]
            assert any("cannot start in generation 1" in line for line in second["evidence"]), second
        if fallback == "standby-stopped":  # taken by the stopped standby, which never showed up as rank 1
            assert list(warm.get("standby_ranks", {})) == ["1"], warm
            second = camp.of_type("interruption")[1]
            assert second["class"] == "hang" and second["blamed_nodes"] == [], second
            assert any("has not shown up in its slot" in line for line in second["evidence"]), second
        want_weights = uninterrupted(tmp_path / "plain", steps)
        got = torch.load(out, weights_only=True)
        assert all(torch.equal(got[k], want_weights[k]) for k in want_weights), "the fallback changed the training"
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGCONT)  # (so that its step's cancel ends it)
            except ProcessLookupError:
                pass
        cancel(camp.job_id)


def test_a_lost_nodes_rank_moves_to_a_standby_on_the_spare_and_the_others_keep_their_processes(
    tmp_path: Path, crashable_cluster
) -> None:  # type: ignore[no-untyped-def]
    """Three ranks on three nodes and one spare (``spare_nodes = 1``, the job and the warm step survive a node:
    ``--no-kill``); the standbys include one on the spare. A node crash (its slurmd, steps, rank and agent gone):
    the verdict blames it, the warm restart moves its rank to the spare's standby (only that rank is new, the
    other two keep their pids), the campaign completes in the same Slurm run, bitwise as uninterrupted."""
    out = tmp_path / "final.pt"
    steps = 60
    camp = submit_program(tmp_path, "--out", str(out), steps=steps, ckpt_every=5, step_time=0.2, nodes=3,
                          config='[run]\nwarm_restart = "on"\nspare_nodes = 1\n', program=PROGRAM)  # fmt: skip
    try:
        pids = {r: rank_pid_on(camp, r) for r in range(WORLD)}
        nodes = launches(camp)[0]["nodes"]
        spare = next(n for n in camp.of_type("attempt_started")[0]["nodes"] if n not in nodes)
        wait_for("a standby on the spare", lambda: [e for e in camp.of_type("standbys") if spare in
                                                    e["started"].values()] or None, 120)  # fmt: skip
        wait_printed(camp, 1, 15)
        batch = slurm_job_batch_host(camp.job_id)
        victim_rank = next(r for r in (2, 1) if nodes[r] != batch)
        victim = nodes[victim_rank]
        crashed = time.time()
        crashable_cluster.crash_node(victim)
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        first, again = launches(camp)
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "node_failure" and interruption["blamed_nodes"] == [victim], interruption
        assert again["generation"] == 1 and again["replaced_ranks"] == [victim_rank], again
        assert again["excluded"] == [victim] and again["nodes"][victim_rank] == spare, again
        assert list(again.get("standby_ranks", {})) == [str(victim_rank)], again
        assert len(camp.of_type("attempt_started")) == 1 and not camp.of_type("warm_restart_skipped")
        log_dir = next(d for d in camp.root.glob("logs/*/") if (d / "train-1.log").exists())
        seen = starts((log_dir / "train-1.log").read_text(errors="replace"))
        for r in (r for r in range(WORLD) if r != victim_rank):  # the survivors: generation 0 and 1, one process
            assert [(g, s) for rank, pid, g, s in seen if rank == r and pid == pids[r]] == \
                [(0, 0), (1, again["resume_step"])], seen  # fmt: skip
        taken = starts((log_dir / f"train-1-standby-{again['standby_ranks'][str(victim_rank)]}.log").read_text())
        assert [(rank, g) for rank, _, g, _ in taken] == [(victim_rank, 1)], taken
        print(f"\nwarm spare: crash -> verdict {interruption['t'] - crashed:.1f} s, -> warm restart "
              f"{again['t'] - crashed:.1f} s")
        want = uninterrupted(tmp_path / "plain", steps)
        got = torch.load(out, weights_only=True)
        assert all(torch.equal(got[k], want[k]) for k in want), "moving the rank changed the training"
    finally:
        cancel(camp.job_id)


def slurm_job_batch_host(job_id: str) -> str:
    from slurm.cli_backend import CliSlurmClient

    job = CliSlurmClient().job(job_id)
    assert job is not None
    return job.batch_host
