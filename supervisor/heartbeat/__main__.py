"""``python -m supervisor.heartbeat``: a standalone aggregator (used by tests and benches)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence

from supervisor.heartbeat.server import AggregatorServer


def main(argv: Sequence[str] | None = None) -> int:
    """Listen, print the address, and keep live.json fresh until ``--duration`` ends or Ctrl-C."""
    p = argparse.ArgumentParser(prog="python -m supervisor.heartbeat", description="a standalone heartbeat aggregator")
    p.add_argument("--campaign", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--bind", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0 = any)")
    p.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0 = never)")
    args = p.parse_args(argv)
    host, _, port = args.bind.rpartition(":")
    server = AggregatorServer(args.campaign, args.job_id, bind=(host or "127.0.0.1", int(port)))
    path = server.write_address_file()
    print(f"aggregator listening on {server.address[0]}:{server.address[1]} ({path})", flush=True)
    deadline = time.monotonic() + args.duration if args.duration > 0 else math.inf
    try:
        while time.monotonic() < deadline:
            server.poll(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
