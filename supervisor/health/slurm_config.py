"""Pure judgement of Slurm's running configuration: the settings the supervisor relies on, each with what to
change and why (``supervise doctor``). Input: ``scontrol show config`` and ``scontrol show partition -o`` as
parsed by ``slurm.parse_config``; nothing here talks to Slurm.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from slurm.parse_config import seconds

OK, WARN, FAIL = "ok", "warn", "fail"
OVERLAP_SINCE = (20, 11)  # srun --overlap appeared in 20.11, when steps stopped sharing CPUs by default


@dataclass(frozen=True)
class ConfigFinding:
    setting: str
    value: str
    status: str  # ok | warn | fail
    why: str  # what the supervisor relies on this setting for
    fix: str = ""  # what to change (empty when nothing needs to change)


def version_of(config: Mapping[str, str]) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", config.get("SLURM_VERSION", ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _null(value: str | None) -> bool:
    return value is None or value.strip() in ("", "(null)", "NONE", "none")


def judge(
    config: Mapping[str, str],
    partitions: Sequence[Mapping[str, str]] = (),
    *,
    checkpoint_grace_s: float = 60.0,
    signal_lead_s: float = 120.0,
) -> list[ConfigFinding]:
    """One finding per setting; ``checkpoint_grace_s``/``signal_lead_s`` from the campaign config (defaults)."""
    out: list[ConfigFinding] = []
    get = config.get

    version = version_of(config)
    if version is None:
        out.append(ConfigFinding("SLURM_VERSION", get("SLURM_VERSION", "(missing)"), WARN,
                           "srun --overlap (agents next to the training step) needs Slurm >= 20.11",
                           "check `scontrol show config` prints SLURM_VERSION"))  # fmt: skip
    elif version < OVERLAP_SINCE:
        out.append(ConfigFinding("SLURM_VERSION (--overlap)", get("SLURM_VERSION", ""), FAIL,
                           "the node agents and the training step run as overlapping steps (srun --overlap, 20.11+)",
                           "upgrade Slurm to 20.11 or newer"))  # fmt: skip
    else:
        out.append(ConfigFinding("SLURM_VERSION (--overlap)", get("SLURM_VERSION", ""), OK,
                           "srun --overlap is supported: the node agents run next to the training step"))  # fmt: skip

    requeue = get("JobRequeue", "")
    out.append(ConfigFinding("JobRequeue", requeue or "(missing)", OK,
                       "supervise submits with --requeue, so its jobs can be requeued whatever the default"
                       + ("" if requeue == "1" else "; other jobs are not requeued by default")))  # fmt: skip

    ptype, pmode = get("PreemptType", ""), get("PreemptMode", "").upper()
    preempting = not _null(ptype) and ptype != "preempt/none"
    if not preempting:
        out.append(ConfigFinding("PreemptType", ptype or "preempt/none", OK, "no preemption: nothing to prepare for"))
    else:
        modes = {m.strip() for m in pmode.split(",")}
        if modes & {"SUSPEND", "GANG"}:
            out.append(ConfigFinding("PreemptMode", pmode, FAIL,
                               "a suspended job's ranks are stopped (SIGSTOP): the supervisor sees a hang and kills "
                               "the step, and the collective timeouts fire on resume",
                               "set PreemptMode=REQUEUE (globally or on the partitions that run training)"))  # fmt: skip
        elif "CANCEL" in modes:
            out.append(ConfigFinding("PreemptMode", pmode, WARN,
                               "a preempted job is cancelled, not requeued: the campaign stops and must be resubmitted",
                               "set PreemptMode=REQUEUE"))  # fmt: skip
        else:
            out.append(ConfigFinding("PreemptMode", pmode or "(missing)", OK,
                               "a preempted job is requeued: the campaign resumes from its checkpoint"))  # fmt: skip
        params = {p.strip().lower() for p in get("SlurmctldParameters", "").split(",")}
        if "preempt_send_user_signal" in params:
            out.append(ConfigFinding("SlurmctldParameters", get("SlurmctldParameters", ""), OK,
                               "preempt_send_user_signal: at preemption the batch step gets USR1 (--signal) and the "
                               "supervisor asks the ranks to checkpoint"))  # fmt: skip
        else:
            out.append(ConfigFinding("SlurmctldParameters", get("SlurmctldParameters", "(null)"), WARN,
                               "without preempt_send_user_signal a preempted job's ranks get SIGTERM at once and the "
                               "supervisor no USR1: only ranks that checkpoint on SIGTERM save anything",
                               "add preempt_send_user_signal to SlurmctldParameters"))  # fmt: skip
        for part in partitions:
            out.extend(_grace(part, pmode, checkpoint_grace_s))

    out.extend(_timing(config, signal_lead_s))
    out.extend(_health(config))
    return out


def _grace(part: Mapping[str, str], global_mode: str, checkpoint_grace_s: float) -> list[ConfigFinding]:
    mode = (part.get("PreemptMode") or global_mode).upper()
    if "OFF" in mode or not mode:
        return []
    name = f"GraceTime (partition {part.get('PartitionName', '?')})"
    grace = seconds(part.get("GraceTime", "0")) or 0.0
    why = "between preemption and the kill the ranks must finish a checkpoint"
    if grace <= 0:
        return [ConfigFinding(name, "0", WARN, why + "; with 0 a preempted job is killed at once",
                        f"set GraceTime={int(checkpoint_grace_s)} (>= run.checkpoint_grace_s) on the partition")]
    if grace < checkpoint_grace_s:
        return [ConfigFinding(name, f"{grace:g}", WARN, why + f"; {grace:g} s is less than run.checkpoint_grace_s "
                        f"({checkpoint_grace_s:g} s)", f"raise GraceTime to {int(checkpoint_grace_s)} or lower "
                        "run.checkpoint_grace_s to what a checkpoint takes")]  # fmt: skip
    return [ConfigFinding(name, f"{grace:g}", OK, why)]


def _timing(config: Mapping[str, str], signal_lead_s: float) -> list[ConfigFinding]:
    out: list[ConfigFinding] = []
    kill_wait = seconds(config.get("KillWait"))
    why = "after Slurm's SIGTERM (requeue, cancel, time limit) the supervisor journals the attempt and sets the " \
          "exclusions before SIGKILL"
    if kill_wait is None:
        out.append(ConfigFinding("KillWait", config.get("KillWait", "(missing)"), WARN, why, "check scontrol show config"))
    elif kill_wait < 5:
        out.append(ConfigFinding("KillWait", f"{kill_wait:g} s", FAIL, why + f"; {kill_wait:g} s is too short",
                           "set KillWait=30 (the default)"))  # fmt: skip
    elif kill_wait < 10:
        out.append(ConfigFinding("KillWait", f"{kill_wait:g} s", WARN, why + "; under 10 s a busy batch host may not make it",
                           "set KillWait=30 (the default)"))  # fmt: skip
    else:
        out.append(ConfigFinding("KillWait", f"{kill_wait:g} s", OK, why))

    min_age = seconds(config.get("MinJobAge"))
    why = "the supervisor reads its own job's final state (preempted, cancelled, requeued) after the step ends"
    if min_age is not None and 0 < min_age < 30:
        out.append(ConfigFinding("MinJobAge", f"{min_age:g} s", WARN, why + "; the record may be gone before it looks",
                           "set MinJobAge=300 (the default)"))  # fmt: skip
    else:
        out.append(ConfigFinding("MinJobAge", config.get("MinJobAge", "(missing)"), OK, why))

    slurmd_timeout = seconds(config.get("SlurmdTimeout"))
    why = "Slurm marks a dead node DOWN (and requeues its jobs) after SlurmdTimeout; the supervisor notices a " \
          "silent node itself in about 10 s"
    if slurmd_timeout is not None and (slurmd_timeout == 0 or math.isinf(slurmd_timeout)):
        out.append(ConfigFinding("SlurmdTimeout", "0 (never)", WARN, why + "; with 0 a dead node is never marked DOWN and "
                           "a requeue may land on it again", "set SlurmdTimeout=300 (the default)"))  # fmt: skip
    elif slurmd_timeout is not None and slurmd_timeout > 600:
        out.append(ConfigFinding("SlurmdTimeout", f"{slurmd_timeout:g} s", WARN, why + "; over 10 minutes a requeue waits "
                           "that long for Slurm to give up on the node", "set SlurmdTimeout=300"))  # fmt: skip
    else:
        out.append(ConfigFinding("SlurmdTimeout", config.get("SlurmdTimeout", "(missing)"), OK, why))

    over = config.get("OverTimeLimit", "0 min")
    over_s = seconds(over)
    why = f"the supervisor checkpoints and requeues signal_lead_s ({signal_lead_s:g} s) before the time limit"
    if over_s is not None and math.isinf(over_s):
        out.append(ConfigFinding("OverTimeLimit", over, WARN, why + "; UNLIMITED lets jobs run on past their limit, so "
                           "the time limit no longer marks the end of an attempt", "set OverTimeLimit=0"))  # fmt: skip
    else:
        out.append(ConfigFinding("OverTimeLimit", over, OK, why))
    return out


def _health(config: Mapping[str, str]) -> list[ConfigFinding]:
    program = config.get("HealthCheckProgram")
    interval = seconds(config.get("HealthCheckInterval")) or 0.0
    why = "Slurm runs HealthCheckProgram on every node periodically; `supervise healthcheck --drain` drains a node " \
          "with a failing GPU, disk or memory check before the scheduler places a campaign on it"
    if _null(program):
        return [ConfigFinding("HealthCheckProgram", "(null)", WARN, why,
                        "set HealthCheckProgram to a script running `supervise healthcheck --drain` and "
                        "HealthCheckInterval=300 (see docs/health.md)")]  # fmt: skip
    if interval <= 0:
        return [ConfigFinding("HealthCheckProgram", str(program), WARN, why + "; HealthCheckInterval is 0, so it never runs",
                        "set HealthCheckInterval=300")]  # fmt: skip
    return [ConfigFinding("HealthCheckProgram", f"{program} every {interval:g} s", OK, why)]


def worst(findings: Sequence[ConfigFinding]) -> str:
    statuses = {f.status for f in findings}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else OK
