"""``supervise simulate``: a long campaign under a failure trace, naive requeue vs this supervisor vs Young/Daly."""

from __future__ import annotations

import argparse
import json
import os

HELP = "simulate a long campaign under a failure trace: naive Slurm requeue vs this supervisor vs Young/Daly"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the campaign and its faults")
    g.add_argument("--gpus", type=int, default=16_384, help="GPUs in the job (default: Llama 3's 16,384)")
    g.add_argument("--gpus-per-node", type=int, default=8)
    g.add_argument("--days", type=float, default=54.0, help="wall-clock length (default 54)")
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--trace", metavar="FILE.csv", help="faults as time_s,class,node lines instead of the Llama 3 mix")
    g.add_argument("--rate-scale", type=float, default=1.0, help="multiply the Llama 3 failure rate")
    g.add_argument("--hang-fraction", type=float, default=0.2, help="faults that hang instead of crashing")
    g.add_argument("--bad-node-p", type=float, default=1.0,
                   help="a hardware fault leaves its node broken (recurring there until it is taken out)")
    g.add_argument("--recur-h", type=float, default=4.0, help="a broken node in use fails again after (mean, h)")
    s = p.add_argument_group("this supervisor (defaults: the figures bench/ measures)")
    s.add_argument("--stall", type=float, default=1.0, help="checkpoint stall, s (async snapshot)")
    s.add_argument("--write", type=float, default=30.0, help="async checkpoint write until committed, s")
    s.add_argument("--interval", default="auto", help='"auto" (Young/Daly) or seconds between checkpoints')
    s.add_argument("--restart", type=float, default=60.0, help="relaunch to first resumed step, s")
    s.add_argument("--detect-hang", type=float, default=3.3, help="hang detection, s")
    s.add_argument("--detect-crash", type=float, default=1.2, help="crash detection, s")
    s.add_argument("--spares", type=int, default=16, help="spare nodes in the allocation")
    s.add_argument("--preflight", type=float, default=0.0, help="node health check before each launch, s (0: none)")
    s.add_argument("--memory-tier", action="store_true",
                   help="in-memory snapshots replicated to a buddy node: faults answered in the allocation lose "
                        "only the work since the newest snapshot (docs/goodput.md)")
    s.add_argument("--memory-stall", type=float, default=0.03,
                   help="with --memory-tier: the training blocked per snapshot, s (default 0.03: a 350 MB state "
                        "per GPU at the copy rate bench_memory_snapshot measures)")
    s.add_argument("--persist-every", default="auto", metavar="S",
                   help='with --memory-tier: the agents persist the newest snapshot to the filesystem every S seconds '
                        'while the job runs; "auto": 10 x --write (the copies take at most 10 %% of the time), '
                        '"off" (docs/goodput.md)')
    s.add_argument("--warm-restart", type=float, default=None, metavar="S",
                   help="a program in client.restartable: relaunches in the allocation that a warm restart carries "
                        "out cost S seconds instead of --restart (docs/goodput.md: 20 at 16,384 GPUs)")
    s.add_argument("--config", metavar="FILE.toml", help="take [policy] and [ledger] from this supervisor config")
    n = p.add_argument_group("naive Slurm requeue and both")
    n.add_argument("--naive-stall", type=float, default=30.0, help="synchronous checkpoint stall, s")
    n.add_argument("--naive-interval", type=float, default=3600.0, help="fixed checkpoint interval, s")
    n.add_argument("--naive-restart", type=float, default=300.0, help="requeued job start to first step, s")
    n.add_argument("--hang-timeout", type=float, default=1800.0, help="collective timeout that ends a hang, s")
    n.add_argument("--queue", type=float, default=120.0, help="requeue wait for a new allocation, s (both)")
    n.add_argument("--operator", type=float, default=3600.0, help="policy stopped the campaign: until resubmitted, s")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the comparison as JSON")
    o.add_argument("--plot", metavar="FILE", help="also draw the comparison (.png/.svg need matplotlib; .html)")
    o.add_argument("--journal", metavar="DIR", help="also write (b)'s run as a campaign directory: "
                   "`supervise report DIR --plot t.png` draws it")


