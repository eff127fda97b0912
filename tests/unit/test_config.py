"""Config files fail at submit time with a message naming the key and the fix."""

from __future__ import annotations

import dataclasses

import pytest

from supervisor import config
from supervisor.errors import ConfigError


def test_defaults_without_a_file():
    cfg = config.load(None)
    assert cfg.submit.signal_lead_s == 120 and cfg.run.srun_args == ()


def test_values_are_read_and_ints_accepted_for_floats(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\ncheckpoint_grace_s = 30\nsrun_args = ["--cpu-bind=none"]\n[policy]\nstop_grace_s = 30\n')
    cfg = config.load(path)
    assert cfg.run.checkpoint_grace_s == 30.0 and isinstance(cfg.run.checkpoint_grace_s, float)
    assert cfg.run.srun_args == ("--cpu-bind=none",)
    assert cfg.policy.stop_grace_s == 30 and cfg.to_dict()["policy"] == {"stop_grace_s": 30}
    assert config.from_mapping(cfg.to_dict()) == cfg  # what campaign.json records parses to the same settings


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[run]\ncheckpoint_grace = 3\n", "unknown key run.checkpoint_grace"),
        ("[runn]\n", "unknown section [runn]"),
        ('[submit]\nsignal_lead_s = "120"\n', "submit.signal_lead_s = '120' has the wrong type"),
        ("[submit]\nsignal_lead_s = true\n", "wrong type"),
        ("[run]\nloop_interval_s = -1\n", "negative"),
        ("[submit]\nsignal_lead_s = 0\n", "submit.signal_lead_s = 0 is out of range (allowed: 1 <= value <= 65535)"),
        ("[run]\nsrun_args = [1]\n", "list of strings"),
        ("[run\n", "not valid TOML"),
        ("[policy]\nstop_grace = 3\n", "policy.stop_grace: unknown setting"),
        ("[detect]\nbogus = 1\n", "bogus"),
    ],
)
def test_bad_config_names_the_problem(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert needle in info.value.problem
    assert info.value.fix


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml")


def test_the_documented_example_config_is_valid_and_complete(tmp_path):
    """docs/configuration.md shows every key with its default: it must load, and match the code's defaults."""
    import re
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    text = re.search(r"```toml\n(.*?)```", doc, re.S).group(1)
    path = tmp_path / "doc.toml"
    path.write_text(text)
    cfg = config.load(path)
    defaults = config.Config()
    # every section typed and at its default, but the documented log signatures (examples placed before the
    # built-in table)
    assert dataclasses.replace(cfg, log_signatures=defaults.log_signatures) == defaults
    assert cfg.log_signatures[len(cfg.log_signatures) - len(defaults.log_signatures):] == defaults.log_signatures


@pytest.mark.parametrize(
    "text, needle",
    [  # issue 10 finding 3: each of these was accepted (or raised a traceback) before
        ("[run]\nagent_interval_s = nan\n", "run.agent_interval_s = nan is out of range (allowed: 0.01 <= value <= 60"),
        ("[run]\nagent_interval_s = 0\n", "run.agent_interval_s = 0 is out of range"),
        ("[run]\nsummary_interval_s = inf\n", "run.summary_interval_s = inf is out of range"),
        ("[run]\nloop_interval_s = 1e300\n", "run.loop_interval_s = 1e+300 is out of range"),
        ("[run]\ncheckpoint_grace_s = 0\n", "run.checkpoint_grace_s = 0 is out of range (allowed: 1 <= value"),
        ("[run]\nspare_nodes = 100000\n", "run.spare_nodes = 100000 is out of range (allowed: 0 <= value <= 4096)"),
        ("[submit]\nsignal_lead_s = 9999999\n", "submit.signal_lead_s = 9999999 is out of range"),
        ("[detect]\nnode_silence_s = nan\n", "detect.node_silence_s = nan is out of range"),
        ("[detect]\nnode_silence_s = 0\n", "detect.node_silence_s = 0 is out of range (allowed: 0 < value"),
        ("[policy]\nstop_grace_s = inf\n", "policy.stop_grace_s = inf is out of range"),
        ("[ledger]\nweights = 5\n", "[ledger]"),
        ("[ledger.weights]\nhang = nan\n", "ledger.weights.hang = nan is out of range"),
        ('[submit]\njob_name = "x\\n/usr/bin/id > f\\n#"\n', "control character"),
        ('[submit]\njob_name = "a b"\n', "submit.job_name = 'a b' is not allowed"),
        ('[run]\nsrun_args = ["--x\\n"]\n', "control character"),
        ("[preflight]\nhorizon_s = 1\n", "preflight.horizon_s must be a number in [60, 2.592e+06], got 1"),
        ("[preflight]\nrequeue_cost_s = nan\n", "preflight.requeue_cost_s = nan is out of range"),
    ],
)
def test_values_outside_the_documented_range_exit_3_naming_key_value_and_range(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert needle in info.value.problem, info.value.problem
    assert info.value.exit_code == 3 and "\n" not in info.value.one_line()


def test_backoff_may_be_zero(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[policy]\nbackoff_base_s = 0\n")
    assert config.load(path).policy.backoff_base_s == 0


def test_a_non_utf8_file_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b'[submit]\njob_name = "\xff\xfe"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        config.load(path)


def test_a_non_table_mapping_is_a_config_error():
    with pytest.raises(ConfigError, match="not a table"):
        config.from_mapping([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize("section, key", [("run", "spare_nodes"), ("detect", "step_k"), ("detect", "node_silence_s")])
def test_integers_too_large_for_a_float_are_out_of_range(section, key):
    """Found by bench/fuzz_all.py: math.isfinite(10**20 * 10**300) raised OverflowError."""
    with pytest.raises(ConfigError, match="out of range"):
        config.from_mapping({section: {key: 10**400}})


@pytest.mark.parametrize("text, needle", [  # issue 22, low: each escaped (ValueError, OverflowError) or was accepted
    ("[run]\ncheckpoint_grace_s = " + "9" * 4400, "holds a value TOML cannot read"),
    ("[run]\nmtbf_prior_s = " + "9" * 401, "run.mtbf_prior_s = 999999999999... (401 digits) is out of range"),
    ("[run]\ncheckpoint_interval = " + "9" * 401, "run.checkpoint_interval"),
    ("[alerts]\ncooldown_s = " + "9" * 401, "alerts.cooldown_s"),
    ("[alerts]\ntimeout_s = " + "9" * 401, "alerts.timeout_s"),
    ("[run]\nmtbf_prior_s = nan", "run.mtbf_prior_s = nan is out of range"),
    ("[run]\nmtbf_prior_s = inf", "run.mtbf_prior_s = inf is out of range"),
])  # fmt: skip
def test_huge_and_non_finite_numbers_are_config_errors(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert needle in info.value.problem and info.value.fix
