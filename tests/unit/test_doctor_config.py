"""`supervise doctor`'s judgement of Slurm's running configuration, on a recorded `scontrol show config` (the
local 22.05 cluster) with one setting changed at a time."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm.parse import ParseError
from slurm.parse_config import parse_scontrol_config, parse_scontrol_partitions, seconds
from supervisor.health.slurm_config import FAIL, OK, WARN, judge, worst

FIXTURES = Path(__file__).parent / "fixtures"
CONFIG = (FIXTURES / "scontrol_show_config_22.05.txt").read_text()
PARTITIONS = (FIXTURES / "scontrol_show_partition_22.05.txt").read_text()


def _changed(key: str, value: str) -> str:
    lines = CONFIG.splitlines()
    hit = [i for i, line in enumerate(lines) if line.split("=")[0].strip() == key]
    assert hit, key
    lines[hit[0]] = f"{key:<23} = {value}"
    return "\n".join(lines)


def _by_setting(config_text: str, partitions: str = PARTITIONS, **kw: float) -> dict[str, object]:
    findings = judge(parse_scontrol_config(config_text), parse_scontrol_partitions(partitions), **kw)
    return {f.setting: f for f in findings}


def test_recorded_local_cluster_config() -> None:
    parsed = parse_scontrol_config(CONFIG)
    assert parsed["KillWait"] == "5 sec" and parsed["SLURM_VERSION"] == "22.05.8"
    found = _by_setting(CONFIG)
    assert found["PreemptMode"].status == OK
    assert found["KillWait"].status == WARN and "KillWait=30" in found["KillWait"].fix
    assert found["GraceTime (partition batch)"].status == WARN  # 10 s < the default checkpoint grace of 60 s
    assert "GraceTime (partition urgent)" not in found  # PreemptMode=OFF there: nothing to judge
    assert found["HealthCheckProgram"].status == WARN
    assert worst(list(found.values())) == WARN  # nothing is broken: exit 0 without --strict


@pytest.mark.parametrize(("key", "value", "setting", "status", "fix_says"), [
    ("PreemptMode", "SUSPEND,GANG", "PreemptMode", FAIL, "PreemptMode=REQUEUE"),
    ("PreemptMode", "CANCEL", "PreemptMode", WARN, "PreemptMode=REQUEUE"),
    ("SlurmctldParameters", "(null)", "SlurmctldParameters", WARN, "preempt_send_user_signal"),
    ("KillWait", "2 sec", "KillWait", FAIL, "KillWait=30"),
    ("KillWait", "30 sec", "KillWait", OK, ""),
    ("MinJobAge", "5 sec", "MinJobAge", WARN, "MinJobAge=300"),
    ("SlurmdTimeout", "0 sec", "SlurmdTimeout", WARN, "SlurmdTimeout=300"),
    ("SlurmdTimeout", "1200 sec", "SlurmdTimeout", WARN, "SlurmdTimeout=300"),
    ("OverTimeLimit", "UNLIMITED", "OverTimeLimit", WARN, "OverTimeLimit=0"),
    ("SLURM_VERSION", "20.02.7", "SLURM_VERSION (--overlap)", FAIL, "20.11"),
    ("HealthCheckProgram", "/usr/local/sbin/supervise-health", "HealthCheckProgram", WARN, "HealthCheckInterval"),
])  # fmt: skip
def test_one_setting_changed(key: str, value: str, setting: str, status: str, fix_says: str) -> None:
    finding = _by_setting(_changed(key, value))[setting]
    assert finding.status == status, finding
    assert fix_says in finding.fix
    assert finding.why


def test_health_check_program_with_an_interval_is_ok() -> None:
    text = _changed("HealthCheckProgram", "/usr/local/sbin/supervise-health")
    text = text.replace("HealthCheckInterval     = 0 sec", "HealthCheckInterval     = 300 sec")
    assert _by_setting(text)["HealthCheckProgram"].status == OK


def test_no_preemption_means_nothing_about_grace_or_signals() -> None:
    found = _by_setting(_changed("PreemptType", "preempt/none"))
    assert found["PreemptType"].status == OK
    assert not [s for s in found if s.startswith(("GraceTime", "PreemptMode", "SlurmctldParameters"))]


def test_grace_time_judged_against_the_campaigns_checkpoint_grace() -> None:
    assert _by_setting(CONFIG, checkpoint_grace_s=8.0)["GraceTime (partition batch)"].status == OK
    zero = PARTITIONS.replace("GraceTime=10", "GraceTime=0")
    assert "killed at once" in _by_setting(CONFIG, zero)["GraceTime (partition batch)"].why


def test_parsers_raise_only_their_typed_error() -> None:
    with pytest.raises(ParseError):
        parse_scontrol_config("scontrol: error: Unable to contact slurm controller")
    with pytest.raises(ParseError):
        parse_scontrol_partitions("Nodes=node1 State=UP")
    assert seconds("5 sec") == 5 and seconds("2 min") == 120 and seconds("00:01:30") == 90
    assert seconds("1-00:00:00") == 86400 and seconds("UNLIMITED") == float("inf") and seconds("(null)") is None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=400))
def test_config_parser_fuzz(text: str) -> None:
    try:
        parsed = parse_scontrol_config(text)
    except ParseError:
        return
    judge(parsed, [])  # whatever parsed, the judgement does not raise
