"""``supervise site serve|token|nodes|forgive|url``: the site-wide node ledger's service and its operators' commands.

    supervise site serve --dir DIR [--listen HOST:PORT] [--repair]   the service (one per site, on an admin node)
    supervise site token --dir DIR --user NAME [--admin]      issue NAME's token into a 0600 file
    supervise site nodes --url URL --token-file F [--json]    every node's lemon score and evidence
    supervise site forgive NODE --url URL --token-file F      an operator returns a repaired node
    supervise site url --url URL --token-file F [--days D]    the fleet page's address with a read-only view key

``serve`` writes the operators' token to ``DIR/token`` (0600) at its first start. Rules and API: docs/site.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HELP = "the site-wide node ledger: serve it, issue tokens, list nodes, forgive a repaired node, open the fleet page"
ADMIN = "site-admin"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="site_command", metavar="SITE_COMMAND", parser_class=type(parser))
    sub.required = True
    serve = sub.add_parser("serve", help="run the service", description="run the site service")
    serve.add_argument("--dir", required=True, help="the service's directory (database, operators' token)")
    serve.add_argument("--listen", default="127.0.0.1:8787", metavar="HOST:PORT", help="default 127.0.0.1:8787")
    serve.add_argument("--repair", action="store_true",
                       help="drain, reboot and resume nodes through scontrol (operator rights; docs/site.md)")
    serve.add_argument("--repair-every", type=float, default=60.0, metavar="S", help="seconds between rounds")
    serve.add_argument("--no-job-watch", action="store_true",
                       help="do not read the campaigns' jobs from Slurm for them (each asks slurmctld itself)")
    serve.add_argument("--repair-max-share", type=float, default=0.1, metavar="F",
                       help="never hold more than this share of the nodes drained (default 0.1)")
    token = sub.add_parser("token", help="issue a user's token", description="issue a user's token (replaces theirs)")
    token.add_argument("--dir", required=True, help="the service's directory")
    token.add_argument("--user", required=True, help="the user name the token signs for")
    token.add_argument("--admin", action="store_true", help="an operator's token (may forgive nodes)")
    token.add_argument("--out", help="the token file to write (default: ./USER.site-token)")
    for name, text in (("nodes", "every node's lemon score"), ("forgive", "return a repaired node (operators)"),
                       ("url", "print the fleet page's address with a read-only view key (operators)")):  # fmt: skip
        p = sub.add_parser(name, help=text, description=text)
        if name == "forgive":
            p.add_argument("node", metavar="NODE")
        p.add_argument("--url", required=True, help="the service, e.g. http://admin1:8787")
        p.add_argument("--token-file", required=True, help="USER:TOKEN, as `supervise site token` wrote it")
        if name == "nodes":
            p.add_argument("--json", action="store_true", help="print the scores as JSON")
        if name == "url":
            p.add_argument("--days", type=float, default=7.0, metavar="D",
                           help="how long the key works (default 7; a Prometheus scrape key: e.g. 365)")
            p.add_argument("--key-only", action="store_true",
                           help="print only the key (Prometheus: authorization credentials_file)")


def _listen(text: str) -> tuple[str, int]:
    from supervisor.errors import UsageError

    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text!r} is not HOST:PORT", "e.g. --listen 0.0.0.0:8787")
    return host, int(port)


def run(args: argparse.Namespace) -> int:
    return {"serve": serve, "token": token, "nodes": nodes, "forgive": forgive, "url": url}[args.site_command](args)


def serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from supervisor.site.auth import new_token
    from supervisor.site.client import Credentials, write_token_file
    from supervisor.site.server import SiteApi, make_server
    from supervisor.site.store import SiteStore

    host, port = _listen(args.listen)
    if args.repair and not (args.repair_every >= 1 and 0 < args.repair_max_share <= 1):
        from supervisor.errors import UsageError

        raise UsageError("--repair-every must be >= 1 and --repair-max-share in (0, 1]", "e.g. --repair-every 60")
    store = SiteStore(args.dir)
    admin_file = Path(args.dir) / "token"
    if store.token_of(ADMIN) is None or not admin_file.exists():
        secret = new_token()
        store.set_token(ADMIN, secret, admin=True, t=time.time())
        write_token_file(admin_file, Credentials(ADMIN, secret))
    from supervisor.site.job_watch import JobWatch, serve_job_watch

    def say(line: str) -> None:
        print(line, flush=True)

    job_watch = None
    if not args.no_job_watch:
        from slurm.client import get_client
        from supervisor.errors import SupervisorError

        try:
            job_watch = JobWatch(get_client(), log=say)
        except SupervisorError as err:  # no Slurm here: campaigns ask slurmctld themselves
            say(f"job watch off: {err.plain()}")
    api = SiteApi(store, job_watch=job_watch)
    try:
        server = make_server(api, host, port)
    except OSError as err:
        from supervisor.errors import SiteError

        raise SiteError(f"cannot listen on {host}:{port} ({err.strerror})", "pick another --listen port") from None
    stop = threading.Event()
    if job_watch is not None:
        threading.Thread(target=serve_job_watch, args=(job_watch, stop), daemon=True, name="job-watch").start()
    if args.repair:
        from slurm.client import get_client
        from supervisor.decisions.repair import RepairConfig
        from supervisor.site.repair_loop import RepairLoop, serve_repairs

        loop = RepairLoop(store, get_client(), api.lock, config=RepairConfig(args.repair_max_share))
        threading.Thread(target=serve_repairs, args=(loop, args.repair_every, stop, lambda line: print(line,
                         flush=True)), daemon=True).start()  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    print(f"site service on http://{host}:{server.server_address[1]} (operators' token: {admin_file}"
          f"{'; repair loop on' if args.repair else ''})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
        with api.lock:
            store.close()
    return 0


def token(args: argparse.Namespace) -> int:
    from supervisor.errors import UsageError
    from supervisor.site.auth import SiteAuthError, new_token, valid_user
    from supervisor.site.client import Credentials, write_token_file
    from supervisor.site.store import SiteStore

    try:
        user = valid_user(args.user)
    except SiteAuthError as err:
        raise UsageError(f"--user: {err.problem}", err.fix) from None
    out = Path(args.out or f"{user}.site-token")
    secret = new_token()
    store = SiteStore(args.dir)
    store.set_token(user, secret, admin=args.admin, t=time.time())
    store.close()
    write_token_file(out, Credentials(user, secret))
    print(f"wrote {out} ({user}'s token{', an operator' if args.admin else ''}; any earlier one no longer works): "
          f"give it to {user}, who names it in [site] token_file")  # fmt: skip
    return 0


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from supervisor.site.client import SiteClient, read_token_file

    return SiteClient(args.url, read_token_file(args.token_file))


def nodes(args: argparse.Namespace) -> int:
    rows = _client(args).request("GET", "/v1/nodes").get("nodes") or []
    if args.json:
        print(json.dumps({"nodes": rows}, indent=2))
        return 0
    if not rows:
        print("no node has a verdict or a job in the window")
        return 0
    print(f"{'NODE':<16} {'FAILURES':>8} {'USERS':>5} {'P':>9} {'LEMON':>5}  WHY")
    for r in rows:
        p = "-" if r.get("p_value") is None else f"{r['p_value']:.2g}"
        print(f"{r['node']:<16} {r['failures']:>8} {r['users']:>5} {p:>9} {'yes' if r['lemon'] else 'no':>5}  "
              f"{r['why']}")
    return 0


def forgive(args: argparse.Namespace) -> int:
    from slurm.hostlist import validate_node_name

    node = validate_node_name(args.node)
    _client(args).request("POST", "/v1/forgive", {"node": node})
    print(f"forgave {node}: verdicts before now no longer count against it")
    return 0


def url(args: argparse.Namespace) -> int:
    """No request: the key is made here from the token file (an HMAC the service checks on each read)."""
    from supervisor.errors import UsageError
    from supervisor.site.auth import view_key
    from supervisor.site.client import read_token_file

    if not (0 < args.days <= 3660):
        raise UsageError(f"--days {args.days:g} is out of range", "give a number of days between 0 and 3660")
    credentials = read_token_file(args.token_file)
    key = view_key(credentials.user, credentials.token, time.time() + args.days * 86400)
    print(key if args.key_only else f"{args.url.rstrip('/')}/#key={key}")
    return 0
