"""Campaign configuration: one TOML file, validated up front so a typo fails at submit time, not hours later.

Parsed once into one typed :class:`Config`: ``[submit]``, ``[run]`` and ``[alerts]`` are defined here; ``[detect]``,
``[policy]``, ``[ledger]``, ``[log_signatures]``, ``[metrics]``, ``[health]`` and ``[preflight]`` are parsed by the
modules that own their meaning (each a typed value with its own range checks, see docs/configuration.md), and
every reader gets the typed value. The campaign records the file's tables (``Config.to_dict``), with the
checkpoint directory resolved once, absolute (:func:`with_checkpoint_dir`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisor.decisions.detect import DetectConfig
from supervisor.decisions.ledger import LedgerConfig
from supervisor.decisions.log_signatures import DEFAULT_LOG_SIGNATURES, LogSignature, signatures_from_table
from supervisor.decisions.policy import PolicyConfig
from supervisor.errors import ConfigError
from supervisor.health.checks import Limits
from supervisor.health.preflight import PreflightConfig
from supervisor.metrics import MetricsConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib


@dataclasses.dataclass(frozen=True)
class SubmitConfig:
    # Seconds before the time limit at which Slurm sends USR1 to the batch step (sbatch --signal=B:USR1@T),
    # leaving time to checkpoint and requeue. Slurm may deliver it up to 60 s early.
    signal_lead_s: int = 120
    job_name: str = "supervise"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    # Extra arguments for the training step's srun (e.g. ["--cpu-bind=none"]).
    srun_args: tuple[str, ...] = ()
    # Where the training writes checkpoints; the supervisor resumes from the newest valid one found here.
    checkpoint_dir: str = ""
    # Resume from checkpoints this campaign did not sign (no manifest, single .ckpt/.pt files, other runs'
    # manifests): only ever from a private root (owned by the user, not group/other-writable); false: never.
    adopt_foreign_checkpoints: bool = True
    # How long ranks get to finish a requested checkpoint before the step is stopped anyway.
    checkpoint_grace_s: float = 60.0
    # Node agent sampling and the supervisor's decision loop.
    agent_interval_s: float = 0.25
    summary_interval_s: float = 1.0
    loop_interval_s: float = 0.5
    # Allocation nodes kept out of the training step, to replace a blamed node without requeueing.
    spare_nodes: int = 0
    # When the spares are used up, the training goes on with as few as this many nodes (it must cope with a
    # smaller world); 0: never fewer than it started with (the job is requeued instead).
    min_nodes: int = 0
    # Our own node-loss verdict (docs/node-loss.md): a node whose agent and ranks are silent this long at most
    # (the timeout is learned from the beat interval, within [min(2, this), this]) is probed; a probe (srun
    # --overlap -w NODE true) without an answer within node_probe_timeout_s confirms the loss.
    node_loss_max_s: float = 5.0
    node_probe_timeout_s: float = 2.0
    # The agents' failsafe (docs/node-loss.md): this long without a control frame from the supervisor, the agent
    # on the lowest-named surviving node probes the batch host and, if it is gone too, requeues the job without
    # it (or cancels it when the requeue is refused). 0: off.
    failsafe_timeout_s: float = 10.0
    # "auto" (Young/Daly from the measured stall and MTBF), "off", or seconds: see docs/goodput.md.
    checkpoint_interval: str | float = "off"
    # The MTBF "auto" assumes until this campaign saw 3 interruptions; 0: the site prior (Meta RSC's rate).
    mtbf_prior_s: float = 0.0
    # Seconds between the node agents' health checks (GPUs, filesystems, /dev/shm, memory, clock; the first at
    # start): a fatal finding blames the node (docs/health.md). 0: no checks.
    health_interval_s: float = 30.0
    # The memory tier (docs/checkpoints.md): ranks that use the project's saver snapshot their state into node
    # memory and a relaunch resumes from the newest complete snapshot. "auto" (the cadence measured: the copies
    # take at most 2 % of the training's time), "off", or every N steps.
    memory_snapshots: str | int = "auto"
    # While the training runs, the node agents copy the newest complete memory snapshot to the campaign directory
    # (docs/checkpoints.md, persisting): a fault the memory tier cannot answer loses at most this much. "auto"
    # (every 60 s, less often when a copy is slow: the copies take at most 10 % of the time), "off", or seconds.
    memory_persist: str | float = "auto"
    # Warm restart (docs/launch.md): ranks of a program that wraps its training in client.restartable restart in
    # their processes, only the dead ones started again. "auto": from the launch after one whose every rank was
    # seen restartable (a launch's srun must be told beforehand not to end the step when one task dies); "on":
    # from the first launch (the program is known to use it); "off": every restart is a cold relaunch.
    warm_restart: str = "auto"
    # Standby ranks for warm restarts (docs/launch.md): processes started ahead of need on each node of a warm
    # launch (Python up, torch imported) that take over a dead rank instead of a new srun. "auto": one per node
    # for a plain `python SCRIPT` / `python -m MODULE` command; "off"; or that many per node (0 to 64).
    standbys: str | int = "auto"


@dataclasses.dataclass(frozen=True)
class AlertConfig:
    # L2+ alerts: POSTed as JSON to this URL (if set) and/or given on stdin to this command (argument list).
    webhook_url: str = ""
    command: tuple[str, ...] = ()
    # Any services apprise knows (optional extra `alerts`), e.g. ["mailto://...", "msteams://..."].
    apprise_urls: tuple[str, ...] = ()
    # Alerts of tier >= escalate_tier also go here (e.g. a pager).
    escalation_webhook_url: str = ""
    escalation_command: tuple[str, ...] = ()
    escalate_tier: str = "L3"
    # The same (class, nodes) alert is sent at most once per cooldown (repeats are counted in the next one).
    cooldown_s: float = 300.0
    timeout_s: float = 5.0  # per delivery try
    retries: int = 3  # tries per sink
    queue_size: int = 100  # alerts waiting for the sender thread; more are dropped (and logged)


@dataclasses.dataclass(frozen=True)
class SiteConfig:
    # The site-wide node ledger (docs/site.md): before each launch the campaign asks it which nodes to leave out,
    # and posts its own node verdicts to it. Off unless url is set; the service down never stops a campaign.
    url: str = ""  # e.g. "http://admin1:8787"
    token_file: str = ""  # USER:TOKEN, 0600, as `supervise site token` wrote it
    timeout_s: float = 5.0  # per request


# The delegated sections' parsers: table -> typed value.
_PARSERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "detect": DetectConfig.from_mapping, "policy": PolicyConfig.from_mapping, "ledger": LedgerConfig.from_mapping,
    "log_signatures": signatures_from_table, "metrics": MetricsConfig.from_mapping, "health": Limits.from_mapping,
    "preflight": PreflightConfig.from_mapping,
}  # fmt: skip
_DELEGATED = ("detect", "policy", "ledger", "log_signatures", "metrics", "health", "preflight")


@dataclasses.dataclass(frozen=True)
class Config:
    """The campaign's settings, every section typed. ``tables``: the delegated sections as the file wrote them
    (what ``to_dict`` records in campaign.json, so the next run parses the same file again)."""

    submit: SubmitConfig = SubmitConfig()
    run: RunConfig = RunConfig()
    alerts: AlertConfig = AlertConfig()
    site: SiteConfig = SiteConfig()
    detect: DetectConfig = DetectConfig()
    policy: PolicyConfig = PolicyConfig()
    ledger: LedgerConfig = LedgerConfig()
    log_signatures: tuple[LogSignature, ...] = DEFAULT_LOG_SIGNATURES  # the user's first, then the built-in ones
    metrics: MetricsConfig = MetricsConfig()
    health: Limits = Limits()
    preflight: PreflightConfig = PreflightConfig()
    tables: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        own = json.loads(json.dumps({name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS},
                                    default=list))  # fmt: skip
        return {**own, **{name: dict(self.tables.get(name, {})) for name in _DELEGATED}}


_SECTIONS = {"submit": SubmitConfig, "run": RunConfig, "alerts": AlertConfig, "site": SiteConfig}


def _same_type(value: Any, default: Any) -> bool:
    """TOML types vs the default's type; an int is fine where a float is expected, a bool never is a number."""
    if isinstance(value, bool) or isinstance(default, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))


