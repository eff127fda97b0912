"""The Slurm adapter against the real local cluster (slurmctld + 4 slurmd): queries, actions, environment.

Every test submits its own uniquely named jobs, pins nodes only where the behaviour needs it, polls with
deadlines, and cancels its jobs / resumes its nodes in ``finally``. Other sessions may use the cluster too.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm.cli_backend import CliSlurmClient
from slurm.env import SlurmEnv
from slurm.errors import AccountingUnavailable, SlurmCommandError, SlurmUnreachable, UnknownJob
from slurm.hostlist import compress, expand, sort_unique
from slurm.model import JobInfo
from slurm.retry import RetryPolicy

pytestmark = pytest.mark.slurm

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


@pytest.fixture
def slurm(slurm_cluster) -> CliSlurmClient:  # type: ignore[no-untyped-def]
    return CliSlurmClient(env=slurm_cluster.env, policy=RetryPolicy(budget_s=30.0, call_timeout_s=20.0))


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)  # slurmd runs the jobs as root here, but keep it readable for an unprivileged run
    return tmp_path


@pytest.fixture
def jobs(slurm: CliSlurmClient) -> Iterator[list[str]]:
    """Job ids a test submitted; all cancelled at teardown."""
    submitted: list[str] = []
    yield submitted
    for job_id in submitted:
        try:
            slurm.cancel(job_id)
        except SlurmCommandError:
            pass  # already gone


def job_name(tag: str) -> str:
    return f"engA-{tag}-{uuid.uuid4().hex[:6]}"


def job_state(slurm: CliSlurmClient, job_id: str) -> JobInfo:
    job = slurm.job(job_id)
    assert job is not None, f"job {job_id} vanished"
    return job


def wait_job(
    slurm: CliSlurmClient, job_id: str, what: str, predicate: Callable[[JobInfo], object], timeout: float
) -> JobInfo:
    """Poll the job until ``predicate`` holds; return that JobInfo."""

    def probe() -> JobInfo | None:
        job = job_state(slurm, job_id)
        return job if predicate(job) else None

    return wait_for(what, probe, timeout)


def env_file(path: Path) -> SlurmEnv:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return SlurmEnv.from_environ(dict(pairs))


# ------------------------------------------------------------------------------------------------ tests


def test_two_by_two_job_environment_and_requeue(slurm: CliSlurmClient, workdir: Path, jobs: list[str]) -> None:
    script = f"""#!/bin/bash
R=${{SLURM_RESTART_COUNT:-0}}
env | grep -E '^SLURM' > {workdir}/batch.$R.tmp && mv {workdir}/batch.$R.tmp {workdir}/batch.$R.env
srun bash -c 'env | grep -E "^SLURM" > {workdir}/task.'$R'.$SLURM_PROCID.env'
sleep 300
"""
    job_id = slurm.submit(
        script,
        [f"--job-name={job_name('env')}", "--nodes=2", "--ntasks-per-node=2", "--time=3", "--requeue",
         f"--output={workdir}/out.%j", f"--chdir={workdir}"],
    )  # fmt: skip
    jobs.append(job_id)

    wait_for("4 task env files", lambda: len(list(workdir.glob("task.0.*.env"))) == 4, 60)
    batch = env_file(workdir / "batch.0.env")
    tasks = [env_file(p) for p in sorted(workdir.glob("task.0.*.env"))]
    info = job_state(slurm, job_id)

    assert info.is_running and info.restart_count == 0 and info.requeue is True
    assert batch.job_id == job_id and batch.in_batch_step and batch.restart_count == 0
    assert batch.nodelist == info.nodes and len(info.nodes) == 2
    assert batch.batch_host == info.batch_host and info.batch_host in info.nodes
    assert batch.nnodes == 2 and batch.ntasks == 4 and batch.tasks_per_node == (2, 2)
    assert sorted(t.procid for t in tasks) == [0, 1, 2, 3]  # type: ignore[type-var]
    for task in tasks:
        assert not task.in_batch_step and task.step_id == "0"
        assert task.node_name == info.nodes[task.nodeid or 0]
        assert task.localid in (0, 1) and task.job_id == job_id

    slurm.requeue(job_id)
    wait_for("the rerun's env files", lambda: len(list(workdir.glob("task.1.*.env"))) == 4, 90)
    rerun = env_file(workdir / "batch.1.env")
    assert rerun.restart_count == 1 and rerun.job_id == job_id
    assert job_state(slurm, job_id).restart_count == 1


def test_excluded_node_is_not_used_after_requeue(slurm: CliSlurmClient, workdir: Path, jobs: list[str]) -> None:
    script = "#!/bin/bash\nsleep 300\n"
    job_id = slurm.submit(
        script, [f"--job-name={job_name('exclude')}", "--nodes=1", "--time=3", "--requeue", "--output=/dev/null"]
    )
    jobs.append(job_id)
    first = wait_job(slurm, job_id, "the job to run", lambda j: j.is_running, 60)
    (bad_node,) = first.nodes

    with pytest.raises(SlurmCommandError, match="no longer pending"):
        slurm.update_excluded_nodes(job_id, [bad_node])  # Slurm refuses it on a running job

    slurm.requeue_hold(job_id)
    held = wait_job(slurm, job_id, "the requeued job to be held", lambda j: j.is_held, 60)
    assert held.restart_count == 1
    slurm.update_excluded_nodes(job_id, [bad_node])
    assert job_state(slurm, job_id).excluded_nodes == (bad_node,)
    slurm.release(job_id)

    rerun = wait_job(slurm, job_id, "the rerun", lambda j: j.is_running, 90)
    assert bad_node not in rerun.nodes and rerun.nodes
    assert rerun.excluded_nodes == (bad_node,)


def test_drain_keeps_new_work_off_a_node_until_resume(
    slurm: CliSlurmClient, workdir: Path, jobs: list[str]
) -> None:
    node = "node4"
    reason = f"engA adapter test {uuid.uuid4().hex[:6]}: hang suspected"
    try:
        slurm.drain([node], reason)
        drained = slurm.node(node)
        assert drained is not None and drained.is_drain and not drained.is_usable
        assert drained.reason == reason and drained.reason_user == "root"
        (via_text,) = slurm.nodes_via_scontrol([node])
        assert via_text.is_drain and via_text.reason == reason

        job_id = slurm.submit(
            "#!/bin/bash\ntrue\n", [f"--job-name={job_name('drain')}", f"--nodelist={node}", "--time=1",
                                    "--output=/dev/null"],
        )  # fmt: skip
        jobs.append(job_id)
        time.sleep(3)
        assert job_state(slurm, job_id).is_pending  # nothing new starts on a drained node
    finally:
        slurm.resume([node])
    wait_for(f"{node} to be usable again", lambda: (n := slurm.node(node)) is not None and n.is_usable, 30)
    wait_for("the pinned job to finish", lambda: (j := slurm.job(job_id)) is None or j.is_finished, 60)


def test_preemption_requeues_the_victim(slurm: CliSlurmClient, workdir: Path, jobs: list[str]) -> None:
    node = "node3"
    victim_script = f"""#!/bin/bash
