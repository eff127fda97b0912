"""The fleet page (issue 24): one static HTML page, its stylesheet and its script, served by the site service at
``/``. The page carries no data: its script reads ``GET /v1/fleet`` with the view key from the URL's fragment
(``#key=...``, which browsers never send to a server or write to its logs; ``supervise site url`` prints the URL),
and reads it again every ``REFRESH_S`` seconds.

Everything a campaign or a node sent is untrusted text (campaign directories, evidence lines, user names): the
script only ever sets ``textContent`` and SVG attributes, never HTML, and the service sends a Content-Security-
Policy that allows nothing but its own script, stylesheet and API, so a campaign named ``<script>`` is a name.
"""

from __future__ import annotations

REFRESH_S = 10

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")  # fmt: skip

HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Fleet - slurm-supervisor site</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/fleet.css">
</head>
<body>
<header><h1>Fleet</h1><p id="status">loading...</p></header>
<section>
<h2>Campaigns</h2>
<table id="campaigns"><thead><tr><th>user</th><th>campaign</th><th>job</th><th>state</th><th>ETTR</th>
<th>productive / wall</th><th>last interruption</th><th>reported</th><th></th></tr></thead><tbody></tbody></table>
<div id="timeline"></div>
</section>
<section>
<h2>Interruptions by class</h2>
<svg id="chart" width="1000" height="220" role="img" aria-label="interruptions by class over time"></svg>
<div id="legend"></div>
</section>
<section>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>node</th><th>state</th><th>lemon</th><th>failures</th><th>users</th><th>jobs</th>
<th>node-hours</th><th>p-value</th><th>why / last verdicts</th></tr></thead><tbody></tbody></table>
</section>
<section>
<h2>Repair loop</h2>
<table id="repairs"><thead><tr><th>when</th><th>node</th><th>step</th><th>reason</th><th>Slurm's answer</th></tr>
</thead><tbody></tbody></table>
</section>
<script src="/fleet.js"></script>
</body>
</html>
"""

CSS = """
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 16px; color: #222; }
h1 { margin: 0 0 4px 0; } h2 { margin: 20px 0 6px 0; font-size: 1.1em; }
#status { color: #555; margin: 0; }
#status.bad { color: #c62828; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.lemon td { background: #fdecea; }
.chip { display: inline-block; padding: 0 6px; border-radius: 3px; color: #fff; }
.muted { color: #777; }
code { background: #f4f4f4; padding: 1px 4px; }
#legend span { margin-right: 12px; }
#timeline { margin-top: 8px; }
"""

JS = (
    """"use strict";
const REFRESH_MS = """
    + str(REFRESH_S * 1000)
    + """;
const SVG = "http://www.w3.org/2000/svg";

function hashParams() { return new URLSearchParams(location.hash.slice(1)); }

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function svg(tag, attrs, title) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (title) { const t = document.createElementNS(SVG, "title"); t.textContent = title; node.appendChild(t); }
  return node;
}

function when(t) { return t === null || t === undefined ? "-" : new Date(t * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC"; }

function span(seconds) {
  const s = Math.max(0, seconds);
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(0) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function chip(name, colours) {
  const c = el("span", name, "chip");
  c.style.background = colours[name] || "#757575";
  return c;
}

function setStatus(text, bad) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "bad" : "";
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else if (c && c.num !== undefined) { td.textContent = c.num; td.className = "num"; }
    else td.textContent = c === null || c === undefined ? "-" : String(c);
    tr.appendChild(td);
  }
  return tr;
}

function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows);
}

function campaignId(c) { return c.user + ":" + c.campaign; }

function renderCampaigns(doc) {
  const shown = hashParams().get("campaign");
  fill("campaigns", doc.campaigns.map(c => {
    const last = c.last_interruption;
    const lastCell = last ? el("span") : el("span", "none", "muted");
    if (last) { lastCell.appendChild(chip(last["class"], doc.colours)); lastCell.appendChild(document.createTextNode(" " + when(last.t) + (last.nodes.length ? " on " + last.nodes.join(",") : ""))); }
    const link = el("a", "timeline");
    const params = hashParams(); params.set("campaign", campaignId(c));
    link.href = "#" + params.toString();
    const tr = row([c.user, c.campaign, c.job, chip(c.state, {running: doc.colours.running, completed: doc.colours.completed}),
                    {num: c.ettr === null ? "-" : (100 * c.ettr).toFixed(1) + " %"},
                    {num: span(c.productive_s) + " / " + span(c.wall_s)}, lastCell, span(doc.now - c.t) + " ago", link]);
    tr.dataset.campaign = campaignId(c);
    return tr;
  }));
  const box = document.getElementById("timeline");
  const c = doc.campaigns.find(x => campaignId(x) === shown);
  if (!c) { box.replaceChildren(); return; }
  const W = 1000, H = 46;
  const t0 = c.attempts.length ? c.attempts[0].start : c.t, t1 = Math.max(doc.now, t0 + 1);
  const x = t => 10 + (W - 20) * (t - t0) / (t1 - t0);
  const pic = svg("svg", {width: W, height: H, id: "campaign-timeline"});
  for (const a of c.attempts) {
    const end = a.end === null ? doc.now : a.end, cls = a.klass || "running";
    pic.appendChild(svg("rect", {x: x(a.start), y: 8, width: Math.max(2, x(end) - x(a.start)), height: 22,
                                 fill: doc.colours[cls] || "#757575"},
                        cls + ": " + when(a.start) + " to " + (a.end === null ? "now" : when(a.end)) +
                        (a.blamed.length ? " (blamed " + a.blamed.join(",") + ")" : "")));
  }
  pic.appendChild(svg("text", {x: 10, y: 44, "font-size": 11}, null)).textContent = when(t0);
  const end = svg("text", {x: W - 10, y: 44, "font-size": 11, "text-anchor": "end"}, null);
  end.textContent = when(t1); pic.appendChild(end);
  const how = el("p"); how.appendChild(el("span", "Full timeline: "));
  how.appendChild(el("code", "supervise report " + c.campaign + " --plot timeline.html"));
  box.replaceChildren(el("h3", "Timeline of " + c.campaign + " (" + c.user + ")"), pic, how);
}

function renderChart(doc) {
  const chart = document.getElementById("chart"), data = doc.interruptions;
  const W = 1000, H = 220, left = 40, bottom = 30, n = data.buckets.length;
  const most = Math.max(1, ...data.buckets.map(b => Object.values(b.counts).reduce((a, v) => a + v, 0)));
  const bw = (W - left - 10) / Math.max(1, n), scale = (H - bottom - 10) / most;
  const parts = [svg("line", {x1: left, y1: H - bottom, x2: W - 10, y2: H - bottom, stroke: "#999"})];
  const top = svg("text", {x: left - 6, y: 16, "font-size": 11, "text-anchor": "end"}); top.textContent = String(most); parts.push(top);
  data.buckets.forEach((b, i) => {
    let y = H - bottom;
    for (const cls of data.classes) {
      const k = b.counts[cls] || 0;
      if (!k) continue;
      parts.push(svg("rect", {x: left + i * bw + 1, y: y - k * scale, width: Math.max(1, bw - 2), height: k * scale,
                              fill: doc.colours[cls] || "#757575", "class": "bar"}, cls + ": " + k + " from " + when(b.t)));
      y -= k * scale;
    }
    if (i % Math.ceil(n / 6) === 0 && left + i * bw < W - 80) {
      const label = svg("text", {x: left + i * bw, y: H - 10, "font-size": 11}); label.textContent = when(b.t).slice(0, 10);
      parts.push(label);
    }
  });
  chart.replaceChildren(...parts);
  document.getElementById("legend").replaceChildren(...(data.classes.length ? data.classes.map(c => chip(c, doc.colours))
    : [el("span", "no interruption in the window", "muted")]));
}

function renderNodes(doc) {
  // a node with no failure in the window, no lemon score and untouched by the repair loop is one count, not a row
  const quiet = doc.nodes.filter(n => !n.failures && !n.lemon && n.repair.state === "in service");
  const rows = doc.nodes.filter(n => !quiet.includes(n)).map(n => {
    const why = el("span", n.why || "");
    for (const v of n.verdicts) why.appendChild(el("div", when(v.t) + " " + v["class"] + " (" + v.source + ", " + v.user + ")", "muted"));
    const tr = row([n.node, n.repair.state, n.lemon ? "LEMON" : "no", {num: n.failures}, {num: n.users}, {num: n.jobs},
                    {num: n.exposure_h === null ? "-" : n.exposure_h.toFixed(1)},
                    {num: n.p_value === null ? "-" : (n.p_value === 0 ? "0" : n.p_value.toExponential(1))}, why]);
    if (n.lemon) tr.className = "lemon";
    tr.dataset.node = n.node;
    return tr;
  });
  if (quiet.length) {
    const tr = row([el("span", "and " + quiet.length + " node(s) in jobs without a failure in the window", "muted")]);
    tr.firstChild.colSpan = 9;
    rows.push(tr);
  }
  fill("nodes", rows);
  fill("repairs", doc.repairs.map(r => row([when(r.t), r.node, r.kind, r.reason, r.error || "done"])));
}

let last = null;

async function refresh() {
  const key = hashParams().get("key");
  if (!key) { setStatus("no view key in the address: open the URL that `supervise site url` printed", true); return; }
  let answer, doc;
  try {
    answer = await fetch("/v1/fleet", {headers: {Authorization: "Bearer " + key}, cache: "no-store"});
    doc = await answer.json();
  } catch (err) {
    setStatus("the site service cannot be reached (" + err + "); trying again every " + REFRESH_MS / 1000 + " s", true);
    return;
  }
  if (!answer.ok) { setStatus(doc.error || ("the service answered " + answer.status), true); return; }
  last = doc;
  render();
}

function render() {
  if (!last) return;
  renderCampaigns(last); renderChart(last); renderNodes(last);
  setStatus(last.campaigns.length + " campaign(s), " + last.nodes.length + " node(s) with a record; as of " + when(last.now) +
            ", refreshed every " + REFRESH_MS / 1000 + " s");
}

window.addEventListener("hashchange", render);
refresh();
setInterval(refresh, REFRESH_MS);
"""
)

PAGES = {
    "/": (HTML.encode(), "text/html; charset=utf-8"),
    "/fleet.css": (CSS.encode(), "text/css; charset=utf-8"),
    "/fleet.js": (JS.encode(), "text/javascript; charset=utf-8"),
}
