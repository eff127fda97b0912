"""The ``supervise`` command line.

Each subcommand lives in ``supervisor/commands/<name>.py`` exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only when their
subcommand runs, so ``supervise --help`` stays fast and light.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from slurm.errors import OneLineError
from supervisor.errors import EXIT_CODES, UsageError, exit_code_of

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "checkpoints": ("supervisor.commands.checkpoints", "list and verify checkpoints in a directory"),
    "submit": ("supervisor.commands.submit", "write a campaign's batch script and submit it with sbatch"),
    "status": ("supervisor.commands.status", "show the live state of a campaign"),
    "run": ("supervisor.commands.run", "supervise the training step inside an allocation (the batch step)"),
    "report": ("supervisor.commands.report", "report a campaign: attempts, outcomes, exclusions, checkpoints, goodput"),
    "simulate": ("supervisor.commands.simulate", "simulate a long campaign under a failure trace: naive requeue vs this supervisor"),
    "cancel": ("supervisor.commands.cancel", "stop a campaign for good (optionally checkpointing first); never requeued"),
    "nodes": ("supervisor.commands.nodes", "show the suspect-node ledger (strikes, exclusions) of a campaign"),
    "healthcheck": ("supervisor.commands.healthcheck", "check this node's health (GPUs, Xids, filesystems, memory); exit 8 when unfit; --drain for Slurm"),
    "site": ("supervisor.commands.site", "the site-wide node ledger: serve it, issue tokens, list nodes, forgive a node"),
    "doctor": ("supervisor.commands.doctor", "check this machine and Slurm's configuration for what the supervisor relies on"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    epilog = "exit codes:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items())
    parser = _Parser(
        prog="supervise",
        description="Supervise distributed training on Slurm: detect, classify, recover, account.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        # Only argument definitions are imported here; the command's heavy imports happen in run().
        importlib.import_module(module_name).add_arguments(p)
    return parser


def _module_of(command: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(COMMANDS[command][0])


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not raise (and print) again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (tests): nothing to quiet
        pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS and hasattr(_module_of(argv[0]), "parse_argv"):
            # Commands that pass foreign flags through (sbatch's, srun's) parse their own argv.
            module = _module_of(argv[0])
            args = module.parse_argv(argv[1:])
        else:
            args = build_parser().parse_args(argv)
            module = importlib.import_module(args._module)
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # inside the try: a reader gone away shows here, not at interpreter exit
        return code
    except BrokenPipeError:  # `supervise report C | head`: the reader has what it wanted
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, as a shell tool ended by the broken pipe
    except OneLineError as err:  # the one base: this package's errors and slurm's (mapped by exit_code_of)
        print(err.one_line(), file=sys.stderr)
        return exit_code_of(err)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
