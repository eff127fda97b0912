"""In-process fakes of what the supervisor loop drives (the way submitit tests its core with local executors):
a Slurm client (``slurm.client.SlurmClient``), the heartbeat channel, the step launcher and its processes, and
the batch step's signal inbox. A test scripts each launch (how it ends, what it logs, what its ranks report) and
the Slurm state, runs the real ``Supervisor``, and reads the journal it wrote."""

from __future__ import annotations

import json
import signal as signal_module
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slurm.errors import SlurmUnreachable
from slurm.hostlist import expand
from slurm.model import JobInfo, NodeInfo
from supervisor.driver.signals import Received
from supervisor.heartbeat import wire
from supervisor.heartbeat.table import NodeView, RankView, Snapshot
from supervisor.heartbeat.wire import HealthReport


def rank_view(node: str, rank: int, pid: int, **overrides: Any) -> RankView:
    """A rank as the heartbeat table reports it: running, beating, no loss, unless overridden."""
    values: dict[str, Any] = dict(
        node=node, rank=rank, pid=pid, step=10, phase="step", state="running", beat_age_s=0.1, steps_per_s=2.0,
        ewma_steps_per_s=2.0, ewma_s=0.5, min_s=0.4, max_s=0.6, loss=None, loss_step=-1, beats=10, cpu_s=1.0,
        cpu_frac=1.0, rank_flags=0, control_flags=0, exit_code=None, exit_signal=None,
    )  # fmt: skip
    values.update(overrides)
    return RankView(**values)


@dataclass
class Launch:
    """How one scripted launch behaves. ``exit_code`` None: runs until killed or asked to stop."""

    exit_code: int | None = 0
    polls: int = 1  # poll() calls before it exits with exit_code
    log: str = ""
    ranks: Mapping[str, Any] = field(default_factory=dict)  # overrides applied to every rank's view
    stops_on_flags: bool = True  # exits (code 0) once asked to checkpoint and stop
    node_staleness: Mapping[str, float] = field(default_factory=dict)  # seconds since each node's last summary


class FakeProcess:
    def __init__(self, script: Launch | None = None) -> None:
        self.script = script
        self.returncode: int | None = None
        self.polled = 0
        self.stop_requested = False

    def poll(self) -> int | None:
        if self.returncode is None and self.script is not None:
            self.polled += 1
            if self.stop_requested and self.script.stops_on_flags:
                self.returncode = 0
            elif self.script.exit_code is not None and self.polled >= self.script.polls:
                self.returncode = self.script.exit_code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = 0
        return self.returncode

    def terminate(self) -> None:
        self.returncode = -signal_module.SIGTERM if self.returncode is None else self.returncode

    def kill(self) -> None:
        self.returncode = -signal_module.SIGKILL if self.returncode is None else self.returncode


class FakeTable:
    def __init__(self, job: str) -> None:
        self.job = job
        self.ranks: list[RankView] = []
        self.nodes: list[str] = []
        self.events: deque[dict[str, Any]] = deque()
        self.health: dict[str, Any] = {}  # node -> (wall time, wire.HealthReport), as LiveTable.health
        self.memory: dict[str, Any] = {}  # node -> (wall time, (Held, ...)), as LiveTable.memory
        self.replication: dict[str, str] = {}  # node -> its agent's shard-receiving address
        self.memory_off: dict[str, Any] = {}  # node -> ((rank, errno), ...) its memory store failed
        self.staleness: dict[str, float] = {}

    def node_views(self, nodes: Any = None) -> dict[str, NodeView]:
        return {n: NodeView(n, self.staleness.get(n, 0.0), 1, 1, 1, 0.0, "127.0.0.1:1") for n in self.nodes}

    def snapshot(self) -> Snapshot:
        return Snapshot(time.time(), self.job, self.node_views(), list(self.ranks), {})


class FakeChannel:
    """The heartbeat channel: the table is what the test puts there; commands sent are recorded."""

    def __init__(self, job: str) -> None:
        self.table = FakeTable(job)
        self.sent: list[tuple[str, list[Any]]] = []
        self.orders: list[tuple[str, str]] = []  # (node, JSON order) sent with send_order
        self.current: FakeProcess | None = None
        self.current_name = ""
        self.closed = False

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", 1)

    def write_address_file(self) -> Path:
        return Path("/dev/null")

    def poll(self, timeout: float) -> int:
        time.sleep(min(timeout, 0.002))
        if self.current is not None and self.current.returncode is not None:
            self.table.staleness = {}  # the scripted silence ends with its launch: the agents report again
        return 0

    def send(self, node: str, cmds: Sequence[Any]) -> bool:
        self.sent.append((node, list(cmds)))
        for cmd in cmds:
            if cmd.command == wire.CMD_SET_FLAGS and self.current is not None:
                self.current.stop_requested = True
            if cmd.command == wire.CMD_REPORT_MEMORY:  # the agents answer with what their stores hold (kept)
                self.table.memory[node] = (time.time(), self.table.memory.get(node, (0.0, ()))[1])
            if cmd.command == wire.CMD_DUMP_STACKS:
                self.table.events.append({"event": "stacks_saved", "node": node, "rank": cmd.rank, "text": "f.py:1"})
        return True

    def send_order(self, node: str, text: str) -> bool:
        self.orders.append((node, text))
        return True

    def close(self) -> None:
        self.closed = True


