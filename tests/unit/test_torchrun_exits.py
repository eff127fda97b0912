"""`srun torchrun`: srun's tasks are the torchruns (one per node), the ranks their workers. A killed worker is
known from its torchrun's failure summary, under its global rank and its node, as a killed rank is under plain
srun; srun's line for that torchrun (it gave up: exit 1) is not read as a rank's exit. The log is the shape
torch 2.13's torchrun printed on the local cluster (tests/integration/test_launch_torchrun.py)."""

from __future__ import annotations

from supervisor.decisions.tasklog import WorkerExit, torchrun_restarts, torchrun_worker_exits
from supervisor.driver import evidence

LOG = """\
1: W1203 08:03:39.412000 20095 torch/distributed/run.py:874] *****************************************
0: [rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:25499
1: [rank2]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:37610
1: E1203 08:04:14.767000 20095 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 20188) of binary: /venv/bin/python3
1: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
1: =====================================================
1: examples/train_ddp.py FAILED
1: -----------------------------------------------------
1: Failures:
1: [1]:
1:   time      : 2026-12-03_09:06:28
1:   host      : localhost
1:   rank      : 2 (local_rank: 0)
1:   exitcode  : 1 (pid: 31378)
1:   error_file: <N/A>
1:   traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
1: -----------------------------------------------------
1: Root Cause (first observed failure):
1: [0]:
1:   time      : 2026-12-03_08:04:14
1:   host      : localhost
1:   rank      : 3 (local_rank: 1)
1:   exitcode  : -9 (pid: 20188)  (SIGKILL)
1:   error_file: <N/A>
1:   traceback : Signal 9 (SIGKILL) received by PID 20188
1: =====================================================
0: Root Cause (first observed failure):
0: [0]:
0:   rank      : 0 (local_rank: 0)
0:   exitcode  : 1 (pid: 20187)
srun: error: node2: task 1: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=1701001.1
srun: error: node1: task 0: Exited with exit code 1
""".splitlines()


def test_torchrun_failure_summaries_name_the_workers_global_ranks():
    # root causes first (torchrun prints its other failures before its root cause)
    assert torchrun_worker_exits(LOG) == (WorkerExit(1, 3, -9), WorkerExit(0, 0, 1), WorkerExit(1, 2, 1))
    assert torchrun_worker_exits(["1:   rank      : 3 (local_rank: 1)", "2:   exitcode  : 1 (pid: 4)"]) == ()


def test_a_killed_worker_is_a_killed_rank_on_its_node_and_srun_tasks_are_not_ranks():
    workers, srun = evidence.worker_exits(LOG, ("node1", "node2"))
    assert srun == ()
    got = {(x.node, x.rank, x.exit_code, x.signal) for x in workers}
    assert got == {("node2", 3, None, 9), ("node1", 0, 1, None), ("node2", 2, 1, None)}
    merged = evidence.merge_task_exits((), workers, srun)
    assert [x.rank for x in merged] == [3, 0, 2]


def test_without_torchrun_srun_tasks_are_the_ranks():
    plain = ["srun: error: node2: task 1: Killed"]
    workers, srun = evidence.worker_exits(plain, ("node1", "node2"))
    assert workers == () and [(t.node, t.task, t.signal) for t in srun] == [("node2", 1, 9)]


def test_a_killed_worker_is_classified_as_a_killed_rank_is_under_plain_srun_not_as_its_peers_comm_error():
    from supervisor.decisions import events as ev
    from supervisor.decisions.classify import classify
    from supervisor.driver.evidence import WatchResult

    found = evidence.build(
        WatchResult("exited", exit_code=1), now=100.0, ranks=[], sigterm_flag=1, job=None, job_known=True,
        nodes={}, log_lines=LOG, step_nodes=("node1", "node2"), job_nodes=("node1", "node2"), signal_lead_s=120,
        scheduled_end=None,
    )  # fmt: skip
    got = classify(found)
    assert got.cls != ev.COMM_ERROR and got.blamed_nodes == ()
    assert got.evidence[0] == "rank 3 on node2 was killed by SIGKILL (OOM killer or an outside kill)"


# torchrun --max-restarts=1 on 2 nodes: node2's worker (rank 3) killed; its torchrun logs the group failure and
# restarts (node1's torchrun restarts too, for the membership change: not a failure, not logged); later rank 0
# fails on node1: node1 restarts its group; a second kill on node2 exhausts its one restart: it gives up.
RESTARTS = """\
1: E1203 11:20:00.100000 20095 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 20188) of binary: /venv/bin/python3
0: step=31 loss=0.5
0: E1203 11:21:00.100000 20001 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 20301) of binary: /venv/bin/python3
1: E1203 11:22:00.100000 20095 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 20399) of binary: /venv/bin/python3
1: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
1: Root Cause (first observed failure):
1: [0]:
1:   rank      : 3 (local_rank: 1)
1:   exitcode  : -9 (pid: 20399)  (SIGKILL)
srun: error: node2: task 1: Exited with exit code 1
""".splitlines()


