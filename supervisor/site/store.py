"""The site's node ledger on disk: an embedded SQLite database (WAL) in the service's directory (issue 24).

What it keeps is what the rules need (``decisions/lemon.py``, ``decisions/site_trust.py``): every node verdict a
campaign posted, the jobs the campaigns ran (who, where, from when to when: the nodes' exposure in node-hours),
and the operators' forgiveness of a node after a repair. SQLite because the service is one process on an admin
node and the stdlib carries it; WAL so readers (the fleet page, ``site nodes``) never block the writer.

The directory is 0700 and the database 0600 (it names users, jobs and nodes). A file that is not a readable
SQLite database raises ``SiteStoreError`` naming it and the fix; nothing is overwritten.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from supervisor.decisions.lemon import NodeFailure
from supervisor.decisions.site_trust import SiteVerdict
from supervisor.errors import SiteError
from supervisor.site.fleet import Attempt, CampaignStatus, Interrupted

SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY, t REAL NOT NULL, node TEXT NOT NULL, user TEXT NOT NULL, source TEXT NOT NULL,
    klass TEXT NOT NULL, confidence REAL NOT NULL, evidence TEXT NOT NULL, job TEXT NOT NULL, campaign TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS verdicts_t ON verdicts (t);
CREATE TABLE IF NOT EXISTS jobs (
    job TEXT NOT NULL, node TEXT NOT NULL, user TEXT NOT NULL, campaign TEXT NOT NULL, start REAL NOT NULL,
    end REAL, PRIMARY KEY (job, node, start));
CREATE TABLE IF NOT EXISTS forgiven (node TEXT PRIMARY KEY, t REAL NOT NULL, by TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS repairs (
    id INTEGER PRIMARY KEY, t REAL NOT NULL, node TEXT NOT NULL, kind TEXT NOT NULL, reason TEXT NOT NULL,
    error TEXT);
CREATE TABLE IF NOT EXISTS tokens (user TEXT PRIMARY KEY, token TEXT NOT NULL, admin INTEGER NOT NULL, t REAL NOT NULL);
CREATE TABLE IF NOT EXISTS campaigns (
    user TEXT NOT NULL, campaign TEXT NOT NULL, job TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,
    wall_s REAL NOT NULL, productive_s REAL NOT NULL, ettr REAL, attempts TEXT NOT NULL, t REAL NOT NULL,
    PRIMARY KEY (user, campaign));
CREATE TABLE IF NOT EXISTS interruptions (
    id INTEGER PRIMARY KEY, t REAL NOT NULL, user TEXT NOT NULL, campaign TEXT NOT NULL, job TEXT NOT NULL,
    klass TEXT NOT NULL, nodes TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS interruptions_t ON interruptions (t);
"""


class SiteStoreError(SiteError):
    """The site database cannot be opened or read."""


