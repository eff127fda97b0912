"""Pictures of a hand-written journal: every element drawn, nothing empty, a missing matplotlib named with a fix."""

from __future__ import annotations

import builtins
import xml.etree.ElementTree as ET

import pytest
from journal_samples import T0, journal

from supervisor import cli
from supervisor.decisions import events as ev
from supervisor.plot import PlotError, timeline, write_comparison, write_timeline
from supervisor.report_view import fold

SVG = "{http://www.w3.org/2000/svg}"


def test_timeline_model_from_the_journal() -> None:
    tl = timeline.build(journal(), now=T0 + 5000, goodput=fold(journal(), T0 + 5000)["goodput"])
    assert [a.outcome for a in tl.attempts] == ["node_failure", "completed"]
    assert [(la.outcome, la.blamed) for la in tl.launches] == [("hang", ("n2",)), ("node_failure", ("n2",)),
                                                               ("completed", ())]  # fmt: skip
    assert [m.cls for m in tl.interruptions] == ["hang", "node_failure"]
    assert tl.nodes == ["n1", "n2", "n3"]
    steps = [s for _, s in tl.progress]
    assert 45 in steps and steps[steps.index(45) + 2] == 30  # held while down, then rewound: lost work
    assert tl.t1 == T0 + 160  # an ended campaign is not stretched to "now"
    assert sum(s for _, s in tl.goodput) == pytest.approx(tl.wall_s, abs=0.01)


def test_html_is_self_contained_and_draws_everything(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "c.html"
    write_timeline(timeline.build(journal(), T0 + 5000, fold(journal(), T0 + 5000)["goodput"]), str(path))
    page = path.read_text()
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    svg = ET.fromstring(page[page.index("<svg"):page.index("</svg>") + 6])
    texts = ["".join(t.itertext()) for t in svg.iter(f"{SVG}text")]
    assert "hang (n2)" in texts and "node_failure (n2)" in texts
    assert {"n1", "n2", "n3"} <= set(texts)
    assert any(t.startswith("2026-12-02") for t in texts)  # the axis carries the date
    blamed = [p for p in svg.iter(f"{SVG}path") if "blamed: n2" in "".join(p.itertext())]
    assert len(blamed) == 2
    lanes = [r for r in svg.iter(f"{SVG}rect") if " on n" in "".join(r.itertext())]
    assert len(lanes) == 6  # three launches on two nodes each
    assert len(svg.findall(f"{SVG}polyline")) == 1
    assert any(t.startswith("productive") for t in texts)
    assert svg.get("width") == "100%"  # scales down in a narrow window instead of cutting the right side
    width = float(svg.get("viewBox", "0 0 0 0").split()[2])
    for t in svg.iter(f"{SVG}text"):  # labels stay inside the picture
        assert 0 <= float(t.get("x") or 0) <= width


def _ink(path) -> float:  # type: ignore[no-untyped-def]
    image = pytest.importorskip("matplotlib.image").imread(str(path))
    return float((image[..., :3].mean(axis=2) < 0.9).mean())


def test_png_and_svg_render_with_content(tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    goodput = fold(journal(), T0 + 5000)["goodput"]
    write_timeline(timeline.build(journal(), T0 + 5000, goodput), str(tmp_path / "c.png"))
    assert _ink(tmp_path / "c.png") > 0.05
    write_timeline(timeline.build(journal(), T0 + 5000, goodput), str(tmp_path / "c.svg"))
    assert "node_failure (n2)" in (tmp_path / "c.svg").read_text()


def test_simulate_plot(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    assert cli.main(["simulate", "--days", "5", "--plot", str(tmp_path / "s.png")]) == 0
    assert _ink(tmp_path / "s.png") > 0.05
    assert cli.main(["simulate", "--days", "5", "--plot", str(tmp_path / "s.html")]) == 0
    assert "(b) this supervisor" in (tmp_path / "s.html").read_text()


def test_a_running_campaign_is_drawn_up_to_now(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tl = timeline.build(journal()[:5], now=T0 + 300, goodput=None)
    assert tl.t1 == T0 + 300 and tl.attempts[0].outcome == "running" and tl.goodput == []
    write_timeline(timeline.build(journal()[:5], T0 + 300, None), str(tmp_path / "r.html"))
    write_timeline(timeline.build([], T0, None), str(tmp_path / "empty.html"))  # an empty journal still draws


def test_missing_matplotlib_and_bad_formats_are_one_line_errors(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(PlotError) as err:
        write_timeline(timeline.build(journal(), T0, None), str(tmp_path / "c.png"))
    assert "matplotlib" in err.value.problem and "slurm-supervisor[plot]" in err.value.fix
    with pytest.raises(PlotError, match="unknown picture format"):
        write_comparison({}, str(tmp_path / "c.gif"))
    with pytest.raises(PlotError, match="cannot write"):
        write_timeline(timeline.build(journal(), T0, None), str(tmp_path / "missing" / "c.html"))


def test_report_plot_through_the_command_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from supervisor import campaign

    paths = campaign.create(tmp_path / "c", campaign.CampaignSpec(command=("python", "train.py")), "#!/bin/sh\n")
    paths.journal.write_text("".join(json.dumps({"v": 1, **e}) + "\n" for e in journal()))
    assert cli.main(["report", str(paths.root), "--plot", str(tmp_path / "t.html")]) == 0
    assert "node_failure (n2)" in (tmp_path / "t.html").read_text()
    assert cli.main(["report", str(paths.root), "--plot", str(tmp_path / "t.bmp")]) == 2
    assert "unknown picture format" in capsys.readouterr().err


def test_labels_never_overlap_or_leave_the_plot() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    @given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.001, 0.3)), max_size=40))
    def check(marks: list[tuple[float, float]]) -> None:
        marks.sort()
        placed = timeline.place_labels([x for x, _ in marks], [w for _, w in marks])
        spans: dict[int, list[tuple[float, float]]] = {}
        for (x, w), (row, anchor) in zip(marks, placed, strict=True):
            if row is None:
                continue
            lo, hi = (x - w, x) if anchor == "end" else (x, x + w)
            assert 0 <= lo and hi <= 1
            assert all(hi <= a or lo >= b for a, b in spans.get(row, []))
            spans.setdefault(row, []).append((lo, hi))

    check()


def test_a_big_job_gets_lanes_for_its_blamed_nodes_only() -> None:
    nodes = [f"n{i:04d}" for i in range(500)]
    events = [ev.attempt_started(T0, "1", 0, nodes, None), {**ev.step_launched(T0 + 1, 1, nodes), "resume_step": 0},
              {**ev.interruption_event(T0 + 50, "hardware", ["n0042"], 0.9, ["Xid"]), "last_step": 40}]  # fmt: skip
    tl = timeline.build(events, now=T0 + 60)
    lanes, title = tl.lane_nodes()
    assert lanes == ["n0042"] and title == "blamed nodes (1 of 500)"
    ticks, every = timeline.thinned([(T0 + i, i) for i in range(1000)])
    assert len(ticks) <= 61 and every == 17 and ticks[-1] == (T0 + 999, 999)
