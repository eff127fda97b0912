"""How often to checkpoint: Young/Daly's interval from the measured stall and the interruption rate. Pure.

A checkpoint costs the ranks a stall ``delta`` (the time the training loop is blocked: with an asynchronous save,
only the snapshot to host memory); an interruption costs the work since the last checkpoint plus a restart ``R``.
With interruptions arriving at random (a Poisson process of mean time between failures ``M``), the expected
fraction of the wall clock that becomes kept progress at interval ``tau`` is to first order

    goodput(tau) = 1 - delta/tau - tau/(2M) - R/M

which is best at Young's interval ``tau* = sqrt(2 delta M)``, where it is ``1 - sqrt(2 delta / M) - R/M``.
Daly's higher-order interval (J. T. Daly, 2006) corrects it when delta is not small against M, and his exponential
model gives the goodput of any interval without the first-order approximation. See docs/goodput.md.

``M`` is the campaign's own observed rate (interruptions that cost work, divided by the time they were observed
over) once it has seen enough of them; before that a configured prior; failing that a site prior scaled to the
number of nodes (Meta's RSC: 6.50 failures per 1,000 node-days). A prior gives way to what the campaign has seen
once that says more: ``n`` (< 3) interruptions in ``T`` seconds of running put the MTBF at no less than
``T / (n + 1)``, so a campaign whose faults the memory tier answers (they leave the filesystem interval's MTBF,
below) does not go on checkpointing at a pessimistic prior's pace for weeks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass
from typing import Any

# Meta RSC-1/RSC-2 (Kokolis et al., 2024): 6.50 job-affecting failures per 1,000 node-days.
SITE_FAILURES_PER_NODE_DAY = 6.50 / 1000.0
MIN_OBSERVED_INTERRUPTIONS = 3  # fewer than this and the campaign's own rate is mostly noise: use the prior
AUTO, OFF = "auto", "off"


class IntervalSettingError(ValueError):
    """``[run] checkpoint_interval`` is neither "auto", "off" nor a positive number of seconds."""


def parse_setting(value: object) -> str | float:
    """``"auto"``, ``"off"`` or seconds (> 0) as a float; anything else raises :class:`IntervalSettingError`."""
    if isinstance(value, str) and value.strip().lower() in (AUTO, OFF):
        return value.strip().lower()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int too large for a float
            seconds = math.inf
        if math.isfinite(seconds) and seconds > 0:
            return seconds
    raise IntervalSettingError(
        f"run.checkpoint_interval = {value!r}: expected \"auto\", \"off\" or a number of seconds > 0"
    )


def site_prior_mtbf_s(nodes: int, failures_per_node_day: float = SITE_FAILURES_PER_NODE_DAY) -> float:
    """Mean time between job-affecting failures of a job on ``nodes`` nodes, from a per-node-day rate."""
    if nodes < 1 or failures_per_node_day <= 0:
        raise ValueError("nodes must be >= 1 and the failure rate > 0")
    return 86400.0 / (failures_per_node_day * nodes)


def young_interval(delta_s: float, mtbf_s: float) -> float:
    """Young (1974): ``sqrt(2 delta M)``."""
    _check(delta_s, mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s)


def daly_interval(delta_s: float, mtbf_s: float) -> float:
    """Daly (2006), higher order: ``sqrt(2dM) (1 + sqrt(d/2M)/3 + (d/2M)/9) - d`` for ``d < 2M``, else ``M``."""
    _check(delta_s, mtbf_s)
    if delta_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = delta_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * delta_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta_s


def goodput_first_order(interval_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """``1 - delta/tau - tau/2M - R/M`` (clipped at 0): the expected kept fraction of the wall clock."""
    _check(delta_s, mtbf_s)
    if interval_s <= 0:
        raise ValueError("the interval must be > 0")
    return max(0.0, 1.0 - delta_s / interval_s - interval_s / (2.0 * mtbf_s) - restart_s / mtbf_s)


def best_goodput(delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """The Young/Daly optimum, first order: ``1 - sqrt(2 delta / M) - R / M``."""
    _check(delta_s, mtbf_s)
    return max(0.0, 1.0 - math.sqrt(2.0 * delta_s / mtbf_s) - restart_s / mtbf_s)


def goodput_daly(interval_s: float, delta_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's exponential model: ``tau / (M e^(R/M) (e^((tau+delta)/M) - 1))`` (failures also hit restarts)."""
    _check(delta_s, mtbf_s)
    if interval_s <= 0:
        raise ValueError("the interval must be > 0")
    return interval_s / (mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + delta_s) / mtbf_s))