touch {workdir}/victim.${{SLURM_RESTART_COUNT:-0}}
sleep 300
"""
    victim = slurm.submit(
        victim_script,
        [f"--job-name={job_name('victim')}", f"--nodelist={node}", "--nodes=1", "--time=3", "--requeue",
         "--partition=batch", "--output=/dev/null"],
    )  # fmt: skip
    jobs.append(victim)
    wait_for("the victim to run", lambda: (workdir / "victim.0").exists(), 60)

    urgent = slurm.submit(
        "#!/bin/bash\nsleep 2\n",
        [f"--job-name={job_name('urgent')}", "--partition=urgent", f"--nodelist={node}", "--nodes=1",
         "--exclusive", "--time=1", "--output=/dev/null"],
    )  # fmt: skip
    jobs.append(urgent)

    marked = wait_job(slurm, victim, "the preempt time", lambda j: j.preempt_time is not None, 30)
    assert marked.is_running and marked.preempt_time is not None  # still in its grace time
    assert marked.end_time is not None and marked.end_time - marked.preempt_time <= 10 + 1  # GraceTime=10

    wait_job(slurm, victim, "the victim's requeue", lambda j: j.restart_count == 1, 40)
    wait_for("the victim's rerun", lambda: (workdir / "victim.1").exists(), 90)


def test_signal_targets_batch_shell_or_steps(slurm: CliSlurmClient, workdir: Path, jobs: list[str]) -> None:
    log = workdir / "signals"
    script = f"""#!/bin/bash
trap 'echo batch-USR1 >> {log}' USR1
trap 'echo batch-USR2 >> {log}' USR2
srun --ntasks=1 bash -c 'trap "echo task-USR1 >> {log}" USR1; trap "echo task-USR2 >> {log}" USR2; \
touch {workdir}/task-ready; for i in $(seq 3000); do sleep 0.1; done' &
pid=$!
while kill -0 $pid 2>/dev/null; do wait $pid; done
"""
    job_id = slurm.submit(
        script, [f"--job-name={job_name('signal')}", "--nodes=1", "--ntasks=1", "--time=2", "--output=/dev/null"]
    )
    jobs.append(job_id)
    wait_for("the task to start", lambda: (workdir / "task-ready").exists(), 60)

    slurm.signal(job_id, "USR1", target="batch")
    wait_for("the batch shell's USR1", lambda: log.exists() and "batch-USR1" in log.read_text(), 20)
    slurm.signal(job_id, "SIGUSR2", target="steps")
    wait_for("the task's USR2", lambda: "task-USR2" in log.read_text(), 20)
    slurm.signal_step(f"{job_id}.0", "USR1")
    wait_for("the step's USR1", lambda: "task-USR1" in log.read_text(), 20)
    time.sleep(1)
    assert sorted(log.read_text().split()) == ["batch-USR1", "task-USR1", "task-USR2"]  # only where aimed
    assert job_state(slurm, job_id).is_running  # notifications never kill the step


def test_array_tasks_are_found_by_raw_and_array_ids(slurm: CliSlurmClient, workdir: Path, jobs: list[str]) -> None:
    script = f"""#!/bin/bash
