"""The Slurm client over the standard commands (sbatch, squeue, sinfo, scontrol, scancel, sacct).

Works on any Slurm from 22.05 on without compiled bindings. Each method knows which command answers its question
on which Slurm version (JSON where it is reliable, the text forms where it is not); running the command (list
argv, timeout, retries, typed errors) is ``slurm.command``'s. Unit tests replay recorded outputs through an
injected runner; the integration tests use the real commands against the local cluster.
"""

from __future__ import annotations

import re
import signal as signal_module
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal

from slurm.command import CommandRunner, Runner
from slurm.errors import (
    AccountingUnavailable,
    SlurmCommandError,
    SlurmOutputError,
    SlurmUsageError,
    UnknownJob,
)
from slurm.hostlist import compress, node_hostlist, validate_job_id, validate_node_name, validate_step_id
from slurm.model import JobInfo, JobRun, NodeInfo
from slurm.parse import ParseError, parse_nodes_json, parse_squeue_json
from slurm.parse_sacct import SACCT_FIELDS, parse_sacct_text
from slurm.parse_scontrol import (
    parse_node_address,
    parse_node_addresses,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_step_names,
)
from slurm.retry import RetryPolicy
from slurm.sbatch import check_sbatch_options

SignalTarget = Literal["batch", "steps"]


def signal_name(sig: int | str) -> str:
    """``10`` / ``"SIGUSR1"`` / ``"usr1"`` -> ``"USR1"``; anything else is a SlurmUsageError."""
    try:
        if isinstance(sig, int) and not isinstance(sig, bool):
            return signal_module.Signals(sig).name.removeprefix("SIG")
        if isinstance(sig, str):
            name = sig.strip().upper()
            name = name if name.startswith("SIG") else "SIG" + name
            return signal_module.Signals[name].name.removeprefix("SIG")
    except (ValueError, KeyError):
        pass
    raise SlurmUsageError(f"unknown signal {sig!r}", "use a signal name such as USR1 or TERM, or its number")

_PARTITION_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # what a partition name may be here (argv, not shell)