class FakeLauncher:
    """Starts scripted launches (and an agents' step that reports every node at once)."""

    def __init__(self, channel: FakeChannel, nodes: Sequence[str], tasks_per_node: int, launches: Sequence[Launch]):
        self.channel, self.nodes, self.tasks_per_node = channel, list(nodes), tasks_per_node
        self.launches = list(launches)
        self.argvs: list[list[str]] = []
        self.envs: list[dict[str, str]] = []
        self.next_pid = 1000
        self.preflight_runs: list[list[str]] = []  # the nodes of each preflight measurement
        self.preflight_compute: dict[str, float] = {}  # node -> its measured compute time (default 0.01 s)

    def __call__(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: str | None = None
                 ) -> FakeProcess:  # fmt: skip
        self.argvs.append(list(argv))
        self.envs.append(dict(env))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if "supervisor.agent" in argv:
            self.channel.table.nodes = list(self.nodes)
            for node in self.nodes:  # each agent's first health check: clean unless the test put one there
                self.channel.table.health.setdefault(node, (time.time(), HealthReport("ok", ())))
            return FakeProcess()
        if "supervisor.health.preflight_worker" in argv:
            return self._preflight(argv)
        script = self.launches.pop(0)
        log_path.write_text(script.log)
        ranks = []
        for i, node in enumerate(self.nodes):
            for j in range(self.tasks_per_node):
                self.next_pid += 1
                ranks.append(rank_view(node, i * self.tasks_per_node + j, self.next_pid, **dict(script.ranks)))
        self.channel.table.ranks = ranks
        self.channel.table.staleness = dict(script.node_staleness)
        proc = FakeProcess(script)
        self.channel.current = proc
        self.channel.current_name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
        return proc


    def _preflight(self, argv: Sequence[str]) -> FakeProcess:
        """The preflight's measurement step: each node's result file, compute times from ``preflight_compute``."""
        out = Path(argv[argv.index("--out") + 1])
        nodes = expand(next(a.split("=", 1)[1] for a in argv if a.startswith("--nodelist=")))
        self.preflight_runs.append(list(nodes))
        for rank, node in enumerate(nodes):
            doc = {"rank": rank, "node": node, "ok": True, "compute_s": self.preflight_compute.get(node, 0.01)}
            (out / f"rank-{rank}.json").write_text(json.dumps(doc))
        return FakeProcess(Launch(0))


