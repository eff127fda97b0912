"""The end of every batch script ``supervise submit`` writes: the supervisor runs as the shell's child.

Not ``exec``'d: a supervisor that dies of a signal nobody sent the job (SIGKILL by hand, the OOM killer, a crash)
would otherwise end the job, and Slurm does not requeue an exit by signal. So the shell

- passes on what Slurm signals it: USR1 (``--signal=B:USR1@T``: the time limit is near, or a preemption), TERM
  (scancel, the time limit, a requeue), INT, CONT;
- waits until the supervisor has *ended*, not just until a signal cut its ``wait`` short, and exits with the
  supervisor's status, so the supervisor's own exit codes decide as before;
- requeues the job itself (``scontrol requeue``) only when the supervisor died of a crash signal (KILL, SEGV,
  ABRT, BUS, ILL, FPE: a human's ``kill -9``, the OOM killer, an interpreter crash) while nothing told the job to
  end (no TERM or INT reached this shell) and Slurm is not preempting it (no PreemptTime: then Slurm requeues
  the job itself at the end of the grace time, and an early requeue would kill ranks still saving). Its next
  Slurm run continues the campaign from the journal (docs/node-loss.md, "The supervisor's own death"). When the
  requeue fails, the job ends failed with one line on stderr saying so.

Two traps this avoids, both seen on the local cluster (2026-12-03): a ``wait`` cut short by a trapped USR1
returns 138, and deciding "it ended" from a counter the trap bumps races in bash (a burst of 200 USR1s broke the
loop with 138 in 2 of 3 runs while the child ran on); here the shell asks ``kill -0`` whether the child is still
there. And the supervisor starts with USR1 ignored (``trap '' USR1`` while it is started: an ignored signal stays
ignored across exec), so a USR1 that comes before it listens, or after it stopped listening, never kills it.

Portable POSIX sh (dash and bash): traps only count, note and forward (no command substitution in a trap: one
running while ``wait`` runs can abort a batch script). No user input is pasted into the text: the one command is
the caller's words, shell-quoted, and everything else is constant.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

# The line the shell prints before requeueing; the next run reads it back from the batch log (its evidence).
DIED_MARK = "supervise: the supervisor died of signal"
# Exit statuses of a death by KILL, SEGV, ABRT, BUS, ILL, FPE: signals Slurm never uses to tell a job to end.
CRASH_STATUSES = (137, 139, 134, 135, 132, 136)

_HEAD = """\
# The supervisor runs as this shell's child: the shell passes on Slurm's signals (USR1 before the time limit or
# on preemption, TERM on scancel/time limit/requeue, CONT) and, if the supervisor dies of a crash signal while
# the job was not told to end (SIGKILL, the OOM killer), requeues the job so that its next run continues the
# campaign (not during a preemption: Slurm requeues the job itself when the grace time ends).
set +eu
sup= ending=
trap 'ending=TERM; [ -z "$sup" ] || kill -TERM "$sup" 2>/dev/null' TERM
trap 'ending=INT; [ -z "$sup" ] || kill -INT "$sup" 2>/dev/null' INT
trap '[ -z "$sup" ] || kill -CONT "$sup" 2>/dev/null' CONT
trap '' USR1  # the supervisor starts with USR1 ignored; it listens for it once it runs"""

_TAIL = f"""\
sup=$!
trap 'kill -USR1 "$sup" 2>/dev/null' USR1
[ -z "$ending" ] || kill "-$ending" "$sup" 2>/dev/null
rc=
while :; do  # a trapped signal cuts a wait short (status > 128): wait again while the supervisor is there
    wait "$sup"
    got=$?
    [ "$got" -eq 127 ] && [ -n "$rc" ] && break  # its status was already collected: rc holds it
    rc=$got
    if ! kill -0 "$sup" 2>/dev/null; then
        wait "$sup"
        got=$?
        [ "$got" -eq 127 ] || rc=$got
        break
    fi
done
case $rc in {"|".join(map(str, CRASH_STATUSES))}) crashed=yes ;; *) crashed= ;; esac
if [ -n "$crashed" ] && [ -z "$ending" ]; then
    job=${{SLURM_JOB_ID:-}}
    died="{DIED_MARK} $((rc - 128)) in job ${{job:-?}} run ${{SLURM_RESTART_COUNT:-0}} with nothing ending the job"
    if [ -n "$job" ] && scontrol show job -o "$job" 2>/dev/null | grep -q 'PreemptTime=[0-9]'; then
        echo "$died but a preemption: Slurm requeues the job when its grace time ends" >&2
        while [ -z "$ending" ]; do sleep 1; done
        exit "$rc"
    fi
    if [ -n "$job" ] && scontrol requeue "$job"; then
        echo "$died: requeued the job; its next run continues the campaign from the journal" >&2
        exit 0
    fi
    echo "$died, and 'scontrol requeue ${{job:-?}}' failed: the job ends here (resubmit its batch script)" >&2
fi
exit "$rc"
"""


def lines(run_line: Sequence[str]) -> list[str]:
    """The shell lines that run ``run_line`` (the supervisor's words, already checked by the caller) as above."""
    return [*_HEAD.splitlines(), shlex.join(run_line) + " &", *_TAIL.splitlines()]


def death_note(batch_log_tail: str, job_id: str, restart: int) -> str | None:
    """The line the batch script printed when the supervisor of Slurm run ``restart`` of job ``job_id`` died of
    a signal (None when it did not: that run ended some other way)."""
    wanted = f"{DIED_MARK} "
    run = f" in job {job_id} run {restart} "
    found = [line.strip() for line in batch_log_tail.splitlines() if line.startswith(wanted) and run in line]
    return found[-1] if found else None


def read_death_note(batch_log: Path, job_id: str, restart: int, tail_bytes: int = 65536) -> str | None:
    """``death_note`` from the end of the batch log (None when the log is missing or unreadable)."""
    try:
        with open(batch_log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - tail_bytes))
            return death_note(f.read().decode(errors="replace"), job_id, restart)
    except OSError:
        return None
