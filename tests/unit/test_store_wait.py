"""client/store_wait.py: at a restart, a rank other than 0 waits for the new rendezvous's store to listen before the
program's own connect (which would back off and sleep past its opening), at most WAIT_S."""

from __future__ import annotations

import socket
import threading
import time

from supervisor.client import store_wait


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_rank_waits_until_the_store_listens_then_goes_on_at_once() -> None:
    port = _free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def open_later() -> None:
        time.sleep(0.3)
        server.bind(("127.0.0.1", port))
        server.listen()

    opener = threading.Thread(target=open_later)
    opener.start()
    try:
        waited = store_wait.wait_for_store({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "3"})
        assert waited is not None and 0.2 <= waited < 0.3 + 0.5, waited  # a poll after the opening, not a back-off
    finally:
        opener.join()
        server.close()


def test_rank_0_and_an_order_without_a_rendezvous_do_not_wait_and_a_store_that_never_opens_costs_at_most_the_bound() -> None:
    port = _free_port()
    assert store_wait.wait_for_store({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0"}) is None
    assert store_wait.store_address({"MASTER_ADDR": "h", "MASTER_PORT": "x", "RANK": "1"}) is None
    assert store_wait.store_address({"MASTER_PORT": "29500", "RANK": "1"}) is None
    assert store_wait.store_address({"MASTER_ADDR": "h", "MASTER_PORT": "70000", "RANK": "1"}) is None
    assert store_wait.store_address({"MASTER_ADDR": "h", "MASTER_PORT": "29500", "RANK": "1"}) == ("h", 29500)
    started = time.monotonic()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1"}
    assert store_wait.wait_for_store(env, wait_s=0.2) is None  # nothing listens: the program's own connect decides
    assert time.monotonic() - started < 1.5