def _check(delta_s: float, mtbf_s: float) -> None:
    if not (math.isfinite(delta_s) and delta_s >= 0):
        raise ValueError(f"the checkpoint stall must be a number of seconds >= 0, got {delta_s!r}")
    if not (math.isfinite(mtbf_s) and mtbf_s > 0):
        raise ValueError(f"the MTBF must be a positive number of seconds, got {mtbf_s!r}")


@dataclass(frozen=True)
class Advice:
    """The interval to ask the ranks for, with everything it was computed from (for ``report`` and ``status``)."""

    interval_s: float | None  # None: do not ask (setting "off"); FIRST_ASK_S under "auto" before a stall
    mode: str  # "auto" | "fixed" | "off"
    delta_s: float | None
    restart_s: float | None
    mtbf_s: float | None
    mtbf_source: str  # "observed" | "observed (lower bound)" | "configured prior" | "site prior" | "-"
    predicted_goodput: float | None  # first order, at interval_s
    optimum_goodput: float | None  # first order, at Young's interval

    def to_dict(self) -> dict[str, object]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


# Under "auto", before any checkpoint stall was measured: ask a first checkpoint this long after a launch's first
# step, so the stall is measured (and the run has a restart point) early instead of never (a program that leaves
# checkpoints to "auto" would otherwise never save). Five minutes: past the warm-up (compilation, the data
# loader's fill), short next to any MTBF, and one extra stall per campaign at most once it is measured.
FIRST_ASK_S = 300.0


def observed_mtbf_s(interruption_times: Iterable[float], observed_s: float) -> float | None:
    """The campaign's own MTBF: time observed over interruptions (None below MIN_OBSERVED_INTERRUPTIONS)."""
    n = len(interruption_times) if isinstance(interruption_times, Sized) else sum(1 for _ in interruption_times)
    if n < MIN_OBSERVED_INTERRUPTIONS or observed_s <= 0:
        return None
    return observed_s / n


def advise(
    setting: str | float,
    *,
    delta_s: float | None,
    restart_s: float | None,
    nodes: int,
    interruption_times: Iterable[float] = (),
    observed_s: float = 0.0,
    prior_mtbf_s: float | None = None,
) -> Advice:
    """The function the supervisor loop calls: the interval for ``setting`` and why.

    ``delta_s``: the measured checkpoint stall (median of recent checkpoints), None until one was measured;
    ``restart_s``: the measured restart cost (interruption to first resumed step), None if none yet (taken as 0);
    ``interruption_times``/``observed_s``: the interruptions that cost work and the running time they were seen in.
    """
    setting = parse_setting(setting)
    times = list(interruption_times)
    mtbf = observed_mtbf_s(times, observed_s)
    source = "observed"
    if mtbf is None and prior_mtbf_s:
        mtbf, source = prior_mtbf_s, "configured prior"
    if mtbf is None:
        mtbf, source = site_prior_mtbf_s(max(1, nodes)), "site prior"
    if source != "observed" and observed_s / (len(times) + 1) > mtbf:  # the campaign outlived its prior
        mtbf, source = observed_s / (len(times) + 1), "observed (lower bound)"
    restart = restart_s or 0.0
    if setting == OFF:
        return Advice(None, "off", delta_s, restart_s, mtbf, source, None, _optimum(delta_s, restart, mtbf))
    if setting == AUTO:
        if delta_s is None:  # a first checkpoint, to measure the stall
            return Advice(FIRST_ASK_S, "auto", None, restart_s, mtbf, source, None, None)
        interval = max(1.0, daly_interval(delta_s, mtbf))
        return Advice(interval, "auto", delta_s, restart_s, mtbf, source,
                      goodput_first_order(interval, delta_s, restart, mtbf), best_goodput(delta_s, restart, mtbf))  # fmt: skip
    assert isinstance(setting, float)
    predicted = None if delta_s is None else goodput_first_order(setting, delta_s, restart, mtbf)
    return Advice(setting, "fixed", delta_s, restart_s, mtbf, source, predicted, _optimum(delta_s, restart, mtbf))


def _optimum(delta_s: float | None, restart_s: float, mtbf_s: float) -> float | None:
    return None if delta_s is None else best_goodput(delta_s, restart_s, mtbf_s)


def due(advice: Advice, since_last_checkpoint_s: float) -> bool:
    """Whether the ranks should be asked to checkpoint now (what ``should_checkpoint()`` answers)."""
    return advice.interval_s is not None and since_last_checkpoint_s >= advice.interval_s


@dataclass(frozen=True)
class Measured:
    """The advice's inputs as the journal shows them (what ``report`` and ``status`` display with the advice)."""

    delta_s: float | None  # median checkpoint stall; None until a checkpoint carried one
    restart_s: float | None  # median interruption -> next launch; None until a relaunch
    interruption_times: tuple[float, ...]  # interruptions that cost work (not completion or a cancel)
    observed_s: float  # time the training step was running


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