DAY_S = 86400.0
# Allowed ranges of the keys defined here (documented in docs/configuration.md). Times are finite and
# positive: 0 or nan would stop an agent from ever sampling again or leave the training unwatched.
BOUNDS: dict[str, tuple[float, float]] = {
    "submit.signal_lead_s": (1, 65535),  # sbatch --signal takes at most 65535 s
    "run.checkpoint_grace_s": (1.0, DAY_S),
    "run.agent_interval_s": (0.01, 60.0),
    "run.summary_interval_s": (0.05, 600.0),
    "run.loop_interval_s": (0.05, 60.0),
    "run.spare_nodes": (0, 4096),
    "run.health_interval_s": (0.0, DAY_S),  # 0: off; else at least 1 s (checked in from_mapping)
    "run.min_nodes": (0, 1_000_000),
    "run.node_loss_max_s": (0.5, 600.0),
    "run.node_probe_timeout_s": (0.5, 60.0),
    "run.failsafe_timeout_s": (0.0, 3600.0),
    "run.mtbf_prior_s": (0.0, 100 * 365 * DAY_S),  # 0: the site prior; nan or inf broke supervise report
    "alerts.cooldown_s": (0.0, 7 * DAY_S),
    "alerts.timeout_s": (0.0, 300.0),
}
# Delegated sections ([detect], [policy], [ledger]): their modules check meaning; here every number is finite
# and within an absurdity bound, and every time (a key ending in _s) is positive (0 allowed for backoff).
TIME_MAX_S = 30 * DAY_S
NUMBER_MAX = 1e9
ZERO_OK_TIMES = frozenset({"policy.backoff_base_s", "policy.backoff_max_s", "run.mtbf_prior_s"})
JOB_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _range_error(source: str, key: str, value: Any, allowed: str) -> ConfigError:
    shown = repr(value) if isinstance(value, float) else value
    return ConfigError(f"{source}: {key} = {shown} is out of range (allowed: {allowed})",
                       f"set {key} within that range (see docs/configuration.md)")


