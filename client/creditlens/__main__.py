"""``python -m creditlens upload|watch|log-metrics ...``: the client's commands, without the server.

With the server installed, the ``creditlens`` command offers the same ones (the same code) beside
serve, migrate, compute and audit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from . import log_metrics, upload, watch


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m creditlens``."""
    p = argparse.ArgumentParser(
        prog="python -m creditlens",
        description="The creditlens client: upload a file, or follow a trainer's dump folder.",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("upload", help="upload a file of episodes to a running server")
    upload.add_arguments(u)
    u.set_defaults(fn=upload.run_upload)
    w = sub.add_parser("watch", help="follow a trainer's dump folder; upload each new step to a run")
    watch.add_arguments(w)
    w.set_defaults(fn=watch.run_watch)
    m = sub.add_parser("log-metrics", help="attach a trainer's own metrics log to a run")
    log_metrics.add_arguments(m)
    m.set_defaults(fn=log_metrics.run_log_metrics)
    return p


def dispatch(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` with ``parser`` and run the subcommand it chose (its ``fn`` default); the
    exit status. The server's ``creditlens`` command dispatches the same way."""
    args = parser.parse_args(argv)
    fn: Callable[[argparse.Namespace], int] = args.fn
    return fn(args)


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
