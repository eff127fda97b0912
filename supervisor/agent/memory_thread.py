"""The node agent's side of the memory tier: it owns the node's memory store (``$SUPERVISOR_MEMORY_DIR``, made
0700 inside the agent's slot directory, so a snapshot outlives the rank that wrote it and goes when the agent's
run ends) and tells the supervisor what the store holds, verified (``memory_inventory``), as one
``wire.EVENT_MEMORY`` event whenever that changes and every few seconds otherwise (a lost datagram is superseded).

Why a thread: verifying a new shard hashes it (a 256 MiB state takes a few tenths of a second); the sampling
loop must keep reporting heartbeats meanwhile.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

from supervisor.agent.memory_inventory import Inventory
from supervisor.checkpoint.memory_room import read_off
from supervisor.decisions.memory_pick import Held
from supervisor.heartbeat import wire
from supervisor.heartbeat.memory_report import encode_memory

SCAN_S = 0.5
RESEND_S = 5.0


def make_store(root: Path) -> Path:
    """Create the store (0700); an existing one must be a real directory of ours (not a planted link)."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(root)
    if not os.path.isdir(root) or os.path.islink(root) or st.st_uid != os.geteuid():
        raise OSError(f"{root} is not a directory of ours")
    os.chmod(root, 0o700)
    return root


class MemoryThread:
    """Scans the store off the agent's loop; ``events()`` hands over the inventories to send."""

    def __init__(self, root: Path, scan_s: float = SCAN_S, resend_s: float = RESEND_S, listen: str = "") -> None:
        """``listen``: where this agent receives shards from other agents (sent with every inventory)."""
        self.inventory = Inventory(root)
        self.listen = listen
        self.scan_s, self.resend_s = scan_s, resend_s
        self.done: queue.Queue[wire.Event] = queue.Queue(maxsize=4)
        self.stop = threading.Event()
        self.asked = threading.Event()  # the supervisor wants the inventory now
        self.wake = threading.Event()  # a request or the stop: scan at once instead of at the next tick
        self.thread = threading.Thread(target=self._run, name="agent-memory", daemon=True)
        self.last: tuple[Held, ...] | None = None
        self.off: tuple[tuple[int, int], ...] = ()

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        sent_at = 0.0
        while True:
            self.wake.wait(self.scan_s)
            self.wake.clear()
            if self.stop.is_set():
                return
            try:
                held = tuple(sorted(self.inventory.scan(), key=lambda h: (h.step, h.rank)))
            except Exception:  # noqa: BLE001 - a store that cannot be read is an empty one; the agent goes on
                held = ()
            off = read_off(self.inventory.root)  # ranks the store failed (memory_room): the campaign turns it off
            now = time.monotonic()
            if (held, off) == (self.last, self.off) and now - sent_at < self.resend_s and not self.asked.is_set():
                continue
            self.asked.clear()
            try:
                self.done.put_nowait(wire.Event(wire.EVENT_MEMORY, 0, encode_memory(held, self.listen, off)))
                self.last, self.off, sent_at = held, off, now
            except queue.Full:  # the loop stopped taking them: the next scan supersedes
                pass

    def request(self) -> None:
        """Scan and send the inventory now, even when it did not change."""
        self.asked.set()
        self.wake.set()

    def events(self) -> list[wire.Event]:
        out = []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                return out[-1:]  # only the newest inventory matters

    def close(self, timeout_s: float = 2.0) -> None:
        self.stop.set()
        self.wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout_s)