def _finite(value: float) -> bool:
    """math.isfinite without its OverflowError on ints too large for a float (they are simply out of range)."""
    return isinstance(value, int) or math.isfinite(value)


def _check_bounds(key: str, value: Any, source: str) -> None:
    if key not in BOUNDS or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    low, high = BOUNDS[key]
    if not _finite(value) or not low <= value <= high:
        raise _range_error(source, key, value, f"{low:g} <= value <= {high:g}")


def _check_numbers(prefix: str, table: Any, source: str, depth: int = 0) -> None:
    """Finite, bounded numbers in a delegated section (nested tables included), positive times."""
    if not isinstance(table, Mapping) or depth > 4:
        return
    for key, value in table.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            _check_numbers(name, value, source, depth + 1)
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(key, str) and key.endswith("_s"):
            zero_ok = name in ZERO_OK_TIMES
            ok = _finite(value) and (value >= 0 if zero_ok else value > 0) and value <= TIME_MAX_S
            if not ok:
                raise _range_error(source, name, value, f"0 {'<=' if zero_ok else '<'} value <= {TIME_MAX_S:g}")
        elif not _finite(value) or abs(value) > NUMBER_MAX:
            raise ConfigError(f"{source}: {name} = {value!r} is out of range (allowed: finite, |value| <= "
                              f"{NUMBER_MAX:g})", f"set {name} to a finite value (see docs/configuration.md)")


