"""CLI backend logic with recorded Slurm outputs: argv construction, retry policy, error typing.

The runner is replaced by a replay of real outputs (tests/unit/fixtures/slurm); the same code runs against
the real cluster in tests/integration/test_slurm_adapter.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm.cli_backend import CliSlurmClient, signal_name
from slurm.client import SlurmClient, get_client
from slurm.command import RunResult, subprocess_runner
from slurm.errors import (
    AccountingUnavailable,
    BackendUnavailable,
    InvalidJobId,
    InvalidNodeName,
    SlurmCommandError,
    SlurmCommandMissing,
    SlurmOutputError,
    SlurmRejected,
    SlurmUnavailable,
    SlurmUnreachable,
    UnknownJob,
)
from slurm.errors import SlurmUsageError as UsageError
from slurm.parse import parse_nodes_json
from slurm.retry import NO_RETRY, Failure, RetryPolicy, classify_failure, should_retry
from supervisor.errors import exit_code_of

FIX = Path(__file__).parent / "fixtures" / "slurm"
UNREACHABLE = "squeue: error: Unable to contact slurm controller (connect failure)"
TIMED_OUT = "scontrol: error: Socket timed out on send/recv operation"
INVALID_JOB = "slurm_load_jobs error: Invalid job id specified"


class Replay:
    """A runner that answers from a script of (argv prefix, result-or-exception) and records every call."""

    def __init__(self, *answers: tuple[Sequence[str], RunResult | BaseException]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[str], str | None, float, Mapping[str, str]]] = []

    def __call__(
        self, argv: Sequence[str], *, input_text: str | None, timeout: float, env: Mapping[str, str]
    ) -> RunResult:
        self.calls.append((list(argv), input_text, timeout, env))
        for i, (prefix, answer) in enumerate(self.answers):
            if list(argv[: len(prefix)]) == list(prefix):
                del self.answers[i]
                if isinstance(answer, BaseException):
                    raise answer
                return answer
        raise AssertionError(f"unexpected command {argv}")

    @property
    def argvs(self) -> list[list[str]]:
        return [c[0] for c in self.calls]


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def ok(stdout: str = "") -> RunResult:
    return RunResult(0, stdout, "")


def err(stderr: str, code: int = 1) -> RunResult:
    return RunResult(code, "", stderr)


def client(replay: Replay, policy: RetryPolicy | None = None, fake: FakeTime | None = None) -> CliSlurmClient:
    fake = fake or FakeTime()
    return CliSlurmClient(
        env={"SLURM_CONF": "/x/slurm.conf"}, runner=replay, policy=policy, sleep=fake.sleep, clock=fake.clock
    )


V22 = (["sinfo", "-V"], ok("slurm 22.05.8\n"))
V24 = (["sinfo", "-V"], ok("slurm 24.11.5\n"))


# ------------------------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("stderr", "failure"),
    [
        (UNREACHABLE, Failure.NOT_SENT),
        ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
         Failure.NOT_SENT),
        ("error: Connection refused", Failure.NOT_SENT),
        (TIMED_OUT, Failure.MAYBE_SENT),
        ("slurm_receive_msg: Zero Bytes were transmitted or received", Failure.MAYBE_SENT),
        ("sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying", Failure.MAYBE_SENT),
        (INVALID_JOB, Failure.UNKNOWN_JOB),
        ("scancel: error: Kill job error on job id 999999: Invalid job id specified", Failure.UNKNOWN_JOB),
        ((FIX / "22.05" / "sacct_disabled.stderr").read_text(), Failure.ACCOUNTING_DISABLED),
        ("Job is no longer pending execution for job 1", Failure.PERMANENT),
        ("sbatch: error: invalid partition specified: nope", Failure.PERMANENT),
        ("scontrol: error: Invalid node state specified", Failure.PERMANENT),
        ("Access/permission denied", Failure.PERMANENT),
    ],
)  # fmt: skip
def test_classify_failure(stderr: str, failure: Failure) -> None:
    assert classify_failure(1, stderr) is failure


def test_own_timeout_is_maybe_sent() -> None:
    assert classify_failure(None, "", timed_out=True) is Failure.MAYBE_SENT


def test_retry_only_what_is_safe_to_repeat() -> None:
    assert should_retry(Failure.NOT_SENT, idempotent=False)
    assert should_retry(Failure.MAYBE_SENT, idempotent=True)
    assert not should_retry(Failure.MAYBE_SENT, idempotent=False)
    for failure in (Failure.PERMANENT, Failure.UNKNOWN_JOB, Failure.ACCOUNTING_DISABLED):
        assert not should_retry(failure, idempotent=True)


def test_backoff_is_exponential_and_capped() -> None:
    policy = RetryPolicy(initial_s=0.5, max_s=4.0)
    assert [policy.backoff(i) for i in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    with pytest.raises(ValueError):
        RetryPolicy(budget_s=-1)


# ------------------------------------------------------------------------------------------- retries


def test_transient_failures_are_retried_with_backoff_then_succeed() -> None:
    fake = FakeTime()
    replay = Replay((["scontrol"], err(UNREACHABLE)), (["scontrol"], err(TIMED_OUT)), (["scontrol"], ok("done")))
    result = client(replay, fake=fake).commands.run(["scontrol", "ping"])
    assert result.stdout == "done"
    assert len(replay.calls) == 3
    assert fake.sleeps == [0.5, 1.0]


def test_budget_bounds_the_retries() -> None:
    fake = FakeTime()
    replay = Replay(*[(["squeue"], err(UNREACHABLE)) for _ in range(50)])
    policy = RetryPolicy(budget_s=10.0, initial_s=1.0, max_s=4.0)
    with pytest.raises(SlurmUnreachable) as info:
        client(replay, policy, fake).commands.run(["squeue", "--json"])
    assert sum(fake.sleeps) <= 10.0
    assert fake.sleeps == [1.0, 2.0, 4.0]
    assert info.value.attempts == len(replay.calls) == 4
    assert info.value.argv == ["squeue", "--json"]
    assert "Unable to contact slurm controller" in info.value.problem
    assert isinstance(info.value, SlurmUnavailable) and exit_code_of(info.value) == 4


def test_each_attempt_has_a_timeout_capped_by_the_budget() -> None:
    fake = FakeTime()
    replay = Replay((["squeue"], subprocess.TimeoutExpired(["squeue"], 5)), (["squeue"], ok("{}")))
    client(replay, RetryPolicy(budget_s=12.0, call_timeout_s=30.0), fake).commands.run(["squeue"])
    timeouts = [c[2] for c in replay.calls]
    assert timeouts[0] == 12.0 and 1.0 <= timeouts[1] <= 12.0


def test_no_retry_policy_tries_once() -> None:
    replay = Replay((["squeue"], err(UNREACHABLE)))
    with pytest.raises(SlurmUnreachable):
        client(replay, NO_RETRY).commands.run(["squeue"])
    assert len(replay.calls) == 1
    assert replay.calls[0][2] == NO_RETRY.call_timeout_s


def test_permanent_errors_are_not_retried_and_carry_argv_and_message() -> None:
    replay = Replay((["scontrol"], err("Job is no longer pending execution for job 7")))
    with pytest.raises(SlurmCommandError) as info:
        client(replay).update_excluded_nodes("7", ["node2"])
    assert len(replay.calls) == 1
    assert info.value.argv == ["scontrol", "update", "JobId=7", "ExcNodeList=node2"]
    assert info.value.returncode == 1 and "no longer pending" in info.value.stderr
    assert isinstance(info.value, SlurmRejected) and exit_code_of(info.value) == 5


def test_a_timed_out_submit_is_not_repeated() -> None:
    """sbatch may have queued the job before timing out: retrying could submit it twice."""
    replay = Replay((["sbatch"], subprocess.TimeoutExpired(["sbatch"], 30)))
    with pytest.raises(SlurmUnreachable) as info:
        client(replay).submit("#!/bin/bash\ntrue\n", ["--job-name=x"])
    assert len(replay.calls) == 1
    assert "may or may not have been applied" in info.value.problem


def test_an_unreached_submit_is_retried() -> None:
    replay = Replay((["sbatch"], err(UNREACHABLE)), (["sbatch"], ok("42\n")))
    assert client(replay).submit("#!/bin/bash\ntrue\n") == "42"
    assert len(replay.calls) == 2


def test_missing_command() -> None:
    replay = Replay((["sacct"], FileNotFoundError("sacct")))
    with pytest.raises(SlurmCommandMissing) as info:
        client(replay).history("5")
    assert "sacct" in info.value.problem


# ------------------------------------------------------------------------------------------- queries


def test_job_on_22_05_uses_one_scontrol_rpc() -> None:
    text = (FIX / "22.05" / "scontrol_running_restart1.txt").read_text()
    replay = Replay(V22, (["scontrol", "--local", "show", "job", "-o", "1"], ok(text)))
    job = client(replay).job(1)
    assert job is not None and job.restart_count == 1 and job.nodes == ("node2", "node3")
    assert replay.argvs[-1] == ["scontrol", "--local", "show", "job", "-o", "1"]


def test_job_on_24_11_uses_scontrol_json() -> None:
    text = (FIX / "24.11" / "squeue.json").read_text()
    replay = Replay(V24, (["scontrol", "--local", "show", "job", "--json", "102"], ok(text)))
    job = client(replay).job("102")
    assert job is not None and job.is_pending and job.excluded_nodes == ("node1", "node4")


def test_job_picks_the_asked_job_never_the_first() -> None:
    text = (FIX / "24.11" / "squeue.json").read_text()
    replay = Replay(V24, (["scontrol", "--local", "show", "job", "--json"], ok(text)),
                    (["scontrol", "--local", "show", "job", "-o", "999"], err(INVALID_JOB)))
    assert client(replay).job("999") is None


def test_empty_json_answer_is_checked_with_the_text_form() -> None:
    """24.11.5 answers `scontrol show job --json J` with exit 0 and no jobs both for an unknown job and when
    slurmctld is unreachable (captured: scontrol_json_unreachable.json): never read that as "no such job"."""
    empty = (FIX / "24.11" / "scontrol_json_unreachable.json").read_text()
    unreachable = err("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
    replay = Replay(V24, (["scontrol", "--local", "show", "job", "--json"], ok(empty)),
                    *[(["scontrol", "--local", "show", "job", "-o"], unreachable)] * 50)
    with pytest.raises(SlurmUnreachable):
        client(replay, policy=RetryPolicy(budget_s=5.0, initial_s=0.5)).job("7")


def test_unknown_job_is_none_not_a_crash() -> None:
    replay = Replay(V22, (["scontrol", "--local", "show", "job"], err(INVALID_JOB)))
    assert client(replay).job("999999") is None


def test_job_json_unsupported_falls_back_to_text() -> None:
    text = (FIX / "22.05" / "scontrol_running.txt").read_text()
    replay = Replay(
        V24,
        (["scontrol", "--local", "show", "job", "--json"], err("scontrol: error: unable to find serializer plugin for mime type application/json")),
        (["scontrol", "--local", "show", "job", "-o"], ok(text)),
    )
    job = client(replay).job("1")
    assert job is not None and job.source == "scontrol"


def test_jobs_filters_the_whole_queue_itself() -> None:
    replay = Replay((["squeue", "--local", "--json"], ok((FIX / "22.05" / "squeue_finished.json").read_text())))
    jobs = client(replay).jobs(job_ids=["3", "4"])
    assert [j.job_id for j in jobs] == ["3", "4"]
    replay = Replay((["squeue", "--local", "--json"], ok((FIX / "22.05" / "squeue_finished.json").read_text())))
    assert [j.job_id for j in client(replay).jobs(name="engA-fail")] == ["3"]


def test_nodes_from_sinfo_json_and_fallback() -> None:
    replay = Replay(V22, (["sinfo", "--local", "--json"], ok((FIX / "22.05" / "sinfo_drain.json").read_text())))
    (node,) = client(replay).nodes(["node4"])
    assert node.is_drain and node.reason == "engA capture: maint Foo=bar test"
    replay = Replay(
        V22,
        (["sinfo", "--local", "--json"], ok("not json")),
        (["scontrol", "--local", "show", "node", "-o"], ok((FIX / "22.05" / "scontrol_nodes_drain.txt").read_text())),
    )
    assert client(replay).node("node3") is not None
    assert replay.argvs[-1] == ["scontrol", "--local", "show", "node", "-o"]


def test_nodes_on_24_11_come_per_node_from_scontrol_json() -> None:
    """24.11's sinfo --json smears one node's reason over its whole group (real capture: node1 resumed after a
    drain keeps its reason, and sinfo gave it to the idle group node[1-4])."""
    smeared = {n.name: n.reason for n in parse_nodes_json((FIX / "24.11" / "sinfo_reason_smeared.json").read_text())}
    assert smeared["node2"] == "fixture capture"  # node2 was never drained: why sinfo is not used there
    replay = Replay(V24, (["scontrol", "--local", "--json", "show", "node"],
                          ok((FIX / "24.11" / "scontrol_json_nodes_reason_kept.json").read_text())))
    nodes = {n.name: n for n in client(replay).nodes()}
    assert nodes["node2"].reason is None and nodes["node1"].reason == "fixture capture"
    assert all(n.is_usable for n in nodes.values())


def test_history_without_accounting() -> None:
    replay = Replay((["sacct"], err((FIX / "22.05" / "sacct_disabled.stderr").read_text())))
    with pytest.raises(AccountingUnavailable) as info:
        client(replay).history("1")
    assert "slurmdbd" in info.value.fix
    assert replay.argvs[0][:5] == ["sacct", "-X", "--duplicates", "--parsable2", "--noheader"]
    assert replay.argvs[0][-1] == "--jobs=1"


def test_history_parses_runs() -> None:
    replay = Replay((["sacct"], ok((FIX / "22.05" / "sacct_runs.txt").read_text())))
    runs = client(replay).history("1")
    assert [(r.job_id, r.state, r.restart_count) for r in runs] == [
        ("1", "REQUEUED", 0), ("1", "CANCELLED", 1), ("2", "FAILED", 0)
    ]


# ------------------------------------------------------------------------------------------- actions


def test_submit_passes_the_script_on_stdin() -> None:
    replay = Replay((["sbatch"], ok("123;localcluster\n")))
    script = "#!/bin/bash\nsrun true\n"
    job_id = client(replay).submit(script, ["--nodes=2", "--job-name=camp"])
    assert job_id == "123"
    argv, stdin, _timeout, env = replay.calls[0]
    assert argv == ["sbatch", "--parsable", "--nodes=2", "--job-name=camp"]
    assert stdin == script
    assert env["SLURM_CONF"] == "/x/slurm.conf"


@pytest.mark.parametrize(
    "options",
    [["script.sh"], ["--nodes=2", "x"], [""], ["--requeue", "x"], ["--exclusive", "x"], ["-N2", "x"],
     ["-N", "2", "x"], ["-H", "x"]],
)
def test_submit_rejects_positional_arguments(options: list[str]) -> None:
    replay = Replay()
    with pytest.raises(UsageError):
        client(replay).submit("#!/bin/bash\n", options)
    assert replay.calls == []


@pytest.mark.parametrize(
    "options", [["-N", "2"], ["--time", "5", "--requeue"], ["--exclusive=user", "-J", "camp", "-N2"], []]
)
def test_submit_accepts_flags_with_separate_values(options: list[str]) -> None:
    replay = Replay((["sbatch"], ok("7\n")))
    assert client(replay).submit("#!/bin/bash\n", options) == "7"
    assert replay.argvs == [["sbatch", "--parsable", *options]]


def test_submit_rejects_a_script_without_shebang_and_bad_output() -> None:
    with pytest.raises(UsageError):
        client(Replay()).submit("srun true\n")
    with pytest.raises(SlurmOutputError):
        client(Replay((["sbatch"], ok("Submitted batch job 5\n")))).submit("#!/bin/sh\n")


@pytest.mark.parametrize(
    ("call", "argv"),
    [
        (lambda c: c.requeue("5"), ["scontrol", "requeue", "5"]),
        (lambda c: c.requeue_hold(5), ["scontrol", "requeuehold", "5"]),
        (lambda c: c.release("5"), ["scontrol", "release", "5"]),
        (lambda c: c.hold("5_2"), ["scontrol", "hold", "5_2"]),
        (lambda c: c.cancel("5"), ["scancel", "5"]),
        (lambda c: c.signal("5", "SIGUSR1", target="batch"), ["scancel", "--signal=USR1", "--batch", "5"]),
        (lambda c: c.signal("5", 12), ["scancel", "--signal=USR2", "5"]),
        (lambda c: c.signal_step("5.0", "TERM"), ["scancel", "--signal=TERM", "5.0"]),
        (lambda c: c.signal_step("5_1.batch", 10), ["scancel", "--signal=USR1", "5_1.batch"]),
        (lambda c: c.update_excluded_nodes("5", ["node3", "node1", "node2"]),
         ["scontrol", "update", "JobId=5", "ExcNodeList=node[1-3]"]),
        (lambda c: c.update_excluded_nodes("5", []), ["scontrol", "update", "JobId=5", "ExcNodeList="]),
        (lambda c: c.shrink_job("5", ["node3", "node1"]), ["scontrol", "update", "JobId=5", "NodeList=node[1,3]"]),
        (lambda c: c.set_start_time("5", 3), ["scontrol", "update", "JobId=5", "StartTime=now+3"]),
        (lambda c: c.drain(["node2"], "supervise: hang (job 5)"),
         ["scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=supervise: hang (job 5)"]),
        (lambda c: c.resume(["node2", "node1"]), ["scontrol", "update", "NodeName=node[1-2]", "State=RESUME"]),
        (lambda c: c.reboot(["node3"], "supervise-site: Xid 79"),
         ["scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=supervise-site: Xid 79", "node3"]),
    ],
)  # fmt: skip
def test_action_argv(call, argv: list[str]) -> None:  # type: ignore[no-untyped-def]
    replay = Replay(([argv[0]], ok()))
    call(client(replay))
    assert replay.argvs == [argv]
    assert "--full" not in argv


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.requeue("5; reboot"), InvalidJobId),
        (lambda c: c.cancel("--all"), InvalidJobId),
        (lambda c: c.signal_step("5", "TERM"), InvalidJobId),
        (lambda c: c.signal_step("5.0 6", "TERM"), InvalidJobId),
        (lambda c: c.drain(["node1", "-x"], "r"), InvalidNodeName),
        (lambda c: c.drain(["node1"], "two\nlines"), UsageError),
        (lambda c: c.reboot(["node1", "-x"], "r"), InvalidNodeName),
        (lambda c: c.reboot(["ALL"], "r"), UsageError),  # scontrol reboot's word for every node, never a node
        (lambda c: c.reboot(["all"], "r"), UsageError),
        (lambda c: c.drain(["node1", "ALL"], "r"), UsageError),
        (lambda c: c.resume(["All"]), UsageError),
        (lambda c: c.drain([], "r"), UsageError),
        (lambda c: c.signal("5", "NOPE"), UsageError),
        (lambda c: c.signal("5", "USR1", target="all"), UsageError),
        (lambda c: c.commands.run(["squeue", "a\0b"]), UsageError),
    ],
)
def test_bad_input_never_reaches_slurm(call, error: type[Exception]) -> None:  # type: ignore[no-untyped-def]
    replay = Replay()
    with pytest.raises(error):
        call(client(replay))
    assert replay.calls == []


def test_unknown_job_on_an_action_is_typed() -> None:
    replay = Replay((["scontrol"], err("Invalid job id specified for job 999999")))
    with pytest.raises(UnknownJob):
        client(replay).requeue("999999")


def test_signal_names() -> None:
    assert signal_name("usr1") == "USR1" and signal_name("SIGTERM") == "TERM" and signal_name(9) == "KILL"


# ------------------------------------------------------------------------------------------- factory, runner


def test_get_client_defaults_to_cli_and_satisfies_the_protocol() -> None:
    c = get_client("auto", env={"SLURM_CONF": "/nonexistent"})
    assert c.backend_name == "cli"
    assert isinstance(c, SlurmClient)


def test_pyslurm_is_used_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A site where pyslurm imports and matches still gets the tested CLI backend unless it opts in."""
    from slurm import pyslurm_backend

    class Usable:
        backend_name = "pyslurm"

        def __init__(self, cli: object) -> None:
            self.cli = cli

    monkeypatch.setattr(pyslurm_backend, "PyslurmClient", Usable)
    monkeypatch.delenv("SUPERVISOR_SLURM_BACKEND", raising=False)
    assert get_client().backend_name == "cli"
    for chosen in ("pyslurm", "auto"):
        monkeypatch.setenv("SUPERVISOR_SLURM_BACKEND", chosen)
        assert get_client().backend_name == "pyslurm"
    monkeypatch.setenv("SUPERVISOR_SLURM_BACKEND", "libslurm")
    with pytest.raises(UsageError, match="SUPERVISOR_SLURM_BACKEND=.libslurm."):
        get_client()