class IntervalInputs:
    """The advice's inputs folded from the journal (a view of ``campaign_state.fold``). The stall is the median of
    the ``checkpoint_stall`` events (the slowest rank's time in the checkpoint phase, measured by the client), else
    of checkpoint events' ``stall_s`` or ``duration_s``; the restart runs from an interruption to the next
    launch's first step (``step_progress``), else to the next ``step_launched``. An interruption whose next launch
    resumed from node memory (``resume_tier`` "memory") in the same Slurm run is left out of the MTBF: the
    filesystem interval is planned for the faults that lose node memory (both a node and its buddy, a requeue, a
    stop). A requeued job that resumed from the snapshot flushed before the requeue still counts: that flush can
    fail (the buddy lost too, the copy not done in time), and the filesystem checkpoint is then what is left —
    unless the interrupted launch had its snapshots persisted while it ran (``memory_persist``): had the flush
    failed, the persisted copy would have been there, as recent as the persist interval."""

    def __init__(self) -> None:
        self.stalls: list[float] = []
        self.measured_stalls: list[float] = []
        self.restarts: list[float] = []
        self.pending_from: float | None = None  # an interruption whose next launch has not stepped yet
        self.times: list[float] = []
        self.observed = 0.0
        self.running_since: float | None = None
        self.waiting_since: float | None = None
        self.left_nodes = False  # the Slurm run ended since the newest interruption (a requeue, a stop)
        self.persisted = False  # the running launch had a snapshot persisted (memory_persist)
        self.persisted_at_fault = False  # ... the interrupted one

    def apply(self, e: Mapping[str, Any]) -> None:
        t, kind = e.get("t"), e.get("type")
        if not isinstance(t, (int, float)) or isinstance(t, bool):
            return
        if kind == "step_launched":
            self.pending_from = self.waiting_since
            if self.waiting_since is not None and e.get("resume_tier") == "memory" and self.times \
                    and self.times[-1] == self.waiting_since \
                    and (not self.left_nodes or self.persisted_at_fault):  # fmt: skip
                # resumed from node memory: that fault did not cost the filesystem interval's work, so it does
                # not count toward the MTBF the filesystem interval is planned for (docs/checkpoints.md)
                self.times.pop()
            if self.waiting_since is not None:
                self.restarts.append(max(0.0, t - self.waiting_since))  # replaced by the first step's time if any
                self.waiting_since = None
            self.running_since = float(t)
            self.persisted = self.persisted_at_fault = False
        elif kind == "memory_persist" and isinstance(e.get("step"), int):
            self.persisted = True
        elif kind == "step_progress" and self.pending_from is not None:
            self.restarts[-1] = max(0.0, t - self.pending_from)
            self.pending_from = None
        elif kind == "checkpoint_stall":
            value = e.get("stall_s")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                self.measured_stalls.append(float(value))
        elif kind == "checkpoint_committed":
            value = e.get("stall_s", e.get("duration_s"))
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
                self.stalls.append(float(value))
        elif kind in ("interruption", "attempt_ended", "campaign_ended"):
            if self.running_since is not None:
                self.observed += max(0.0, t - self.running_since)
                self.running_since = None
            cls = e.get("class") if kind == "interruption" else None
            self.pending_from = None
            self.left_nodes = kind == "attempt_ended" or (self.left_nodes and kind != "interruption")
            if kind == "interruption" and cls not in ("completed", "cancelled"):
                if cls != "straggler":  # a swap checkpoints first: it costs a restart, no work
                    self.times.append(float(t))
                self.waiting_since = float(t)
                self.persisted_at_fault = self.persisted
            elif kind == "campaign_ended":
                self.waiting_since = None

    def measured(self, now: float) -> Measured:
        observed = self.observed + (max(0.0, now - self.running_since) if self.running_since is not None else 0.0)
        return Measured(_median(self.measured_stalls or self.stalls), _median(self.restarts), tuple(self.times),
                        observed)  # fmt: skip


def advise_measured(setting: str | float, m: Measured, nodes: int, prior_mtbf_s: float | None = None) -> Advice:
    """:func:`advise` with its inputs as the journal measured them (``CampaignState.interval.measured(now)``: the
    call ``report``/``status`` and the supervisor loop make)."""
    return advise(setting, delta_s=m.delta_s, restart_s=m.restart_s, nodes=nodes,
                  interruption_times=m.interruption_times, observed_s=m.observed_s, prior_mtbf_s=prior_mtbf_s)  # fmt: skip
