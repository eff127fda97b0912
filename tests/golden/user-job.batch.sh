#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4   # one task per GPU
#SBATCH --time=24:00:00
#SBATCH -J llama
#SBATCH --gres=gpu:4
#SBATCH --requeue
#SBATCH --signal=B:USR1@120
#SBATCH --open-mode=append
#SBATCH --output=/campaigns/llama/logs/batch-%j.out
# Adopted by `supervise submit --script` (slurm-supervisor 0.1.0) from user-job.sbatch: its
# #SBATCH and set-up lines are kept, its srun line runs under the supervisor, which launches the
# training with srun, watches and restarts it. What it runs is in /campaigns/llama/campaign.json.
module load cuda/12.4
source /opt/venvs/llama/bin/activate
export NCCL_DEBUG=WARN
cd /project/llama

# line 13, the training step: run by the supervisor (the command is in campaign.json)
# The supervisor runs as this shell's child: the shell passes on Slurm's signals (USR1 before the time limit or
# on preemption, TERM on scancel/time limit/requeue, CONT) and, if the supervisor dies of a crash signal while
# the job was not told to end (SIGKILL, the OOM killer), requeues the job so that its next run continues the
# campaign (not during a preemption: Slurm requeues the job itself when the grace time ends).
set +eu
sup= ending=
trap 'ending=TERM; [ -z "$sup" ] || kill -TERM "$sup" 2>/dev/null' TERM
trap 'ending=INT; [ -z "$sup" ] || kill -INT "$sup" 2>/dev/null' INT
trap '[ -z "$sup" ] || kill -CONT "$sup" 2>/dev/null' CONT
trap '' USR1  # the supervisor starts with USR1 ignored; it listens for it once it runs
/opt/venv/bin/python -m supervisor.cli run --campaign /campaigns/llama &
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
case $rc in 137|139|134|135|132|136) crashed=yes ;; *) crashed= ;; esac
if [ -n "$crashed" ] && [ -z "$ending" ]; then
    job=${SLURM_JOB_ID:-}
    died="supervise: the supervisor died of signal $((rc - 128)) in job ${job:-?} run ${SLURM_RESTART_COUNT:-0} with nothing ending the job"
    if [ -n "$job" ] && scontrol show job -o "$job" 2>/dev/null | grep -q 'PreemptTime=[0-9]'; then
        echo "$died but a preemption: Slurm requeues the job when its grace time ends" >&2
        while [ -z "$ending" ]; do sleep 1; done
        exit "$rc"
    fi
    if [ -n "$job" ] && scontrol requeue "$job"; then
        echo "$died: requeued the job; its next run continues the campaign from the journal" >&2
        exit 0
    fi
    echo "$died, and 'scontrol requeue ${job:-?}' failed: the job ends here (resubmit its batch script)" >&2
fi
exit "$rc"