class FakeSlurm:
    """``SlurmClient`` in memory: the job and nodes the test sets, every action recorded."""

    backend_name = "fake"

    def __init__(self, job: JobInfo, nodes: Sequence[str], channel: FakeChannel) -> None:
        self.job_info: JobInfo | None = job
        self.node_infos = {n: NodeInfo(name=n, state="ALLOCATED") for n in nodes}
        self.channel = channel
        self.unreachable = False
        self.calls: list[tuple[Any, ...]] = []
        self.switch_of: dict[str, str] = {}
        self.settings: dict[str, str] = {}  # ``scontrol show config`` beyond accounting (PreemptType...)
        self.partitions: dict[str, dict[str, str]] = {}  # name -> ``scontrol show partition -o`` line

    def _query(self) -> None:
        if self.unreachable:
            raise SlurmUnreachable(["squeue"], "Unable to contact slurm controller (connect failure)", 3)

    def set_node(self, name: str, state: str, *flags: str) -> None:
        self.node_infos[name] = NodeInfo(name=name, state=state, flags=frozenset(flags))

    def set_job(self, **changes: Any) -> None:
        assert self.job_info is not None
        self.job_info = replace(self.job_info, **changes)

    def job(self, job_id: str | int) -> JobInfo | None:
        self._query()
        return self.job_info

    def nodes(self, names: Any = None) -> list[NodeInfo]:
        self._query()
        return [self.node_infos[n] for n in (names or self.node_infos) if n in self.node_infos]

    def node(self, name: str) -> NodeInfo | None:
        return self.node_infos.get(name)

    def node_address(self, node: str) -> str | None:
        self._query()
        return "127.0.0.1"

    def node_addresses(self, nodes: Any) -> dict[str, str]:
        self._query()
        return {n: "127.0.0.1" for n in nodes}

    def step_ids(self, job_id: str | int) -> dict[str, str]:
        self._query()
        current = self.channel.current
        alive = current is not None and current.returncode is None
        return {self.channel.current_name: f"{job_id}.1"} if alive else {}

    def cancel_step(self, step_id: str, sig: int | str = "KILL") -> None:
        self.calls.append(("cancel_step", step_id, sig))
        if self.channel.current is not None:
            self.channel.current.kill()

    def history(self, job_id: str | int) -> list[Any]:
        return []

    def submit(self, script_text: str, options: Sequence[str] = ()) -> str:
        raise AssertionError("the loop never submits")

    def requeue(self, job_id: str | int) -> None:
        self.calls.append(("requeue", str(job_id)))

    def requeue_hold(self, job_id: str | int) -> None:
        self.calls.append(("requeue_hold", str(job_id)))

    def release(self, job_id: str | int) -> None:
        self.calls.append(("release", str(job_id)))

    def hold(self, job_id: str | int) -> None:
        self.calls.append(("hold", str(job_id)))

    def cancel(self, job_id: str | int) -> None:
        self.calls.append(("cancel", str(job_id)))

    def signal(self, job_id: str | int, sig: int | str, target: str = "steps") -> None:
        self.calls.append(("signal", str(job_id), sig, target))

    def signal_step(self, step_id: str, sig: int | str) -> None:
        self.calls.append(("signal_step", step_id, sig))

    def update_excluded_nodes(self, job_id: str | int, nodes: Any) -> None:
        self.calls.append(("update_excluded_nodes", str(job_id), sorted(nodes)))

    accounting = "accounting_storage/slurmdbd"

    def switches(self) -> dict[str, str]:
        self._query()
        return dict(self.switch_of)  # node -> leaf switch, as the test sets it (none by default)

    def config(self) -> dict[str, str]:
        return {"AccountingStorageType": self.accounting, **self.settings}

    def partition(self, name: str) -> dict[str, str] | None:
        self._query()
        return self.partitions.get(name)

    def shrink_job(self, job_id: str | int, nodes: Any) -> None:
        self.calls.append(("shrink_job", str(job_id), sorted(nodes)))

    def set_start_time(self, job_id: str | int, delay_s: int) -> None:
        self.calls.append(("set_start_time", str(job_id), delay_s))

    def drain(self, nodes: Any, reason: str) -> None:
        self.calls.append(("drain", sorted(nodes), reason))

    def resume(self, nodes: Any) -> None:
        self.calls.append(("resume", sorted(nodes)))

    def reboot(self, nodes: Any, reason: str) -> None:
        self.calls.append(("reboot", sorted(nodes), reason))


class FakeInbox:
    """The batch step's signals: ``deliver`` queues one for the loop's next look."""

    def __init__(self) -> None:
        self.pending: list[Received] = []
        self.scheduled: list[tuple[int, str]] = []  # (drains before delivery, signal name)
        self.drains = 0

    def deliver_after(self, drains: int, name: str) -> None:
        self.scheduled.append((drains, name))

    def wait(self, timeout: float) -> None:
        return None

    def drain(self) -> list[Received]:
        self.drains += 1
        for when, name in list(self.scheduled):
            if self.drains >= when:
                self.scheduled.remove((when, name))
                self.pending.append(Received(int(signal_module.Signals[name]), name, time.time()))
        got, self.pending = self.pending, []
        return got

    def close(self) -> None:
        return None


def recording_notifier(journal: list[dict[str, Any]], sent: list[Any]) -> Any:
    """A real Notifier (default alert and metrics settings) whose journal is ``journal`` and whose alerts land in
    ``sent`` instead of the dispatcher."""
    from supervisor.config import AlertConfig
    from supervisor.decisions import campaign_state, policy
    from supervisor.driver.context import Context
    from supervisor.driver.notify import Notifier
    from supervisor.metrics import MetricsConfig

    notifier = Notifier(Context.of(journal.append, lambda: 5.0), alerts_config=AlertConfig(),
                        metrics_config=MetricsConfig(), policy_config=policy.PolicyConfig(), job_id="7", campaign="/c",
                        state=campaign_state.fold([]))  # fmt: skip
    notifier.submit = sent.append  # type: ignore[method-assign]
    return notifier