class CliSlurmClient:
    """``SlurmClient`` implemented with the Slurm command-line tools: queries, job and node actions, each one
    argument list built from validated parts and run by :class:`~slurm.command.CommandRunner`."""

    backend_name = "cli"

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        runner: Runner | None = None,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``env`` is laid over ``os.environ`` for every command (e.g. ``{"SLURM_CONF": ...}``)."""
        self.commands = CommandRunner(env, runner, policy, sleep, clock)
        self.env, self.policy = self.commands.env, self.commands.policy
        self._version: tuple[int, int] | None = None

    # ------------------------------------------------------------------------------------ queries

    def slurm_version(self) -> tuple[int, int] | None:
        """(major, minor) of the Slurm client tools, cached; None if ``sinfo -V`` prints nothing usable."""
        if self._version is None:
            try:
                text = self.version()
                major, minor = text.split(".")[:2]
                self._version = (int(major), int(minor))
            except (ValueError, SlurmCommandError):
                self._version = (0, 0)
        return None if self._version == (0, 0) else self._version

    def job(self, job_id: str | int) -> JobInfo | None:
        """The job's current state, or None when slurmctld does not know it (ended > MinJobAge ago).

        One single-job RPC: ``scontrol show job --json J`` on Slurm >= 23.02, ``scontrol show job -o J``
        before (22.05's ``squeue --json`` ignores ``--jobs`` and dumps the whole queue).
        """
        jid = validate_job_id(job_id)
        version = self.slurm_version()
        deadline = None
        if version is not None and version >= (23, 2):
            deadline = self.commands.clock() + self.policy.budget_s
            argv = ["scontrol", "--local", "show", "job", "--json", jid]
            try:
                result = self.commands.run(argv)
                found = _pick_job(parse_squeue_json(result.stdout), jid)
            except UnknownJob:
                return None
            except SlurmCommandError as exc:
                if not _json_unsupported(exc.stderr):
                    raise
            except (ParseError, ValueError):
                pass  # fall back to the text form below
            else:
                if found is not None:
                    return found
                # Measured on 24.11.5: an unknown job AND an unreachable slurmctld both give exit 0 and
                # {"jobs": [], "errors": []}; only the text form tells "no such job" from "no answer".
        return self.job_via_scontrol(jid, deadline=deadline)

    def job_via_scontrol(self, job_id: str | int, deadline: float | None = None) -> JobInfo | None:
        """The job from ``scontrol show job -o`` (no JSON support needed)."""
        jid = validate_job_id(job_id)
        argv = ["scontrol", "--local", "show", "job", "-o", jid]
        try:
            result = self.commands.run(argv, deadline=deadline)
        except UnknownJob:
            return None
        try:
            return _pick_job(parse_scontrol_jobs(result.stdout), jid)
        except (ParseError, ValueError) as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    def jobs(self, job_ids: Iterable[str | int] | None = None, name: str | None = None) -> list[JobInfo]:
        """Jobs in the queue from ``squeue --json``, filtered here by id and/or job name (22.05 ignores
        squeue's own filters in JSON mode). Finished jobs older than MinJobAge are absent. ``--states=all``:
        24.11 leaves finished jobs out without it (22.05 listed them)."""
        wanted = {validate_job_id(j) for j in job_ids} if job_ids is not None else None
        argv = ["squeue", "--local", "--json", "--states=all"]
        result = self.commands.run(argv)
        try:
            found = parse_squeue_json(result.stdout)
        except (ParseError, ValueError) as exc:
            raise SlurmOutputError(argv, str(exc)) from None
        return [
            j
            for j in found
            if (wanted is None or j.job_id in wanted or j.raw_job_id in wanted) and (name is None or j.name == name)
        ]

    def nodes(self, names: Iterable[str] | None = None) -> list[NodeInfo]:
        """State of the given nodes (default: all), from ``scontrol --json show node`` (Slurm >= 23.02),
        ``sinfo --json`` (22.05) or ``scontrol show node -o``.

        Not ``sinfo --json`` on 24.11: it groups nodes and gives the whole group one node's drain reason
        (measured on 24.11.5: a reason set on node1 showed on idle node2-4 too)."""
        wanted = [validate_node_name(n) for n in names] if names is not None else None
        version = self.slurm_version()
        argv = ["scontrol", "--local", "--json", "show", "node"] if version is not None and version >= (23, 2) else [
            "sinfo", "--local", "--json"]
        try:
            result = self.commands.run(argv)
            infos = parse_nodes_json(result.stdout)
        except SlurmCommandError as exc:
            if not _json_unsupported(exc.stderr):
                raise
            infos = self.nodes_via_scontrol()
        except (ParseError, ValueError):
            infos = self.nodes_via_scontrol()
        if wanted is None:
            return infos
        by_name = {n.name: n for n in infos}
        return [by_name[n] for n in wanted if n in by_name]

    def nodes_via_scontrol(self, names: Iterable[str] | None = None) -> list[NodeInfo]:
        argv = ["scontrol", "--local", "show", "node", "-o"]
        if names is not None:
            argv.append(node_hostlist(names))
        result = self.commands.run(argv)
        try:
            return parse_scontrol_nodes(result.stdout)
        except (ParseError, ValueError) as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    def node(self, name: str) -> NodeInfo | None:
        found = self.nodes([name])
        return found[0] if found else None

    def history(self, job_id: str | int) -> list[JobRun]:
        """Every run of the job (one per requeue) from accounting; raises ``AccountingUnavailable`` without it.

        Text, not ``sacct --json``: 22.05's JSON reports exit code 0 for jobs that failed."""
        jid = validate_job_id(job_id)
        argv = ["sacct", "-X", "--duplicates", "--parsable2", "--noheader", f"--format={','.join(SACCT_FIELDS)}",
                f"--jobs={jid}"]  # fmt: skip
        result = self.commands.run(argv)
        if "accounting storage is disabled" in (result.stderr + result.stdout).lower():
            raise AccountingUnavailable(argv, result.stderr)
        try:
            return parse_sacct_text(result.stdout)
        except (ParseError, ValueError) as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    def config(self) -> dict[str, str]:
        """slurmctld's running configuration (``scontrol show config``) as {Key: Value}."""
        from slurm.parse_config import parse_scontrol_config

        argv = ["scontrol", "--local", "show", "config"]
        try:
            return parse_scontrol_config(self.commands.run(argv).stdout)
        except ParseError as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    def switches(self) -> dict[str, str]:
        """node -> its leaf switch or block (``scontrol show topology``); empty without a topology plugin."""
        from slurm.parse_topology import parse_topology

        argv = ["scontrol", "--local", "show", "topology"]
        try:
            return parse_topology(self.commands.run(argv).stdout)
        except ParseError as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    def partition(self, name: str) -> dict[str, str] | None:
        """One partition's settings (``scontrol show partition NAME -o``) as {Key: Value}; None: no such one."""
        from slurm.parse_config import parse_scontrol_partitions

        if not _PARTITION_NAME.fullmatch(name):
            raise ValueError(f"not a partition name: {name!r}")
        argv = ["scontrol", "--local", "show", "partition", "-o", name]
        try:
            result = self.commands.run(argv)
        except SlurmCommandError as exc:
            if "not found" in (exc.stderr or "").lower():
                return None
            raise
        try:
            found = parse_scontrol_partitions(result.stdout)
        except ParseError as exc:
            raise SlurmOutputError(argv, str(exc)) from None
        return next((p for p in found if p.get("PartitionName") == name), None)

    def partitions(self) -> list[dict[str, str]]:
        """Every partition's settings (``scontrol show partition -o``) as {Key: Value}."""
        from slurm.parse_config import parse_scontrol_partitions

        argv = ["scontrol", "--local", "show", "partition", "-o"]
        try:
            return parse_scontrol_partitions(self.commands.run(argv).stdout)
        except ParseError as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    def version(self) -> str:
        """``22.05.8`` from ``sinfo -V``."""
        out = self.commands.run(["sinfo", "-V"]).stdout.strip()
        return out.split()[-1] if out else ""

    # ------------------------------------------------------------------------------------ actions

    def submit(self, script_text: str, options: Sequence[str] = ()) -> str:
        """Submit a batch script (given on stdin) with sbatch ``options``; returns the job id.

        Only retried when slurmctld was not reached: a timed-out sbatch may have queued the job.
        """
        check_sbatch_options(options)
        if not script_text.startswith("#!"):
            raise SlurmUsageError("the batch script does not start with '#!'", "begin it with e.g. #!/bin/bash")
        argv = ["sbatch", "--parsable", *options]
        result = self.commands.run(argv, input_text=script_text, idempotent=False)
        first = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        job_id = first.split(";", 1)[0].strip()
        try:
            return validate_job_id(job_id)
        except Exception:
            raise SlurmOutputError(argv, f"expected a job id, got {result.stdout.strip()!r}") from None

    def cancel(self, job_id: str | int) -> None:
        """Cancel the whole job. To only deliver a signal, use ``signal``."""
        self.commands.run(["scancel", validate_job_id(job_id)])

    def signal(self, job_id: str | int, sig: int | str, target: SignalTarget = "steps") -> None:
        """Send ``sig`` to the batch shell only (``target="batch"``) or to the step tasks only ("steps").

        Never uses ``--full``: that also signals srun, which then tears its step down.
        """
        if target not in ("batch", "steps"):
            raise SlurmUsageError(f"invalid signal target {target!r}", "use 'batch' or 'steps'")
        argv = ["scancel", f"--signal={signal_name(sig)}"]
        if target == "batch":
            argv.append("--batch")
        argv.append(validate_job_id(job_id))
        self.commands.run(argv, idempotent=False)  # a timed-out signal may have been delivered: never send it twice

    def signal_step(self, step_id: str, sig: int | str) -> None:
        """Send ``sig`` to the tasks of one step (``123.0``), e.g. TERM to stop a training step but not the
        supervisor's other steps."""
        self.commands.run(["scancel", f"--signal={signal_name(sig)}", validate_step_id(step_id)], idempotent=False)

    def step_ids(self, job_id: str | int) -> dict[str, str]:
        """The job's live steps by name: {step name: step id ("123.4")} (``squeue --steps``)."""
        result = self.commands.run(["squeue", "--local", "--steps", "--noheader", f"--jobs={validate_job_id(job_id)}", "--format=%i %j"])
        return parse_step_names(result.stdout)

    def cancel_step(self, step_id: str, sig: int | str = "KILL") -> None:
        """Signal every task of one step on all its nodes at once (``scancel --signal=SIG STEP``); KILL ends the
        step even when its tasks are stopped (SIGSTOP)."""
        self.commands.run(["scancel", f"--signal={signal_name(sig)}", validate_step_id(step_id)], idempotent=False)

    def node_addresses(self, nodes: Iterable[str]) -> dict[str, str]:
        """NodeAddr of each node, in one query; a node missing from the answer is unknown (not in the dict)."""
        names = [validate_node_name(n) for n in nodes]
        if not names:
            return {}
        argv = ["scontrol", "--local", "show", "node", "-o", compress(names)]
        result = self.commands.run(argv)
        try:
            return {n: a for n, a in parse_node_addresses(result.stdout).items() if n in set(names)}
        except (ParseError, ValueError) as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    def node_address(self, node: str) -> str | None:
        """The node's NodeAddr (where processes on it can be reached), or None when Slurm has none for it."""
        name = validate_node_name(node)
        argv = ["scontrol", "--local", "show", "node", "-o", name]
        result = self.commands.run(argv)
        try:
            return parse_node_address(result.stdout, name)
        except (ParseError, ValueError) as exc:
            raise SlurmOutputError(argv, str(exc)) from None

    # ------------------------------------------------------------------------------------ state changes
    # A requeue or a shrink that timed out may have been applied, so it is sent once (idempotent=False); setting
    # a field to a value is safe to repeat.

    def requeue(self, job_id: str | int) -> None:
        """Requeue the job (its batch script restarts; SLURM_RESTART_COUNT increases)."""
        self.commands.run(["scontrol", "requeue", validate_job_id(job_id)], idempotent=False)

    def requeue_hold(self, job_id: str | int) -> None:
        """Requeue the job and hold it until ``release``."""
        self.commands.run(["scontrol", "requeuehold", validate_job_id(job_id)], idempotent=False)

    def release(self, job_id: str | int) -> None:
        self.commands.run(["scontrol", "release", validate_job_id(job_id)])

    def hold(self, job_id: str | int) -> None:
        self.commands.run(["scontrol", "hold", validate_job_id(job_id)])

    def update_excluded_nodes(self, job_id: str | int, nodes: Iterable[str]) -> None:
        """Set the job's ExcNodeList (replaces it; empty clears). Slurm accepts this only while the job is
        PENDING (or COMPLETING after a requeue); on a running job it raises ``SlurmCommandError``."""
        names = [validate_node_name(n) for n in nodes]
        value = compress(names) if names else ""
        self.commands.run(["scontrol", "update", f"JobId={validate_job_id(job_id)}", f"ExcNodeList={value}"])

    def shrink_job(self, job_id: str | int, nodes: Iterable[str]) -> None:
        """``scontrol update JobId=J NodeList=<nodes>`` on a running job: the job keeps only ``nodes``. Run
        without SLURM_JOBID in the environment: inside a job, scontrol would write slurm_job_J_resize.{sh,csh}
        into its working directory (the user's)."""
        names = [validate_node_name(n) for n in nodes]
        if not names:
            raise SlurmUsageError("no nodes to keep", "a job cannot be shrunk to nothing")
        env = {k: v for k, v in self.env.items() if k != "SLURM_JOBID"}
        self.commands.run(["scontrol", "update", f"JobId={validate_job_id(job_id)}", f"NodeList={compress(names)}"],
                 idempotent=False, env=env)  # fmt: skip

    def set_start_time(self, job_id: str | int, delay_s: int) -> None:
        """``scontrol update JobId=J StartTime=now+N`` (Slurm accepts it while the job is PENDING, which includes
        COMPLETING after a requeue)."""
        if isinstance(delay_s, bool) or not isinstance(delay_s, int) or delay_s < 0:
            raise SlurmUsageError(f"invalid start delay {delay_s!r}", "give whole seconds >= 0")
        self.commands.run(["scontrol", "update", f"JobId={validate_job_id(job_id)}", f"StartTime=now+{delay_s}"])

    def drain(self, nodes: Iterable[str], reason: str) -> None:
        """Drain nodes (running jobs finish, no new ones start). Needs operator rights."""
        self.commands.run(
            ["scontrol", "update", f"NodeName={_specific_nodes(nodes)}", "State=DRAIN", f"Reason={_validate_reason(reason)}"]
        )

    def resume(self, nodes: Iterable[str]) -> None:
        """Return drained/down nodes to service. Needs operator rights."""
        self.commands.run(["scontrol", "update", f"NodeName={_specific_nodes(nodes)}", "State=RESUME"])

    def reboot(self, nodes: Iterable[str], reason: str) -> None:
        """Reboot the nodes once their jobs end (ASAP: no new job starts meanwhile), then return them to service
        (``nextstate=RESUME``; the node's HealthCheckProgram drains it again if it is still unfit). Needs operator
        rights and Slurm's RebootProgram."""
        self.commands.run(["scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={_validate_reason(reason)}",
                           _specific_nodes(nodes)], idempotent=False)  # fmt: skip


def _json_unsupported(message: str) -> bool:
    """``--json`` missing (old Slurm) or its serializer plugin not installed."""
    m = message.lower()
    return "unrecognized option" in m and "json" in m or "serializer" in m or "data_parser" in m or (
        "json" in m and "plugin" in m
    )


def _pick_job(jobs: list[JobInfo], jid: str) -> JobInfo | None:
    """The record for ``jid``: never "the first one", since 22.05 lists every job whatever was asked."""
    for job in jobs:
        if jid in (job.job_id, job.raw_job_id):
            return job
    return None


def _specific_nodes(nodes: Iterable[str]) -> str:
    """The hostlist of ``nodes`` for a node action; ``ALL`` is scontrol's word for every node of the cluster (in
    ``update NodeName=`` and ``reboot``), never a node's name here."""
    names = list(nodes)
    if any(n.upper() == "ALL" for n in names):
        raise SlurmUsageError("refusing a node action on a node named ALL: scontrol reads it as every node",
                              "name the nodes one by one")  # fmt: skip
    return node_hostlist(names)


def _validate_reason(reason: str) -> str:
    if not reason or not reason.strip() or len(reason) > 256 or any(c in reason for c in "\r\n\0"):
        raise SlurmUsageError(
            f"invalid node reason {reason!r}", "give a one-line reason of at most 256 characters"
        )
    return reason.strip()
