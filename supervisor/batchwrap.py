"""The end of every batch script ``supervise submit`` writes: the supervisor runs as the shell's child.

Not ``exec``'d: a supervisor that dies of a signal nobody sent the job (SIGKILL by hand, the OOM killer, a crash)
would otherwise end the job, and Slurm does not requeue an exit by signal. So the shell

- passes on what Slurm signals it: USR1 (``--signal=B:USR1@T``: the time limit is near, or a preemption), TERM
  (scancel, the time limit, a requeue), INT, CONT; then waits again until the supervisor has ended;
- exits with the supervisor's status, so the supervisor's own exit codes decide as before;
- requeues the job itself (``scontrol requeue``) only when the supervisor died of a signal (status > 128, not 130:
  the supervisor's own "interrupted") while nothing told the job to end (no TERM or INT reached this shell).
  Its next Slurm run continues the campaign from the journal (docs/node-loss.md, "The supervisor's own death").
  When the requeue fails, the job ends failed with one line on stderr saying so.

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

_HEAD = """\
# The supervisor runs as this shell's child: the shell passes on Slurm's signals (USR1 before the time limit or
# on preemption, TERM on scancel/time limit/requeue, CONT) and, if the supervisor dies of a signal while the job
# was not told to end (SIGKILL, the OOM killer), requeues the job so that its next run continues the campaign.
set +eu
sup= ending= seen=0
trap 'seen=$((seen + 1)); [ -z "$sup" ] || kill -USR1 "$sup" 2>/dev/null' USR1
trap 'seen=$((seen + 1)); ending=TERM; [ -z "$sup" ] || kill -TERM "$sup" 2>/dev/null' TERM
trap 'seen=$((seen + 1)); ending=INT; [ -z "$sup" ] || kill -INT "$sup" 2>/dev/null' INT
trap 'seen=$((seen + 1)); [ -z "$sup" ] || kill -CONT "$sup" 2>/dev/null' CONT"""

_TAIL = f"""\
sup=$!
[ -z "$ending" ] || kill "-$ending" "$sup" 2>/dev/null
while :; do
    before=$seen
    wait "$sup"
    rc=$?
    [ "$seen" = "$before" ] && break  # else a signal cut the wait short: the supervisor may still run
done
if [ -z "$ending" ] && [ "$rc" -gt 128 ] && [ "$rc" -ne 130 ]; then
    job=${{SLURM_JOB_ID:-}}
    died="{DIED_MARK} $((rc - 128)) in job ${{job:-?}} run ${{SLURM_RESTART_COUNT:-0}} with nothing ending the job"
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