def _check_text(key: str, value: str, source: str) -> None:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{source}: {key} = {value!r} contains a control character",
                          "remove newlines, tabs and other control characters")
    if key == "submit.job_name" and not JOB_NAME.fullmatch(value):
        raise ConfigError(f"{source}: submit.job_name = {value!r} is not allowed (allowed: 1 to 128 of "
                          "A-Z a-z 0-9 . _ -)", 'use a name like "llama-7b"')


def _build(section: str, cls: type, values: Mapping[str, Any], source: str) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: [{section}] must be a table", f"write it as [{section}] with key = value lines")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{source}: unknown key {section}.{key}", f"use one of: {known}")
        if (section, key) == ("run", "checkpoint_interval"):
            kwargs[key] = _checkpoint_interval(value, source)
            continue
        if (section, key) == ("run", "memory_snapshots"):
            kwargs[key] = _memory_snapshots(value, source)
            continue
        if (section, key) == ("run", "memory_persist"):
            kwargs[key] = _memory_persist(value, source)
            continue
        if (section, key) == ("run", "standbys"):
            kwargs[key] = _standbys(value, source)
            continue
        if (section, key) == ("run", "warm_restart") and value not in WARM_RESTART_VALUES:
            raise ConfigError(f"{source}: run.warm_restart = {value!r} is not allowed (allowed: "
                              f"{', '.join(repr(v) for v in WARM_RESTART_VALUES)})", 'e.g. warm_restart = "auto"')
        default = fields[key].default
        if isinstance(default, tuple):
            if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise ConfigError(f"{source}: {section}.{key} must be a list of strings", f'e.g. {key} = ["a", "b"]')
            value = tuple(value)
        elif not _same_type(value, default):
            raise ConfigError(
                f"{source}: {section}.{key} = {value!r} has the wrong type",
                f"use a {type(default).__name__} like {default!r}",
            )
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > NUMBER_MAX:
            raise _range_error(source, f"{section}.{key}", f"{str(value)[:12]}... ({len(str(abs(value)))} digits)",
                               f"|value| <= {NUMBER_MAX:g}")  # before float(): a 401-digit int overflows it
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"{source}: {section}.{key} = {value!r} is negative", "use a value >= 0")
        _check_bounds(f"{section}.{key}", value, source)
        for text in (value if isinstance(value, tuple) else (value,)):
            if isinstance(text, str):
                _check_text(f"{section}.{key}", text, source)
        kwargs[key] = float(value) if isinstance(default, float) else value
    return cls(**kwargs)


def _checkpoint_interval(value: Any, source: str) -> str | float:
    from supervisor.decisions.checkpoint_interval import IntervalSettingError, parse_setting

    try:
        return parse_setting(value)
    except IntervalSettingError as err:
        raise ConfigError(f"{source}: {err}", 'e.g. checkpoint_interval = "auto" or 1800') from None


WARM_RESTART_VALUES = ("auto", "on", "off")


def _memory_snapshots(value: Any, source: str) -> str | int:
    if value in ("auto", "off"):
        return str(value)
    if type(value) is int and 1 <= value <= 1_000_000:
        return value
    raise ConfigError(f"{source}: run.memory_snapshots = {value!r} is not allowed (allowed: \"auto\", \"off\" or "
                      "a whole number of steps from 1 to 1000000)", 'e.g. memory_snapshots = "auto"')


def _memory_persist(value: Any, source: str) -> str | float:
    from supervisor.decisions.memory_persist import PersistSettingError, parse_setting

    try:
        return parse_setting(value)
    except PersistSettingError as err:
        raise ConfigError(f"{source}: {err}", 'e.g. memory_persist = "auto" or 120') from None


