"""The docs name code: the journal's event table, config keys, CLI subcommands and flags, exit codes. These tests
fail when the two drift apart (the way submitit checks its documentation)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from supervisor import cli, config
from supervisor.decisions import events as ev
from supervisor.decisions.detect import CONFIG_KEYS as DETECT_KEYS
from supervisor.decisions.ledger import LedgerConfig
from supervisor.decisions.policy import PolicyConfig
from supervisor.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DECISIONS = (ROOT / "docs" / "decisions.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


# ------------------------------------------------------------------------------------------- journal events


def test_the_event_table_lists_exactly_the_event_types_events_py_builds() -> None:
    journal = _section(DECISIONS, "## Journal")
    documented = set(re.findall(r"^\| `(\w+)` \|", journal, re.M))
    known = set(ev.EVENT_TYPES) | set(ev.STORAGE_EVENT_TYPES)
    assert documented == known, (
        f"docs/decisions.md lacks {sorted(known - documented)}, documents unknown {sorted(documented - known)}"
    )


def test_every_event_type_has_a_constructor_in_events_py() -> None:
    builders = {name: fn for name, fn in vars(ev).items() if callable(fn) and not name.startswith("_")}
    for kind in (*ev.EVENT_TYPES, *ev.STORAGE_EVENT_TYPES):
        assert any(name in (kind, f"{kind}_event") for name in builders), f"no constructor for {kind}"


# ------------------------------------------------------------------------------------------- configuration


def _documented_config() -> dict:
    block = re.search(r"```toml\n(.*?)```", CONFIGURATION, re.S)
    assert block is not None, "docs/configuration.md has no ```toml example"
    return config.tomllib.loads(block.group(1))


def test_the_documented_config_is_valid() -> None:
    config.from_mapping(_documented_config(), "docs/configuration.md")  # every documented key exists


@pytest.mark.parametrize(("section", "cls"), [("submit", config.SubmitConfig), ("run", config.RunConfig),
                                              ("alerts", config.AlertConfig), ("site", config.SiteConfig)])  # fmt: skip
def test_every_key_of_a_section_is_documented_with_its_default(section: str, cls: type) -> None:
    doc = _documented_config()[section]
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    assert set(doc) == set(defaults), f"[{section}] documented {sorted(doc)}, defined {sorted(defaults)}"
    for key, value in doc.items():
        default = defaults[key]
        assert (list(default) if isinstance(default, tuple) else default) == value, f"{section}.{key} default"


def test_every_detect_policy_and_ledger_setting_is_documented() -> None:
    doc = _documented_config()
    assert set(DETECT_KEYS) == set(doc["detect"]), "[detect] keys differ from detect.CONFIG_KEYS"
    scalars = {f.name for f in dataclasses.fields(PolicyConfig)} - {"budgets", "tiers"}
    assert scalars == {k for k, v in doc["policy"].items() if not isinstance(v, dict)}
    assert {f.name for f in dataclasses.fields(LedgerConfig)} == set(doc["ledger"])


# ------------------------------------------------------------------------------------------- the command line


def _usage_lines() -> list[list[str]]:
    lines = []
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", README, re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("supervise "):
                lines.append(shlex.split(line))
    return lines


def test_readme_names_only_existing_subcommands_and_flags() -> None:
    lines = _usage_lines()
    assert lines, "README shows no `supervise ...` usage"
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices  # type: ignore[union-attr]
    for argv in lines:
        sub = argv[1]
        assert sub in cli.COMMANDS, f"README uses unknown subcommand {sub!r}"
        own = argv[2: argv.index("--")] if "--" in argv else argv[2:]
        target = subparsers[sub]
        nested = [a for a in target._actions if isinstance(a, argparse._SubParsersAction)]
        if nested and own and own[0] in nested[0].choices:  # `supervise site serve --dir ...`: serve's own flags
            target = nested[0].choices[own[0]]
        flags = {s for a in target._actions for s in a.option_strings}
        module = cli._module_of(sub)
        passes_through = hasattr(module, "parse_argv")  # submit/run also take sbatch's/srun's own flags
        for word in own:
            if word.startswith("--") and not passes_through:
                assert word.split("=", 1)[0] in flags, f"README: `supervise {sub} {word}` is not a flag"


def test_every_subcommand_is_in_the_readme() -> None:
    for name in cli.COMMANDS:
        assert f"supervise {name}" in README, f"README does not mention `supervise {name}`"


# ------------------------------------------------------------------------------------------- exit codes


def test_the_readme_exit_code_table_matches_the_code() -> None:
    table = _section(README, "## Exit codes")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert documented == set(EXIT_CODES), f"README exit codes {sorted(documented)} vs code {sorted(EXIT_CODES)}"


def test_no_tracked_text_file_holds_a_merge_conflict_marker() -> None:
    """A conflict left in a doc or a source file reads as content; this caught one in docs/architecture.md."""
    marker = re.compile(r"^(<{7} |={7}$|>{7} )", re.M)
    suffixes = {".py", ".md", ".toml", ".cfg", ".txt", ".sh", ".sbatch"}
    found = [
        str(path.relative_to(ROOT))
        for top in ("supervisor", "slurm", "docs", "examples", "tests", "bench")
        for path in (ROOT / top).rglob("*")
        if path.suffix in suffixes and path.is_file() and marker.search(path.read_text(errors="replace"))
    ]
    found += [name for name in ("README.md", "Makefile", "pyproject.toml") if marker.search((ROOT / name).read_text())]
    assert not found, f"merge conflict markers in {found}"


def test_every_health_threshold_is_documented_with_its_default() -> None:
    from supervisor.health.checks import Limits

    doc = _documented_config()["health"]
    defaults = {f.name: f.default for f in dataclasses.fields(Limits)}
    assert doc == defaults, "[health] in docs/configuration.md differs from health.checks.Limits"


def test_the_xid_codes_in_the_docs_are_the_tables() -> None:
    """docs/health.md and docs/decisions.md list the hardware and application Xid codes of decisions/xid.py."""
    from supervisor.decisions import xid

    health = (ROOT / "docs" / "health.md").read_text()
    for kind, label in ((xid.HARDWARE, "hardware codes"), (xid.APPLICATION, "application codes")):
        listed = ", ".join(str(c) for c in xid.codes(kind))
        assert f"{label} {listed}" in health, f"docs/health.md: {label} should read {listed}"
        assert f"({listed})" in DECISIONS, f"docs/decisions.md should list the {kind} Xid codes ({listed})"