class SiteStore:
    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / "site.db"
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            if not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as err:
            raise SiteStoreError(f"{self.path} is not a readable site database ({err})",
                                 "point --dir at the service's directory, or move the file away to start a new "
                                 "ledger") from None  # fmt: skip
        except OSError as err:
            raise SiteStoreError(f"cannot open the site directory {self.directory} ({err.strerror})",
                                 "create it, or give the service a directory it can write") from None  # fmt: skip

    def close(self) -> None:
        self.db.close()

    # -- writing ------------------------------------------------------------------------------------------------
    def add_verdict(self, v: SiteVerdict, *, confidence: float, evidence: Sequence[str], job: str) -> int:
        cur = self.db.execute(
            "INSERT INTO verdicts (t, node, user, source, klass, confidence, evidence, job, campaign) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (v.t, v.node, v.user, v.source, v.klass, confidence, json.dumps(list(evidence)), job, v.campaign))
        return int(cur.lastrowid or 0)

    def job_started(self, job: str, nodes: Iterable[str], *, user: str, campaign: str, t: float) -> None:
        self.db.executemany("INSERT OR IGNORE INTO jobs (job, node, user, campaign, start) VALUES (?, ?, ?, ?, ?)",
                            [(job, n, user, campaign, t) for n in nodes])  # fmt: skip

    def job_ended(self, job: str, t: float) -> None:
        self.db.execute("UPDATE jobs SET end = ? WHERE job = ? AND end IS NULL", (t, job))

    def forgive(self, node: str, t: float, by: str) -> None:
        self.db.execute("INSERT INTO forgiven (node, t, by) VALUES (?, ?, ?) "
                        "ON CONFLICT (node) DO UPDATE SET t = excluded.t, by = excluded.by", (node, t, by))  # fmt: skip

    def set_token(self, user: str, token: str, *, admin: bool, t: float) -> None:
        """Issue (or replace: the old one stops working at once) ``user``'s token."""
        self.db.execute("INSERT INTO tokens (user, token, admin, t) VALUES (?, ?, ?, ?) ON CONFLICT (user) DO UPDATE "
                        "SET token = excluded.token, admin = excluded.admin, t = excluded.t",
                        (user, token, int(admin), t))  # fmt: skip

    def add_repair(self, t: float, node: str, kind: str, reason: str, error: str | None = None) -> None:
        """One step of the repair loop (drain, reboot, resume, forgive, wait), and why it failed if it did."""
        self.db.execute("INSERT INTO repairs (t, node, kind, reason, error) VALUES (?, ?, ?, ?, ?)",
                        (t, node, kind, reason[:500], None if error is None else error[:500]))  # fmt: skip

    def campaign_status(self, status: CampaignStatus) -> None:
        """A campaign's latest figures (one row per user and campaign: the newest replaces the last)."""
        self.db.execute(
            "INSERT INTO campaigns (user, campaign, job, state, reason, wall_s, productive_s, ettr, attempts, t) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (user, campaign) DO UPDATE SET job = excluded.job, "
            "state = excluded.state, reason = excluded.reason, wall_s = excluded.wall_s, "
            "productive_s = excluded.productive_s, ettr = excluded.ettr, attempts = excluded.attempts, t = excluded.t",
            (status.user, status.campaign, status.job, status.state, status.reason, status.wall_s,
             status.productive_s, status.ettr, json.dumps([[a.start, a.end, a.klass, list(a.blamed)] for a in status.attempts]), status.t))

    def add_interruption(self, t: float, user: str, campaign: str, job: str, klass: str, nodes: Sequence[str]) -> None:
        """One interruption of a campaign, whatever its class (preemptions too: the fleet's picture over time)."""
        self.db.execute("INSERT INTO interruptions (t, user, campaign, job, klass, nodes) VALUES (?, ?, ?, ?, ?, ?)",
                        (t, user, campaign, job, klass, json.dumps(list(nodes))))  # fmt: skip

    # -- reading ------------------------------------------------------------------------------------------------
    def repairs(self, since: float = float("-inf")) -> list[dict[str, object]]:
        rows = self.db.execute("SELECT t, node, kind, reason, error FROM repairs WHERE t >= ? ORDER BY id",
                               (since,)).fetchall()  # fmt: skip
        return [dict(zip(("t", "node", "kind", "reason", "error"), r, strict=True)) for r in rows]

    def token_of(self, user: str) -> str | None:
        row = self.db.execute("SELECT token FROM tokens WHERE user = ?", (user,)).fetchone()
        return None if row is None else str(row[0])

    def is_admin(self, user: str) -> bool:
        row = self.db.execute("SELECT admin FROM tokens WHERE user = ?", (user,)).fetchone()
        return bool(row and row[0])

    def verdicts(self, since: float = float("-inf")) -> list[SiteVerdict]:
        rows = self.db.execute("SELECT node, user, source, klass, campaign, t FROM verdicts WHERE t >= ? ORDER BY t",
                               (since,)).fetchall()  # fmt: skip
        return [SiteVerdict(node=r[0], user=r[1], source=r[2], klass=r[3], campaign=r[4], t=r[5]) for r in rows]

    def verdict_rows(self, since: float) -> list[tuple[SiteVerdict, list[str]]]:
        """Verdicts since ``since`` with their evidence lines, oldest first."""
        rows = self.db.execute("SELECT node, user, source, klass, campaign, t, evidence FROM verdicts WHERE t >= ? "
                               "ORDER BY t", (since,)).fetchall()  # fmt: skip
        out = []
        for r in rows:
            try:
                evidence = [str(e) for e in json.loads(r[6])]
            except (ValueError, TypeError):
                evidence = []
            out.append((SiteVerdict(node=r[0], user=r[1], source=r[2], klass=r[3], campaign=r[4], t=r[5]), evidence))
        return out

    def failures(self, since: float, until: float) -> list[NodeFailure]:
        """Every verdict in [since, until] as a failure of its node (the lemon rule's input), forgiven ones out."""
        forgiven = self.forgiven_at()
        rows = self.db.execute("SELECT node, t, klass, user, job FROM verdicts WHERE t BETWEEN ? AND ? ORDER BY t",
                               (since, until)).fetchall()  # fmt: skip
        return [NodeFailure(*r) for r in rows if r[1] >= forgiven.get(r[0], float("-inf"))]

    def exposure_h(self, since: float, until: float) -> dict[str, float]:
        """Node-hours in jobs within [since, until] per node (a job still running counts until ``until``); a node
        no job ran on in the window is absent (its exposure is not known to be zero: it may be new or down)."""
        out: dict[str, float] = {}
        for node, start, end in self.db.execute("SELECT node, start, end FROM jobs WHERE start <= ? AND "
                                                "(end IS NULL OR end >= ?)", (until, since)):  # fmt: skip
            overlap = min(until, end if end is not None else until) - max(since, start)
            if overlap > 0:
                out[node] = out.get(node, 0.0) + overlap / 3600.0
        return out

    def campaigns(self) -> list[CampaignStatus]:
        rows = self.db.execute("SELECT user, campaign, job, state, reason, wall_s, productive_s, ettr, attempts, t "
                               "FROM campaigns ORDER BY t DESC").fetchall()  # fmt: skip
        out = []
        for r in rows:
            try:
                attempts = tuple(Attempt(a[0], a[1], a[2], tuple(a[3])) for a in json.loads(r[8]))
            except (ValueError, TypeError, IndexError):
                attempts = ()
            out.append(CampaignStatus(user=r[0], campaign=r[1], job=r[2], state=r[3], reason=r[4], wall_s=r[5],
                                      productive_s=r[6], ettr=r[7], attempts=attempts, t=r[9]))  # fmt: skip
        return out

    def interruptions(self, since: float = float("-inf")) -> list[Interrupted]:
        rows = self.db.execute("SELECT t, user, campaign, job, klass, nodes FROM interruptions WHERE t >= ? "
                               "ORDER BY t", (since,)).fetchall()  # fmt: skip
        out = []
        for r in rows:
            try:
                nodes = tuple(str(n) for n in json.loads(r[5]))
            except (ValueError, TypeError):
                nodes = ()
            out.append(Interrupted(t=r[0], user=r[1], campaign=r[2], job=r[3], klass=r[4], nodes=nodes))
        return out

    def interruption_counts(self) -> dict[str, int]:
        """Every interruption the site was told of, by class, since the database began (Prometheus' counters)."""
        return {k: int(n) for k, n in self.db.execute("SELECT klass, COUNT(*) FROM interruptions GROUP BY klass")}

    def forgiven_at(self) -> dict[str, float]:
        return {node: t for node, t in self.db.execute("SELECT node, t FROM forgiven")}
