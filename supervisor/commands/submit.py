"""``supervise submit [sbatch flags] [--campaign DIR] [--config FILE] [--dry-run] -- CMD...`` or ``--script FILE``

Writes the campaign directory and its batch script, then submits it with sbatch. The batch script only
names the campaign: the command to run lives in ``campaign.json``, so no user input is ever pasted into
shell text. sbatch flags pass through untouched, except the ones the supervisor owns.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from supervisor import __version__
from supervisor.errors import UsageError
from supervisor.paths import CampaignPaths

HELP = "write a campaign's batch script and submit it with sbatch"

# Flags the supervisor sets itself, and what to do instead.
OWNED_FLAGS: dict[str, str] = {
    "--requeue": "the supervisor always submits with --requeue; drop the flag",
    "--no-requeue": "the supervisor needs --requeue to resume the campaign; drop the flag",
    "--signal": "the supervisor sets --signal=B:USR1@T; set submit.signal_lead_s in --config instead",
    "--output": "logs go to CAMPAIGN/logs/; drop the flag",
    "-o": "logs go to CAMPAIGN/logs/; drop the flag",
    "--error": "logs go to CAMPAIGN/logs/; drop the flag",
    "-e": "logs go to CAMPAIGN/logs/; drop the flag",
    "--open-mode": "the supervisor appends each attempt's output; drop the flag",
    "--wrap": "put the training command after --",
    "--parsable": "drop the flag; supervise prints the job id itself",
    "--array": "job arrays are not supervised; submit one campaign per run",
    "-a": "job arrays are not supervised; submit one campaign per run",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("supervise submit [sbatch flags] [--campaign DIR] [--config FILE] [--checkpoint-dir DIR] "
                    "[--dry-run] (-- CMD... | --script FILE)")
    parser.add_argument("--campaign", metavar="DIR", help="campaign directory (default ./campaigns/<time>-<name>)")
    parser.add_argument("--config", metavar="FILE", help="TOML config (see docs/configuration.md)")
    parser.add_argument("--checkpoint-dir", metavar="DIR",
                        help="where the training writes checkpoints (default: [run] checkpoint_dir, else the "
                             "training command's --ckpt-dir/--save/--output-dir/... flag)")
    parser.add_argument("--dry-run", action="store_true", help="print the batch script and the sbatch command only")
    parser.add_argument("--script", metavar="FILE",
                        help="adopt an existing sbatch script: its #SBATCH lines are kept, its srun line is the "
                             "training step (instead of -- CMD; docs/launch.md)")


def parse_argv(argv: Sequence[str]) -> argparse.Namespace:
    """Split our own options from sbatch's; everything after ``--`` is the training command."""
    argv = list(argv)
    own_part = argv[: argv.index("--")] if "--" in argv else argv
    scripted = any(a == "--script" or a.startswith("--script=") for a in own_part)
    if scripted and "--" in argv:
        raise UsageError("both --script and a command after -- were given", "pass one: --script FILE, or -- CMD...")
    if "--" not in argv and not scripted:
        raise UsageError("no training command given", "put it after --, e.g. supervise submit -N2 -- python train.py")
    cut = argv.index("--") if "--" in argv else len(argv)
    head, command = argv[:cut], argv[cut + 1 :]
    if not command and not scripted:
        raise UsageError("the training command after -- is empty", "e.g. supervise submit -N2 -- python train.py")
    own = argparse.ArgumentParser(prog="supervise submit", add_help=False, allow_abbrev=False)
    add_arguments(own)
    own.add_argument("-h", "--help", action="store_true")
    args, sbatch_flags = own.parse_known_args(head)
    if args.help:
        print(own.format_usage().strip())
        sys.exit(0)
    args.sbatch_flags = sbatch_flags
    args.command = command
    return args


def _check_flags(flags: Sequence[str]) -> None:
    from slurm.sbatch import JOB_NAME, option_name

    for tok in flags:
        name = option_name(tok)
        if name in OWNED_FLAGS:
            raise UsageError(f"sbatch flag {tok} conflicts with the supervisor's own", OWNED_FLAGS[name])
    for i, tok in enumerate(flags):
        name = option_name(tok)
        if name in ("--job-name", "-J"):
            value = tok.split("=", 1)[1] if "=" in tok else tok[2:] if name == "-J" and len(tok) > 2 else (
                flags[i + 1] if i + 1 < len(flags) else "")
            if not JOB_NAME.fullmatch(value):
                raise UsageError(f"job name {value!r} is not allowed", "use 1 to 128 of A-Z a-z 0-9 . _ -")
    if flags and option_name(flags[0]) is None:
        raise UsageError(
            f"unexpected argument {flags[0]!r} before --",
            "sbatch flags start with - ; the training command goes after --",
        )