env | grep -E '^SLURM' > {workdir}/task.$SLURM_ARRAY_TASK_ID.tmp && mv {workdir}/task.$SLURM_ARRAY_TASK_ID.tmp \\
  {workdir}/task.$SLURM_ARRAY_TASK_ID.env
sleep 300
"""
    array_id = slurm.submit(
        script, [f"--job-name={job_name('array')}", "--array=1-2", "--time=2", "--output=/dev/null"]
    )
    jobs.append(array_id)
    wait_for("both array tasks", lambda: len(list(workdir.glob("task.*.env"))) == 2, 60)
    for task in (1, 2):
        env = env_file(workdir / f"task.{task}.env")
        assert env.array_job_id == array_id and env.array_task_id == task and env.job_id
        by_raw = job_state(slurm, env.job_id)  # what a supervisor inside the task knows
        by_name = job_state(slurm, f"{array_id}_{task}")  # what a user types
        assert by_raw.job_id == by_name.job_id == f"{array_id}_{task}"
        assert by_raw.raw_job_id == by_name.raw_job_id == env.job_id
        assert by_raw.is_running


def test_unknown_job_is_none_and_actions_on_it_are_typed(slurm: CliSlurmClient) -> None:
    assert slurm.job("67000000") is None
    with pytest.raises(UnknownJob):
        slurm.requeue("67000000")


def test_history_needs_accounting(slurm: CliSlurmClient, slurm_cluster, jobs: list[str]) -> None:  # type: ignore[no-untyped-def]
    if not slurm_cluster.accounting_active():
        with pytest.raises(AccountingUnavailable):
            slurm.history("1")
        return
    job_id = slurm.submit("#!/bin/bash\ntrue\n", [f"--job-name={job_name('hist')}", "--output=/dev/null"])
    jobs.append(job_id)
    wait_for("the job to finish", lambda: (j := slurm.job(job_id)) is None or j.is_finished, 60)
    runs = wait_for("accounting records", lambda: slurm.history(job_id), 30)
    assert runs[-1].state == "COMPLETED" and runs[-1].exit_code == 0


def test_version_and_node_listing(slurm: CliSlurmClient, slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    assert slurm.slurm_version() is not None
    names = {n.name for n in slurm.nodes()}
    assert set(slurm_cluster.node_names) <= names
    assert {n.name for n in slurm.nodes_via_scontrol()} == names
    assert slurm.switches() == {}  # no topology plugin on the local cluster: the buddy ring follows the names


_prefix = st.sampled_from(["node", "gpu-a", "r1n", "x.y_"])
_names = st.lists(
    st.builds(lambda p, n, w: f"{p}{n:0{w}d}", _prefix, st.integers(0, 150), st.sampled_from([1, 2, 3])),
    min_size=1, max_size=25,
)  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=_names)
def test_slurm_reads_our_compressed_hostlists_back(slurm: CliSlurmClient, names: list[str]) -> None:
    """``compress`` output must mean to Slurm exactly what it means to us."""
    expr = compress(names)
    slurm_names = slurm.commands.run(["scontrol", "show", "hostnames", expr]).stdout.split()
    assert slurm_names == expand(expr) == sort_unique(names)


def test_unreachable_controller_is_retried_within_the_budget(slurm_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Real client commands against a port nobody listens on: Slurm's own "connect failure" message is
    classified as transient, retried, and the whole call stays within its budget."""
    conf = tmp_path / "slurm.conf"
    text = slurm_cluster.conf.read_text()
    # Slurm >= 23 clients retry the connect themselves for about MessageTimeout (24.11.5: 8 s per command at
    # MessageTimeout=5, measured); 2 s leaves room for several of our own attempts on every version.
    conf.write_text("\n".join("SlurmctldPort=16899" if ln.startswith("SlurmctldPort=") else
                              "MessageTimeout=2" if ln.startswith("MessageTimeout=") else ln
                              for ln in text.splitlines()) + "\n")  # fmt: skip
    client = CliSlurmClient(env={"SLURM_CONF": str(conf)}, policy=RetryPolicy(budget_s=10.0, initial_s=0.5))
    start = time.monotonic()
    with pytest.raises(SlurmUnreachable) as info:
        client.job("1")
    elapsed = time.monotonic() - start
    assert info.value.attempts >= 2
    assert "Unable to contact slurm controller" in info.value.problem or "timed out" in info.value.problem
    assert elapsed < 10.0 + 3.0


def test_environment_is_passed_to_commands(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    """The client talks to the cluster named by its env even when the process env points elsewhere."""
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = "/nonexistent/slurm.conf"
    try:
        client = CliSlurmClient(env=slurm_cluster.env, policy=RetryPolicy(budget_s=10.0))
        assert client.nodes()
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
