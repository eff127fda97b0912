"""The HTML timeline (``supervise report DIR --plot timeline.html``) as users see it: opened in Debian's headless
chromium, from the command a user types. The rendered DOM holds every launch, its outcome and blame, the node
lanes and the goodput bar; the screenshot is drawn (each launch's node lanes in its outcome's colour and the
goodput bar are on it, not a blank page), in a wide and in a narrow window (the picture scales down instead of
cutting off its right side: the same elements, in proportion)."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from journal_samples import journal

from supervisor import campaign, cli
from supervisor.plot.timeline import colour

mpimg = pytest.importorskip("matplotlib.image")

def browse(chromium: str, page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--user-data-dir=" + str(page.parent / "profile"), *flags, page.as_uri()],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def hex_rgb(text: str) -> tuple[float, float, float]:
    text = text.lstrip("#")
    return tuple(int(text[i : i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def pixels_near(png: Path, rgb: tuple[float, float, float], opacity: float = 1.0) -> int:
    """Pixels of ``rgb`` drawn at ``opacity`` over (near) white."""
    image = mpimg.imread(str(png))[..., :3]
    want = [opacity * c + (1 - opacity) for c in rgb]
    return int((abs(image - want).max(axis=-1) < 0.05).sum())


def test_the_timeline_renders_in_headless_chromium(tmp_path: Path, chromium: str) -> None:
    paths = campaign.create(tmp_path / "c", campaign.CampaignSpec(command=("python", "train.py")), "#!/bin/sh\n")
    paths.journal.write_text("".join(json.dumps({"v": 1, **e}) + "\n" for e in journal()))
    page = tmp_path / "timeline.html"
    assert cli.main(["report", str(paths.root), "--plot", str(page)]) == 0

    dom = browse(chromium, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    svg = ET.fromstring(html[html.index("<svg"):html.index("</svg>") + 6])
    texts = {"".join(t.itertext()) for t in svg.iter() if t.tag.endswith("text")}
    assert {"hang (n2)", "node_failure (n2)", "n1", "n2", "n3"} <= texts, texts
    assert any(t.startswith("productive") for t in texts)

    for width, name in ((1300, "wide.png"), (760, "narrow.png")):
        shot = tmp_path / name
        out = browse(chromium, page, f"--screenshot={shot}", f"--window-size={width},900")
        assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
        image = mpimg.imread(str(shot))
        assert image.shape[1] == width  # the page is drawn at the window's width
        scale = width / 1300
        for outcome in ("hang", "node_failure", "completed"):  # each launch's node lanes, in its outcome's colour
            assert pixels_near(shot, hex_rgb(colour(outcome)), opacity=0.85) > 2000 * scale, (name, outcome)
        assert pixels_near(shot, hex_rgb(colour("productive"))) > 4000 * scale, name  # the goodput bar