def test_torchruns_own_restarts_are_its_group_failures_less_the_one_it_gave_up_on():
    assert torchrun_restarts(RESTARTS) == {0: 1, 1: 1}
    assert torchrun_restarts(LOG) == {}  # --max-restarts=0: one failure, then the summary
    assert torchrun_restarts(RESTARTS[:1]) == {1: 1}  # restarted, the launch went on (or was killed later)
    assert torchrun_restarts([line.partition(": ")[2] for line in RESTARTS]) == {}  # not a task's line


def test_torchrun_restarts_are_counted_per_node_from_the_whole_launch_log(tmp_path):
    from supervisor.driver.launch_log import LaunchLog

    log = tmp_path / "train-1.log"
    filler = ["0: step=1 loss=1"] * 5000  # the first restart is far from the tail the evidence reads
    log.write_text("\n".join(RESTARTS[:1] + filler + RESTARTS[1:]) + "\n")
    assert torchrun_restarts(LaunchLog(log).lines()) == {0: 1, 1: 1}  # the classifier reads both
    assert LaunchLog(log).torchrun_restarts(("node3", "node1")) == {"node3": 1, "node1": 1}
    assert LaunchLog(tmp_path / "missing.log").torchrun_restarts(("node1",)) == {}


def test_a_rank_that_runs_again_under_torchrun_is_no_longer_a_pending_exit():
    """torchrun --max-restarts > 0: the worker killed and its peers stopped come back as new processes under the
    same ranks; their exits stop counting (the launch goes on), an exit without a new process still counts."""
    from fakes import rank_view

    from supervisor.decisions.detect import RANK_EXITED, DetectionEvent
    from supervisor.decisions.triage import back_again

    pending = [DetectionEvent(RANK_EXITED, (3,), ("node2",)), DetectionEvent(RANK_EXITED, (1,), ("node1",))]
    ranks = [rank_view("node2", 3, 100, state="gone"), rank_view("node2", 3, 200),  # old pid gone, new one runs
             rank_view("node1", 1, 101, state="gone")]  # fmt: skip
    assert back_again(pending, ranks) == pending[1:]
    assert back_again(pending, [rank_view("node2", 3, 100, state="gone")]) == pending


def _classify(lines: list[str]):  # type: ignore[no-untyped-def]
    from supervisor.decisions.classify import classify
    from supervisor.driver.evidence import WatchResult

    found = evidence.build(
        WatchResult("exited", exit_code=1), now=100.0, ranks=[], sigterm_flag=1, job=None, job_known=True,
        nodes={}, log_lines=lines, step_nodes=("node1", "node2"), job_nodes=("node1", "node2"), signal_lead_s=120,
        scheduled_end=None,
    )  # fmt: skip
    return classify(found)


def test_torchruns_own_traceback_of_its_childfailederror_is_not_the_programs_error():
    """torchrun raises ChildFailedError because a worker failed, with a traceback of its own (seen on Slurm with
    a warm restart, where node2's torchrun printed it before the gloo errors of node1's workers): only the worker's
    ending below it speaks. A worker's own traceback, through the same torchrun, still does."""
    from supervisor.decisions import events as ev
    from supervisor.decisions.tasklog import torchrun_wrapper_lines

    at = LOG.index("1: torch.distributed.elastic.multiprocessing.errors.ChildFailedError:")
    wrapped = [*LOG[:at], "1: Traceback (most recent call last):", '1:   File "/venv/bin/torchrun", line 8, in <module>',
               "1:     sys.exit(main())", *LOG[at:]]  # fmt: skip
    assert torchrun_wrapper_lines(wrapped) == {at, at + 3}
    got = _classify(wrapped)
    assert got.cls == ev.UNKNOWN, got  # a SIGKILL from outside: nobody's fault
    assert got.evidence[0] == "rank 3 on node2 was killed by SIGKILL (OOM killer or an outside kill)"
    own = [*wrapped[:at], "1: [rank2]: Traceback (most recent call last):", "1: [rank2]: ValueError: a bad sample",
           *wrapped[at:]]  # fmt: skip
    assert torchrun_wrapper_lines(own) == {at + 2, at + 5}  # the worker's traceback is its own
    own = [line for line in own if "[rank2]: RuntimeError" not in line]  # (its error, not a closed connection's)
    assert _classify(own).cls == ev.APP_ERROR
