"""Config files fail at submit time with a message naming the key and the fix."""

from __future__ import annotations

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
    assert cfg.policy == {"stop_grace_s": 30}


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[run]\ncheckpoint_grace = 3\n", "unknown key run.checkpoint_grace"),
        ("[runn]\n", "unknown section [runn]"),
        ('[submit]\nsignal_lead_s = "120"\n', "submit.signal_lead_s = '120' has the wrong type"),
        ("[submit]\nsignal_lead_s = true\n", "wrong type"),
        ("[run]\nloop_interval_s = -1\n", "negative"),
        ("[submit]\nsignal_lead_s = 0\n", "signal_lead_s must be >= 1"),
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
    assert cfg.submit == defaults.submit and cfg.run == defaults.run and cfg.alerts == defaults.alerts
    from supervisor.decisions.detect import DetectConfig

    assert DetectConfig.from_mapping(cfg.detect) == DetectConfig()
