"""``creditlens log-metrics RUN FILE``: attach a trainer's own metrics log to a run on a server.

``RUN`` is the run's id or slug (as in its URL ``/r/RUN``), or its exact name (the newest public
run of that name). ``FILE``: verl's file logger JSONL, TRL's ``trainer_state.json``, prime-rl's
``metrics.jsonl``, a W&B history export, or their gzip. Merged by step into what the run already
has (``--replace``: instead of it). Needs only the client's own dependencies (httpx); the same code
runs as ``creditlens log-metrics`` (with the server) and ``python -m creditlens log-metrics``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .wire import PROTOCOL_HEADER, PROTOCOL_VERSION

__all__ = ["add_arguments", "run_log_metrics"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``log-metrics`` subcommand's options."""
    p.add_argument("run", help="the run's id or slug (as in /r/RUN), or its exact name")
    p.add_argument("file", help="the trainer's metrics log (JSONL, JSON, or their gzip)")
    p.add_argument("--server", default=os.environ.get("CREDITLENS_SERVER", "http://127.0.0.1:8000"))
    p.add_argument("--token", help="write token (default: $CREDITLENS_WRITE_TOKEN)")
    p.add_argument("--replace", action="store_true", help="drop the run's earlier logged metrics first")
    p.add_argument("--json", action="store_true", help="also print the server's JSON answer")


def _error(r: object) -> str:
    try:
        err = r.json()["error"]  # type: ignore[attr-defined]
        return f"{err['code']}: {err['message']}"
    except Exception:  # noqa: BLE001 - not our error shape (a proxy's page)
        return str(getattr(r, "text", ""))[:300]


def run_log_metrics(args: argparse.Namespace) -> int:
    """Run ``creditlens log-metrics`` with parsed arguments; the exit status (0 stored, 1 refused
    or unreachable, 2 no such file or run)."""
    import httpx

    path = Path(args.file)
    if not path.is_file():
        print(f"creditlens log-metrics: no such file: {path}", file=sys.stderr)
        return 2
    headers = {PROTOCOL_HEADER: str(PROTOCOL_VERSION)}
    token = args.token or os.environ.get("CREDITLENS_WRITE_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    base = args.server.rstrip("/")
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=600) as http:
            ref = args.run
            if http.get(f"/api/runs/{ref}").status_code == 404:
                runs = http.get("/api/runs", params={"name": ref}).json()
                named = [r for r in runs if isinstance(r, dict) and r.get("name") == ref]
                if not named:
                    print(
                        f"creditlens log-metrics: no run {ref!r} (by id, slug or name) on {base}",
                        file=sys.stderr,
                    )
                    return 2
                ref = max(named, key=lambda r: r["id"])["ref"]
            r = http.post(
                f"/api/runs/{ref}/logged-metrics",
                params={"replace": "true"} if args.replace else {},
                files={"file": (path.name, path.read_bytes())},
            )
    except httpx.HTTPError as e:
        print(f"creditlens log-metrics: could not reach {base}: {e}", file=sys.stderr)
        return 1
    if r.status_code != 201:
        print(f"creditlens log-metrics: refused (HTTP {r.status_code}) {_error(r)}", file=sys.stderr)
        return 1
    body = r.json()
    if args.json:
        print(json.dumps(body, indent=2))
    skipped = f"; {body['n_skipped']} values that are not numbers skipped" if body["n_skipped"] else ""
    print(
        f"attached {body['n_steps']} steps × {body['n_metrics']} metrics ({body['source']}) to run "
        f"{body['ref']}{skipped}: {base}/r/{body['ref']}"
    )
    return 0