def _persist_every(value: str, write_s: float) -> float | None:
    """``--persist-every``: seconds, "auto" (the driver's rule: a copy, taken as ``--write``, at most 10 % of the
    time, and no more often than once a minute) or "off"."""
    from supervisor.decisions import memory_persist

    if value == "off":
        return None
    if value == "auto":
        return memory_persist.every_s("auto", write_s)
    seconds = float(value)
    if not seconds > 0:
        raise ValueError("--persist-every must be 'auto', 'off' or seconds > 0")
    return seconds


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from supervisor.errors import UsageError
    from supervisor.simulate import compare, engine, trace

    try:
        world = engine.World(args.gpus, args.gpus_per_node, args.days, args.seed, _fraction(args.hang_fraction,
                             "--hang-fraction"), _fraction(args.bad_node_p, "--bad-node-p"), args.recur_h * 3600.0)  # fmt: skip
        if args.trace:
            faults = [f for f in trace.read_csv(args.trace) if f.t < world.horizon_s]
        else:
            faults = trace.llama3(args.seed, args.gpus, args.days, args.gpus_per_node, args.rate_scale)
        for name in ("stall", "write", "restart", "detect_hang", "detect_crash", "preflight", "naive_stall",
                     "naive_restart", "hang_timeout", "queue", "operator", "recur_h", "memory_stall",
                     "warm_restart"):  # fmt: skip
            if (getattr(args, name) or 0) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if args.naive_interval <= 0 or args.days <= 0 or args.gpus < 1 or args.gpus_per_node < 1 or args.spares < 0:
            raise ValueError("--naive-interval and --days must be > 0, --gpus and --gpus-per-node >= 1, --spares >= 0")
        interval = None if args.interval == "auto" else float(args.interval)
        persist = _persist_every(args.persist_every, args.write)
        if interval is not None and interval <= 0:
            raise ValueError("--interval must be 'auto' or seconds > 0")
        if args.plot:  # a bad picture name fails before the simulation, not after
            from supervisor.plot import PlotError, check_target

            try:
                check_target(args.plot)
            except PlotError as err:
                raise UsageError(err.problem, err.fix) from None
    except trace.TraceError as err:
        raise UsageError(str(err), "see docs/goodput.md for the trace format") from None
    except ValueError as err:
        raise UsageError(f"simulate: {err}", "see `supervise simulate --help`") from None
    sup = engine.supervised(args.stall, args.write, interval, args.restart, args.queue, args.detect_hang,
                            args.detect_crash, preflight_s=args.preflight, spares=args.spares)  # fmt: skip
    policy_config, ledger_config = _decision_configs(args.config)
    sup = replace(sup, operator_s=args.operator, policy_config=policy_config, ledger_config=ledger_config,
                  memory_stall_s=args.memory_stall if args.memory_tier else None,
                  memory_persist_s=persist if args.memory_tier else None,
                  warm_restart_s=args.warm_restart)  # fmt: skip
    naive = replace(engine.naive(args.naive_stall, args.naive_interval, args.naive_restart, args.queue,
                                 args.hang_timeout), operator_s=args.operator)  # fmt: skip
    result = compare.compare(world, faults, naive, sup)
    if args.plot:
        from supervisor.plot import PlotError, write_comparison

        try:
            write_comparison(result.to_dict(), args.plot)
        except PlotError as err:
            raise UsageError(err.problem, err.fix) from None
    if args.journal:
        _write_journal(args.journal, world, sup, faults)
    print(json.dumps(result.to_dict(), indent=2) if args.json else compare.render_text(result))
    return 0


def _write_journal(target: str, world, strategy, faults) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from supervisor import campaign, journal
    from supervisor.simulate import engine
    from supervisor.simulate.sim_journal import SimJournal

    events: list[dict] = []
    engine.simulate(world, strategy, faults, SimJournal(events.append))
    paths = campaign.create(Path(target), campaign.CampaignSpec(command=("simulated",)), "# simulated campaign\n")
    fd = os.open(paths.journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(b"".join(journal.encode(e, e["t"]) for e in events))


def _fraction(value: float, flag: str) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{flag} must be between 0 and 1, got {value}")
    return value


def _decision_configs(path: str | None):  # type: ignore[no-untyped-def]
    """[policy] and [ledger] of a supervisor config file (validated like `supervise submit` does), or defaults."""
    from supervisor.decisions.ledger import LedgerConfig
    from supervisor.decisions.policy import PolicyConfig

    if not path:
        return PolicyConfig(), LedgerConfig()
    from supervisor import config

    loaded = config.load(path)
    return loaded.policy, loaded.ledger