def build(args: argparse.Namespace, now: float | None = None):  # type: ignore[no-untyped-def]
    """Compose (campaign root, spec, batch script text, sbatch flags) without touching Slurm or the disk."""
    from slurm.sbatch import SbatchFlagError, check_safe_path, has_option, render_script
    from supervisor import campaign, config

    _check_flags(args.sbatch_flags)
    script = _adopt(args.script) if getattr(args, "script", None) else None
    if script is not None:
        _check_flags(script.sbatch_flags)
        args.command = list(script.command)
    cfg = config.with_checkpoint_dir(config.load(args.config), getattr(args, "checkpoint_dir", None), args.command,
                                     str(Path.cwd()))
    if script is not None and script.srun_args:  # the srun line's own options go to the training step's srun
        import dataclasses

        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, srun_args=(*cfg.run.srun_args,
                                                                                    *script.srun_args)))
    root = Path(args.campaign) if args.campaign else campaign.default_root(cfg.submit.job_name, now)
    root = root.resolve()
    python = getattr(args, "python", None) or sys.executable
    try:
        check_safe_path(str(root), "campaign directory")
        check_safe_path(python, "python interpreter")
    except SbatchFlagError as err:
        raise UsageError(str(err), "use a path made of letters, digits and ._-/") from None
    flags = with_spare_nodes(list(args.sbatch_flags), cfg.run.spare_nodes)
    directives = [
        "--requeue",
        f"--signal=B:USR1@{cfg.submit.signal_lead_s}",
        "--open-mode=append",
        f"--output={CampaignPaths(root).batch_log('%j')}",
    ]
    if not has_option([*flags, *(script.sbatch_flags if script else ())], "--job-name", "-J"):
        directives.append(f"--job-name={cfg.submit.job_name}")
    header = [
        f"Generated by `supervise submit` (slurm-supervisor {__version__}); regenerate it, don't edit it.",
        "The supervisor runs in the batch step: it launches the training with srun, watches and restarts it.",
        f"What it runs is in {root}/campaign.json.",
    ]
    run_line = [python, "-m", "supervisor.cli", "run", "--campaign", str(root)]
    try:
        from supervisor import batchwrap

        text = render_script(directives, [], header) + "\n".join(batchwrap.lines(run_line)) + "\n"
    except SbatchFlagError as err:
        raise UsageError(str(err), "fix the value (see docs/configuration.md, [submit])") from None
    if script is not None:
        from supervisor import batchscript

        header = [f"Adopted by `supervise submit --script` (slurm-supervisor {__version__}) from {args.script}: its",
                  "#SBATCH and set-up lines are kept, its srun line runs under the supervisor, which launches the",
                  f"training with srun, watches and restarts it. What it runs is in {root}/campaign.json."]  # fmt: skip
        text = batchscript.render(script, directives, run_line, header)
    spec = campaign.CampaignSpec(
        command=tuple(args.command),
        sbatch_flags=(*(script.sbatch_flags if script else ()), *flags),
        config=cfg.to_dict(),
        # an adopted script may cd before its srun line: the training starts where the batch step stands then
        cwd="" if script is not None else str(Path.cwd()),
        python=python,
        created=time.time() if now is None else now,
    )
    return root, spec, text, flags


def _adopt(path: str):  # type: ignore[no-untyped-def]
    from supervisor import batchscript

    if any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        raise UsageError("the --script path contains a control character", "rename the file")
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read the batch script {path} ({err.__class__.__name__})",
                         "pass a readable sbatch script: --script job.sbatch") from None  # fmt: skip
    return batchscript.parse(text, path)


def with_spare_nodes(flags: list[str], spares: int) -> list[str]:
    """``[run] spare_nodes = K``: the job asks for N+K nodes (the user's -N/--nodes is N, a range min-max gets K
    on both ends; none given means 1) and keeps running when a node fails (``--no-kill``), so a spare replaces
    the lost node inside the allocation. The batch host's own loss is covered by the agents' failsafe
    (docs/node-loss.md)."""
    from slurm.sbatch import has_option, option_name

    if spares <= 0:
        return flags
    if has_option(flags, "--ntasks", "-n"):
        raise UsageError("--ntasks with [run] spare_nodes: the spare nodes would get tasks too",
                         "give --ntasks-per-node instead (the training step gets N x that many tasks)")
    out: list[str] = []
    found = False
    i = 0
    while i < len(flags):
        tok = flags[i]
        name = option_name(tok)
        if name in ("--nodes", "-N"):
            if "=" in tok:
                value, prefix = tok.split("=", 1)[1], tok.split("=", 1)[0] + "="
            elif name == "-N" and len(tok) > 2:
                value, prefix = tok[2:], "-N"
            elif i + 1 < len(flags):
                value, prefix = flags[i + 1], ""
                out.append(tok)
                i += 1
            else:
                raise UsageError(f"{tok} without a node count", "e.g. -N 2")
            out.append(prefix + _add_nodes(value, spares))
            found = True
        else:
            out.append(tok)
        i += 1
    if not found:
        out.append(f"--nodes={1 + spares}")
    if not has_option(out, "--no-kill", "-k"):
        out.append("--no-kill")
    return out