def test_get_client_pyslurm_without_pyslurm_is_a_clear_error() -> None:
    try:
        import pyslurm  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("pyslurm is installed here")
    with pytest.raises(BackendUnavailable) as info:
        get_client("pyslurm")
    assert "pyslurm" in info.value.problem and info.value.fix


def test_get_client_rejects_unknown_backends() -> None:
    with pytest.raises(UsageError):
        get_client("rest")


def test_subprocess_runner_times_out_and_captures_output() -> None:
    result = subprocess_runner(["sh", "-c", "echo out; echo err >&2; exit 3"], input_text=None, timeout=10, env={})
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    echoed = subprocess_runner(["cat"], input_text="script", timeout=10, env={})
    assert echoed.stdout == "script"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess_runner(["sleep", "5"], input_text=None, timeout=0.2, env={})


def test_job_finds_an_array_task_by_its_raw_id() -> None:
    """``scontrol show job 30`` lists every task of array 30; SLURM_JOB_ID=30 is task 2, not "the first"."""
    from slurm.env import SlurmEnv

    env_lines = (FIX / "22.05" / "env_array_task2.txt").read_text().splitlines()
    env = SlurmEnv.from_environ(dict(line.split("=", 1) for line in env_lines if "=" in line))
    text = (FIX / "22.05" / "scontrol_array_all_tasks.txt").read_text()
    replay = Replay(V22, (["scontrol", "--local", "show", "job", "-o", "30"], ok(text)))
    job = client(replay).job(env.job_id or "")
    assert job is not None and job.job_id == f"{env.array_job_id}_{env.array_task_id}" == "30_2"


