"""A standby rank: a process started ahead of need, its interpreter up and torch imported, that takes over a dead
rank when the supervisor assigns it one. ``python -m supervisor.client.standby [--preload MODULE]... -- SCRIPT ARGS``
(or ``-- -m MODULE ARGS``): the training command without its interpreter.

WHY: a warm restart keeps the survivors' processes, but the dead rank's replacement still pays srun, Python and
``import torch`` (about three seconds here, minutes at scale with containers and CUDA), and the survivors wait for
it. A standby has paid that before the fault. It waits for ``<slot dir>/standby-<ID>.assign`` (``ID`` from
``SUPERVISOR_STANDBY``), an order in the restart order's format that may also set the rank's identity
(``restart_order.ASSIGN_ENV``); then it sets those variables, forgets that it was a standby and runs the program as
``python SCRIPT ARGS`` would (``runpy``, ``__main__``), in this process. While it waits it says so in
``<slot dir>/standby-<ID>.ready`` (its pid and what it preloaded). It leaves when its slot directory goes (the job
ended), on SIGTERM, or after ``--idle-timeout`` seconds.

Not a rank until assigned: the supervisor starts it with ``SUPERVISOR_HELPER_STEP`` set, so the agents never count
it among the ranks of a launch; once it runs the program, the program's client publishes as the assigned rank.
Stdlib only, except the modules it is asked to preload.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import sys
import time
from pathlib import Path

from supervisor import paths as _paths
from supervisor.client import store_wait
from supervisor.client.restart_order import ASSIGN_ENV, ENV_GENERATION, RestartOrder, read_order

ENV_STANDBY = "SUPERVISOR_STANDBY"
# What a standby imports while it waits. torch._dynamo too: ``client.restartable`` imports it before the program's
# process group (client/restart.py, ``_import_dynamo_first``), and it is the slowest of the three (1.6 s after
# torch's 1.5 s on this 2-core machine): not preloaded, it was most of a standby's time from its assignment to the
# rendezvous (a node crash with a warm spare: 1.4 s from the order to the process group).
DEFAULT_PRELOAD = ("torch", "torch.distributed", "torch._dynamo")
POLL_S = 0.02
EXIT_IDLE = 0  # no assignment came (the job ended, or the idle timeout): nothing failed
EXIT_USAGE = 2


def assign_name(standby: str) -> str:
    return f"standby-{standby}.assign"


def ready_name(standby: str) -> str:
    return f"standby-{standby}.ready"


def slot_dir_here() -> Path | None:
    """This node's slot directory, as the client finds it (``{node}``, ``{job}`` filled in); None unsupervised."""
    template = os.environ.get(_paths.SLOT_DIR_ENV, "")
    if not template:
        return None
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    return _paths.expand_slot_dir(template, job=os.environ.get("SLURM_JOB_ID", ""), node=node)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m supervisor.client.standby", description=__doc__.splitlines()[0])
    p.add_argument("--preload", action="append", default=None,
                   help="a module to import while waiting (repeatable; default: torch, torch.distributed and "
                        "torch._dynamo, which client.restartable imports before the program's process group)")
    p.add_argument("--idle-timeout", type=float, default=0.0, help="leave after this many seconds unassigned (0: never)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS, or -- -m MODULE ARGS")
    args = p.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target or (target[0] == "-m" and len(target) < 2):
        p.error("the program to run is missing: give `-- SCRIPT ARGS` or `-- -m MODULE ARGS`")
    args.target = target
    return args


def preload(modules: list[str]) -> list[str]:
    """Import what the program will need, now; a module that cannot be imported is left to the program."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:  # noqa: S112 - the program imports it itself, and fails there if it must
            continue
    return loaded


def wait_for_assignment(slot_dir: Path, standby: str, idle_timeout_s: float) -> RestartOrder | None:
    """The assignment, or None when the slot directory went away (the job ended) or the idle timeout passed."""
    deadline = time.monotonic() + idle_timeout_s if idle_timeout_s > 0 else None
    name = assign_name(standby)
    while deadline is None or time.monotonic() < deadline:
        order = read_order(slot_dir, name, ASSIGN_ENV)
        if order is not None:
            return order
        if not slot_dir.is_dir():
            return None
        time.sleep(POLL_S)
    return None


def run_target(target: list[str]) -> None:
    """Run the program as ``python TARGET...`` would, in this process (its SystemExit is its exit code)."""
    if target[0] == "-m":
        sys.argv = [target[1], *target[2:]]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(target)
        sys.path.insert(0, str(Path(target[0]).resolve().parent))  # as the interpreter does for a script
        runpy.run_path(target[0], run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    standby = os.environ.get(ENV_STANDBY, "")
    slot_dir = slot_dir_here()
    if not standby or not standby.replace("-", "").replace("_", "").isalnum() or slot_dir is None:
        print(f"supervisor standby: {ENV_STANDBY} (letters, digits, - and _) and {_paths.SLOT_DIR_ENV} must be set "
              "(fix: start it the way the supervisor does)", file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    loaded = preload(args.preload if args.preload is not None else list(DEFAULT_PRELOAD))
    ready = slot_dir / ready_name(standby)
    try:
        tmp = ready.with_name(f".{ready.name}.tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "preloaded": loaded}))
        os.chmod(tmp, 0o600)
        os.replace(tmp, ready)
    except OSError as err:
        print(f"supervisor standby: cannot write {ready}: {err}", file=sys.stderr)
        return EXIT_USAGE
    order = wait_for_assignment(slot_dir, standby, args.idle_timeout)
    try:
        ready.unlink()
    except OSError:
        pass
    if order is None:
        return EXIT_IDLE
    order.apply(os.environ)
    os.environ.pop(ENV_STANDBY, None)
    os.environ.pop("SUPERVISOR_HELPER_STEP", None)  # (the agents find it by its slot now, as the rank)
    print(f"supervisor standby: taking over rank {os.environ.get('RANK', '?')} in generation "
          f"{os.environ.get(ENV_GENERATION, '?')}", file=sys.stderr, flush=True)  # fmt: skip
    store_wait.wait_for_store()  # (no back-off sleep in the program's own connect: client/store_wait.py)
    run_target(args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