def _standbys(value: Any, source: str) -> str | int:
    if value in ("auto", "off"):
        return str(value)
    if type(value) is int and 0 <= value <= 64:
        return value
    raise ConfigError(f"{source}: run.standbys = {value!r} is not allowed (allowed: \"auto\", \"off\" or a whole "
                      "number of standby processes per node from 0 to 64)", 'e.g. standbys = "auto"')


def from_mapping(data: Mapping[str, Any], source: str = "config") -> Config:
    """Validate a parsed config and type every section; every problem is a ConfigError naming the key and the
    fix."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the configuration is not a table", "see docs/configuration.md")
    known = set(_SECTIONS) | set(_DELEGATED)
    for section in data:
        if section not in known:
            raise ConfigError(f"{source}: unknown section [{section}]", f"use one of: {', '.join(sorted(known))}")
    parts = {name: _build(name, cls, data.get(name, {}), source) for name, cls in _SECTIONS.items()}
    typed: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {}
    for name in _DELEGATED:
        table = data.get(name, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: [{name}] must be a table", f"write it as [{name}] with key = value lines")
        _check_numbers(name, table, source)
        try:
            typed[name] = _PARSERS[name](table)
        except Exception as err:  # noqa: BLE001 - any parser failure (e.g. weights = 5: AttributeError) is bad input
            raise ConfigError(f"{source}: [{name}]: {str(err)[:300] or err.__class__.__name__}",
                              "see docs/configuration.md for the keys and their ranges") from None
        tables[name] = dict(table)
    config = Config(**parts, **typed, tables=tables)
    from supervisor.alerts import validate_config

    try:
        validate_config(config.alerts)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}", "see docs/configuration.md, [alerts]") from None
    if 0 < config.run.health_interval_s < 1:
        raise ConfigError(f"{source}: run.health_interval_s = {config.run.health_interval_s!r} is out of range "
                          "(allowed: 0 (off) or 1 <= value <= 86400)", "a check every 30 s is the default")
    site = config.site
    if site.url and (not site.url.startswith(("http://", "https://")) or not site.token_file):
        raise ConfigError(f"{source}: [site] url = {site.url!r} needs an http:// or https:// URL and a token_file",
                          'e.g. url = "http://admin1:8787" and token_file = "~/alice.site-token"')
    if not 0 < site.timeout_s <= 60:
        raise ConfigError(f"{source}: site.timeout_s = {site.timeout_s!r} is out of range (0 < t <= 60)",
                          "the default is 5")
    if config.submit.signal_lead_s < 1:
        raise ConfigError(f"{source}: submit.signal_lead_s must be >= 1", "give the run time to checkpoint, e.g. 120")
    return config


def with_checkpoint_dir(cfg: Config, explicit: str | None, command: Sequence[str], cwd: str) -> Config:
    """``cfg`` with ``run.checkpoint_dir`` resolved, absolute, once, when the campaign is created (the flag, the
    config, then the training argv's usual flags; relative to ``cwd``, where the training runs), so the campaign
    records it and every relaunch resumes from the newest valid checkpoint found there. "" when nothing names
    one (resume is off)."""
    from supervisor.checkpoint.locate import resolve_checkpoint_dir

    found = resolve_checkpoint_dir(explicit, cfg.run.checkpoint_dir, command, cwd)
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, checkpoint_dir=found))


def load(path: str | Path | None) -> Config:
    """Load and validate a TOML config file; ``None`` gives the defaults."""
    if path is None:
        return Config()
    path = Path(path)
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {err.start})",
                          "save it as UTF-8 (TOML files are UTF-8)") from None
    except RecursionError:
        raise ConfigError(f"config file {path} nests too deeply", "flatten the tables") from None
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist", "check the --config path") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}", "fix the syntax at that line") from None
    except ValueError as err:  # tomllib's int(): a number of more than 4,300 digits
        raise ConfigError(f"config file {path} holds a value TOML cannot read ({str(err)[:120]})",
                          "write numbers of a sensible size") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}", "check its permissions") from None
    return from_mapping(data, str(path))