# ------------------------------------------------------------------------------------------- job steps, node address


STEPS = (FIX / "22.05" / "squeue_steps.txt").read_text()
NODES = (FIX / "22.05" / "scontrol_nodes.txt").read_text()


def test_step_ids_map_names_to_ids_from_squeue() -> None:
    replay = Replay((["squeue"], ok(STEPS)))
    ids = client(replay).step_ids("1721717")
    assert replay.calls[0][0] == ["squeue", "--local", "--steps", "--noheader", "--jobs=1721717", "--format=%i %j"]
    assert ids == {"supervisor-agent": "1721717.0", "train-1": "1721717.1", "batch": "1721717.batch"}


def test_step_ids_skip_lines_that_are_not_steps() -> None:
    replay = Replay((["squeue"], ok("squeue: warning: something\n\n 41.1 train-1\n")))
    assert client(replay).step_ids("41") == {"train-1": "41.1"}


def test_cancel_step_sends_the_signal_to_one_step_once() -> None:
    replay = Replay((["scancel"], ok()))
    client(replay).cancel_step("41.2", "KILL")
    assert replay.calls[0][0] == ["scancel", "--signal=KILL", "41.2"]
    with pytest.raises(UsageError):
        client(Replay()).cancel_step("41; rm -rf /", "KILL")


def test_node_address_reads_nodeaddr_of_the_named_node() -> None:
    replay = Replay((["scontrol"], ok(NODES)))
    assert client(replay).node_address("node1") == "127.0.0.1"
    assert replay.calls[0][0] == ["scontrol", "--local", "show", "node", "-o", "node1"]
    assert client(Replay((["scontrol"], ok(NODES)))).node_address("node9") is None


def test_a_shrink_runs_without_slurm_jobid_so_scontrol_writes_no_resize_scripts(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Inside a job scontrol writes slurm_job_J_resize.{sh,csh} into its working directory after a resize.
    monkeypatch.setenv("SLURM_JOBID", "5")
    replay = Replay((["scontrol"], ok()), (["scontrol"], ok()))
    c = client(replay)
    c.shrink_job("5", ["node1"])
    c.requeue("5")
    (shrink, _, _, env), (_, _, _, other_env) = replay.calls
    assert shrink[-1] == "NodeList=node1" and "SLURM_JOBID" not in env and other_env["SLURM_JOBID"] == "5"