def _add_nodes(value: str, spares: int) -> str:
    parts = value.split("-")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        raise UsageError(f"node count {value!r} with [run] spare_nodes", "give -N as a number or min-max, e.g. -N 2")
    return "-".join(str(int(p) + spares) for p in parts)


def run(args: argparse.Namespace) -> int:
    from supervisor import campaign
    from supervisor.checkpoint.locate import RESUME_OFF_HINT

    root, spec, script, flags = build(args)
    metrics_cfg = spec.config.get("metrics", {})
    if metrics_cfg.get("allow_remote") and metrics_cfg.get("listen"):
        from supervisor.metrics import REMOTE_WARNING, MetricsConfig

        if MetricsConfig.from_mapping(metrics_cfg).remote:
            print(f"supervise: warning: {REMOTE_WARNING.format(listen=metrics_cfg['listen'])}", file=sys.stderr)
    run_cfg = spec.config.get("run", {})
    if not run_cfg.get("checkpoint_dir"):
        print(f"supervise: {RESUME_OFF_HINT}", file=sys.stderr)
    elif Path(run_cfg["checkpoint_dir"]).is_dir():
        from supervisor.checkpoint.store import CheckpointStore
        from supervisor.checkpoint.trust import adopt_fix

        problem = CheckpointStore(run_cfg["checkpoint_dir"]).root_problem()
        if problem:  # said now, not discovered at the first relaunch
            print(f"supervise: note: {problem}: only checkpoints this campaign signs will be resumed (fix: "
                  f"{adopt_fix(run_cfg['checkpoint_dir'])})", file=sys.stderr)
    flags, held = with_site_exclusions(flags, spec.config.get("site", {}))
    if held:  # remembered: a requeue releases them from the job's ExcNodeList once the site forgives them
        spec = dataclasses.replace(spec, site_excluded=tuple(held))
    sbatch_argv = ["sbatch", "--parsable", *flags, str(CampaignPaths(root).batch_script)]
    if args.dry_run:
        print(script, end="")
        print("# submit with: " + " ".join(sbatch_argv))
        return 0
    paths = campaign.create(root, spec, script)
    job_id = _submit(paths, flags)
    print(f"job {job_id}")
    print(f"campaign {paths.root}")
    return 0


def with_site_exclusions(flags: list[str], site: dict) -> tuple[list[str], list[str]]:  # type: ignore[type-arg]
    """``flags`` plus ``--exclude`` of the nodes the site ledger holds as bad for this user (``[site]``, docs/site.md),
    so the job is not even started on them, and those nodes. A site that cannot be asked, or the user's own
    ``--exclude``, leaves the flags as they are, with a note (the supervisor asks again before each launch)."""
    if not site.get("url"):
        return flags, []
    from slurm.hostlist import compress
    from slurm.sbatch import has_option
    from supervisor.config import SiteConfig
    from supervisor.errors import SupervisorError
    from supervisor.site.client import SiteClient, read_token_file

    cfg = SiteConfig(**{k: v for k, v in site.items() if k in ("url", "token_file", "timeout_s")})
    try:
        held = [node for node, _ in SiteClient(cfg.url, read_token_file(Path(cfg.token_file).expanduser()),
                                               cfg.timeout_s).excluded()]  # fmt: skip
    except SupervisorError as err:
        print(f"supervise: note: {err.plain()}; submitting without the site's exclusions (each launch asks "
              "again)", file=sys.stderr)  # fmt: skip
        return flags, []
    if not held:
        return flags, []
    if has_option(flags, "--exclude", "-x"):
        print(f"supervise: note: the site ledger holds {compress(held)} as bad; your own --exclude is kept as it is "
              "(add them to it to keep the job off them; each launch leaves them out anyway)", file=sys.stderr)
        return flags, []
    print(f"supervise: the site ledger holds {compress(held)} as bad: submitted with --exclude", file=sys.stderr)
    return [*flags, f"--exclude={compress(held)}"], held


def _submit(paths, flags: Sequence[str]) -> str:  # type: ignore[no-untyped-def]
    from slurm.client import get_client

    return get_client().submit(paths.batch_script.read_text(), list(flags))
