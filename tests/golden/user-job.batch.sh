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
exec /opt/venv/bin/python -m supervisor.cli run --campaign /campaigns/llama
