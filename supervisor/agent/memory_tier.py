"""The node agent's memory tier, whole: the store's verified inventory sent to the supervisor
(``memory_thread``), the shards other agents send here (``replication.Receiver``), and this node's copies to its
buddy and the supervisor's fetch orders (``replication.Sender``), and the copies to the filesystem before the job
stops (``flush_copy.Flusher``). The agent's loop only starts it, passes the
supervisor's orders and requests on, and forwards its events."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from supervisor.agent.flush_copy import Flusher
from supervisor.agent.memory_thread import MemoryThread
from supervisor.agent.replication import DEFAULT_CAP_BYTES_S, Receiver, Sender
from supervisor.heartbeat import wire
from supervisor.heartbeat.orders import Orders

FLUSH_WAIT_S = 20.0


def local_address(toward: tuple[str, int]) -> str:
    """The address of this host on the route to ``toward`` (the supervisor): the node's cluster network, or
    loopback on the local cluster. No packet is sent (a UDP socket's connect only picks the route)."""
    info = socket.getaddrinfo(toward[0], toward[1], type=socket.SOCK_DGRAM)[0]
    with socket.socket(info[0], socket.SOCK_DGRAM) as s:
        s.connect(info[4])
        return str(s.getsockname()[0])


@dataclass
class MemoryTier:
    inventory: MemoryThread
    receiver: Receiver
    sender: Sender
    flusher: Flusher

    @classmethod
    def build(cls, root: Path, key: bytes, *, job: str, node: str, supervisor: tuple[str, int],
              cap_bytes_s: float = DEFAULT_CAP_BYTES_S) -> MemoryTier:  # fmt: skip
        """``key``: the replication key of this Slurm run (``replication_wire.replication_key``)."""
        receiver = Receiver(root, key, job=job, node=node, host=local_address(supervisor))
        return cls(MemoryThread(root, listen=receiver.address), receiver,
                   Sender(root, key, job=job, node=node, cap_bytes_s=cap_bytes_s), Flusher(root))  # fmt: skip

    def start(self) -> None:
        self.receiver.start()
        self.sender.start()
        self.inventory.start()

    def request(self) -> None:
        self.inventory.request()

    def events(self) -> list[wire.Event]:
        return self.inventory.events()

    def obey(self, orders: Orders) -> None:
        if orders.buddy is not None or orders.no_buddy:
            self.sender.set_buddy(orders.buddy)
        if orders.fetches:
            self.sender.fetch(orders.fetches)
        if orders.flush is not None:
            self.flusher.order(orders.flush)

    def holds_snapshots(self) -> bool:
        """The store's newest verified inventory names at least one shard (own or a buddy's)."""
        return bool(self.inventory.last)

    def close(self, flush_wait_s: float = FLUSH_WAIT_S) -> None:
        """Stop; a flush under way is given ``flush_wait_s`` to finish (the job is stopping: it is the copy the
        next run resumes from)."""
        self.flusher.join(flush_wait_s)
        self.inventory.close()
        self.sender.close()
        self.receiver.close()
