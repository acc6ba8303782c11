"""The ``creditlens`` command: serve, migrate, upload, watch, compute, audit (upload and watch are
the client's own, ``creditlens.upload`` and ``creditlens.watch``; the rest needs the server).

creditlens serve [--host 127.0.0.1] [--port 8000] [--db PATH_OR_URL] [--demo] [--workers N]
creditlens migrate [--db PATH_OR_URL] [--revision head]
creditlens upload FILE [--server URL] [--format auto] [--name NAME] [--token TOKEN] [--visibility V] [--map M]
creditlens watch DIR --run NAME [--server URL] [--token TOKEN] [--format auto] [--once]
                 [--interval 5] [--state FILE]
creditlens log-metrics RUN FILE [--server URL] [--token TOKEN] [--replace]
creditlens compute FILE --scheme outcome,token_gae [--gamma 1] [--lam 0.95] [--baseline rloo]
                   [--critic upload] [--format auto] [--out FILE]
creditlens audit FILE [--format auto] [--json]    (exit 1 when a finding is an error)
creditlens du [RUN ...] [--server URL] [--token TOKEN] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, TypedDict

from app.core import schemes, urls
from creditlens.__main__ import dispatch


def _db_url(db: str) -> str:
    """A database URL from ``--db``: a URL as is, a file path as a SQLite URL."""
    if "://" in db:
        return db
    return f"sqlite:///{Path(db).expanduser().resolve()}"


def _settings_error(e: Exception) -> str:
    """A settings error without the offending values: they can hold a password (a database URL)."""
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return str(e)
    return "; ".join(
        f"CREDITLENS_{'.'.join(map(str, err['loc'])).upper()}: {err['msg']}" if err["loc"] else err["msg"]
        for err in errors()
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    if args.db:
        os.environ["CREDITLENS_DATABASE_URL"] = _db_url(args.db)
    if args.demo:
        os.environ["CREDITLENS_DEMO"] = "true"
    from app.core.settings import Settings

    try:
        settings = Settings()  # validate now: a bad setting stops here with a clear message
    except Exception as e:
        print(f"creditlens: invalid settings: {_settings_error(e)}", file=sys.stderr)
        return 2
    from app.storage.db import display_url, unwritable_reason

    # A /data that this user cannot write (a bind mount owned by root, say) would otherwise end in
    # a traceback from the first connection: say what to do instead.
    reason = unwritable_reason(settings.database_url)
    if reason:
        print(f"creditlens: {reason}", file=sys.stderr)
        return 2
    if args.workers > 1:
        # Several workers would each migrate and each see an empty database and load the demo:
        # do both once here, before they start (their own start-up then finds nothing to do).
        from sqlmodel import Session

        from app.sim.demo_runs import load_demo_runs
        from app.storage.db import init_db, make_engine
        from app.storage.store import load_demo

        engine = make_engine(settings.database_url)
        init_db(engine)
        if settings.demo:
            with Session(engine) as session:
                if load_demo(session):  # an empty database: the demo's runs too
                    load_demo_runs(session, settings)
        engine.dispose()
        os.environ["CREDITLENS_DEMO"] = "false"
    host_shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    print(
        f"creditlens: serving on http://{host_shown}:{args.port}/  "
        f"(database: {display_url(settings.database_url)}, demo data: {'on' if settings.demo else 'off'})",
        flush=True,
    )
    uvicorn.run(
        "app.main:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
    )
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    if args.db:
        os.environ["CREDITLENS_DATABASE_URL"] = _db_url(args.db)
    from app.core.settings import Settings
    from app.storage.db import make_engine
    from app.storage.migrate import downgrade, upgrade

    engine = make_engine(Settings().database_url)
    if args.revision.startswith("-") or args.revision == "base":
        downgrade(engine, args.revision)
    else:
        upgrade(engine, args.revision)
    print(f"creditlens: database at revision {args.revision}")
    engine.dispose()
    return 0


def compute_file(
    data: bytes,
    *,
    fmt: str | None,
    schemes: list[str],
    gamma: float,
    lam: float,
    baseline: str,
    critic: str,
) -> list[dict[str, Any]]:
    """Offline: every episode of an upload file -> its advantages payload. The file is one batch."""
    import numpy as np

    from app.core.arrays import arrays_from_native
    from app.core.validate import prepare_episode
    from app.ingest import parse_upload

    parsed = parse_upload(data, fmt=fmt)
    for i, ep in enumerate(parsed.episodes):
        prepare_episode(ep, episode=i + 1, line=parsed.lines[i])  # same validation as the server
    # torch: imported only once the file is valid
    from app.compute.advantages import episode_advantages
    from app.compute.batch import BatchContext

    arrays = [arrays_from_native(ep) for ep in parsed.episodes]
    groups = [a.group for a in arrays]
    scores = np.array([a.score for a in arrays])
    rewarded = np.array([a.rewarded for a in arrays], dtype=bool)
    out = []
    for i, a in enumerate(arrays):
        ctx = BatchContext(groups=groups, scores=scores, index=i, _arrays=arrays, rewarded=rewarded)
        payload = episode_advantages(
            a, ctx, schemes=schemes, gamma=gamma, lam=lam, baseline=baseline, critic=critic
        )
        payload["episode_index"] = i + 1
        out.append(payload)
    return out


def cmd_compute(args: argparse.Namespace) -> int:
    from app.core.errors import ApiError

    path = Path(args.file)
    if not path.is_file():
        print(f"creditlens compute: no such file: {path}", file=sys.stderr)
        return 2
    try:
        payloads = compute_file(
            path.read_bytes(),
            fmt=args.format,
            schemes=args.scheme or [],
            gamma=args.gamma,
            lam=args.lam,
            baseline=args.baseline,
            critic=args.critic,
        )
    except ApiError as e:
        print(f"creditlens compute: {e.message}", file=sys.stderr)
        return 1
    from app.http.api._json import dumps

    text = b"\n".join(dumps(p) for p in payloads) + b"\n"
    if args.out:
        Path(args.out).write_bytes(text)
        print(f"wrote {len(payloads)} episode(s) to {args.out}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(text)
    return 0


def _episodes_text(eps: list[int], limit: int = 8) -> str:
    shown = ",".join(map(str, eps[:limit]))
    return shown + (f",… ({len(eps)})" if len(eps) > limit else "")


def audit_text(body: dict[str, Any]) -> str:
    """The audit as lines: the best match, then one line per finding
    (severity, code, episodes (0-based, upload order), token count, message)."""
    bm = body["best_match"]
    if bm.get("scheme"):
        given = dict(bm.get("params") or {})
        given.update(given.pop("options", None) or {})  # a trainer's options, as their own keys
        params = " ".join(f"{k}={v}" for k, v in given.items())
        head = (
            f"best match: {bm['scheme']} {params} (max |diff| {bm['max_abs_diff']:.3g}, "
            f"{100 * bm['share_within_1e-5']:.1f}% of policy tokens within 1e-5)"
        )
    else:
        head = f"best match: none. {bm.get('message', '')}"
    lines = [f"{head}; {body['searched']} configurations searched"]
    for f in body["findings"]:
        lines.append(
            f"{f['severity']:<8}{f['code']}  episodes {_episodes_text(f['episodes'])}  "
            f"{f['token_count']} tokens  {f['message']}"
        )
    if not body["findings"]:
        lines.append("no findings")
    return "\n".join(lines) + "\n"


def cmd_audit(args: argparse.Namespace) -> int:
    from app.core.errors import ApiError

    path = Path(args.file)
    if not path.is_file():
        print(f"creditlens audit: no such file: {path}", file=sys.stderr)
        return 2
    from app.compute.audit import audit_file

    try:
        body = audit_file(path.read_bytes(), fmt=args.format, filename=path.name)
    except ApiError as e:
        print(f"creditlens audit: {e.message}", file=sys.stderr)
        return 2
    if args.json:
        from app.http.api._json import dumps

        sys.stdout.buffer.write(dumps(body) + b"\n")
    else:
        sys.stdout.write(audit_text(body))
    return 1 if body["n_errors"] else 0


def human_bytes(n: int) -> str:
    """``n`` bytes as the ``du -h`` style text: 512 B, 3.4 kB, 12.0 MB, 1.2 GB (powers of 1000)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


class DuRow(TypedDict):
    """One run's line of ``creditlens du``."""

    ref: str
    name: str
    steps: int
    episodes_seen: int
    episodes_kept: int
    stored_bytes: int


def du_rows(runs: list[dict[str, Any]]) -> list[DuRow]:
    """One row per run (a ``GET /api/runs/{id}`` answer): steps, episodes seen and kept, bytes."""
    return [
        {
            "ref": r["ref"],
            "name": r["name"],
            "steps": len(r["steps"]),
            "episodes_seen": sum(s["n_episodes_seen"] for s in r["steps"]),
            "episodes_kept": sum(s["n_episodes_kept"] for s in r["steps"]),
            "stored_bytes": r["stored_bytes"],
        }
        for r in runs
    ]


def du_text(rows: list[DuRow]) -> str:
    """The table ``creditlens du`` prints, with a total line."""
    head = f"{'stored':>10}  {'steps':>6}  {'episodes kept / seen':>22}  run"
    lines = [head]
    for r in rows:
        kept = f"{r['episodes_kept']:,} / {r['episodes_seen']:,}"
        lines.append(
            f"{human_bytes(r['stored_bytes']):>10}  {r['steps']:>6}  {kept:>22}  {r['ref']} {r['name']}"
        )
    total = sum(r["stored_bytes"] for r in rows)
    lines.append(f"{human_bytes(total):>10}  total of {len(rows)} run(s)")
    return "\n".join(lines) + "\n"


def cmd_du(args: argparse.Namespace) -> int:
    """Disk use of runs on a server: every public run, or the ones named (ids, or slugs)."""
    import httpx

    headers = {}
    token = args.token or os.environ.get("CREDITLENS_READ_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    base = args.server.rstrip("/")
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
            refs = list(args.runs)
            if not refs:
                offset = 0
                while True:
                    r = http.get(urls.API_RUNS, params={"limit": 1000, "offset": offset})
                    r.raise_for_status()
                    page = r.json()
                    refs += [run["ref"] for run in page]
                    offset += len(page)
                    if len(page) < 1000:
                        break
            runs = []
            for ref in refs:
                r = http.get(f"{urls.API_RUNS}/{ref}")
                if r.status_code != 200:
                    message = r.json().get("error", {}).get("message", r.text[:300]) if r.text else ""
                    print(f"creditlens du: run {ref}: {r.status_code} {message}", file=sys.stderr)
                    return 1
                runs.append(r.json())
    except httpx.HTTPError as e:
        print(f"creditlens du: could not read {base}: {e}", file=sys.stderr)
        return 1
    rows = du_rows(runs)
    sys.stdout.write(json.dumps(rows) + "\n" if args.json else du_text(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="creditlens", description="See which tokens got the credit.")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("serve", help="run the web service")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--db",
        help="SQLite file path or database URL (default: CREDITLENS_DATABASE_URL or data/creditlens.db)",
    )
    s.add_argument("--demo", action="store_true", help="load fixtures/demo/*.jsonl into an empty database")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--log-level", default="info")
    s.set_defaults(fn=cmd_serve)

    # upload and watch are the client's (client/creditlens/): one implementation, also run as
    # `python -m creditlens upload|watch` where only the client is installed.
    from creditlens import log_metrics, upload, watch

    u = sub.add_parser("upload", help="upload a file of episodes to a running server")
    upload.add_arguments(u)
    u.set_defaults(fn=upload.run_upload)

    m = sub.add_parser("migrate", help="apply database migrations (the server also does this on start)")
    m.add_argument("--db", help="SQLite file path or database URL (default: CREDITLENS_DATABASE_URL)")
    m.add_argument("--revision", default="head", help="target revision: head (default), base, or an id")
    m.set_defaults(fn=cmd_migrate)

    w = sub.add_parser("watch", help="follow a trainer's dump folder; upload each new step to a run")
    watch.add_arguments(w)
    w.set_defaults(fn=watch.run_watch)
    lm = sub.add_parser("log-metrics", help="attach a trainer's own metrics log to a run")
    log_metrics.add_arguments(lm)
    lm.set_defaults(fn=log_metrics.run_log_metrics)

    c = sub.add_parser("compute", help="compute advantages offline (no server), as JSONL")
    c.add_argument("file")
    c.add_argument(
        "--scheme",
        action="append",
        help=f"repeat or comma-separate (default {','.join(schemes.DEFAULT_SCHEMES)}; for an episode without critic values the first of these and {','.join(schemes.DEFAULT_FILL)} that it has the inputs for)",
    )
    c.add_argument("--gamma", type=float, default=schemes.DEFAULT_GAMMA)
    c.add_argument("--lam", type=float, default=schemes.DEFAULT_LAM)
    c.add_argument("--baseline", default=schemes.DEFAULT_BASELINE, help=", ".join(schemes.BASELINES))
    c.add_argument("--critic", default=schemes.DEFAULT_CRITIC, choices=list(schemes.CRITICS))
    c.add_argument("--format", default="auto")
    c.add_argument("--out", help="write JSONL here instead of stdout")
    c.set_defaults(fn=cmd_compute)

    a = sub.add_parser(
        "audit",
        help="audit a file's uploaded advantages offline: the best-matching configuration and the findings "
        "(exit 1 when a finding is an error, 2 when the file cannot be read)",
    )
    a.add_argument("file")
    a.add_argument("--format", default="auto", help="auto or a format name (see GET /api/formats)")
    a.add_argument("--json", action="store_true", help="print the JSON answer of GET /api/batches/{id}/audit")
    a.set_defaults(fn=cmd_audit)

    d = sub.add_parser(
        "du", help="the disk use of training runs on a server: stored bytes, episodes kept / seen"
    )
    d.add_argument("runs", nargs="*", help="run ids or slugs (default: every public run)")
    d.add_argument("--server", default=os.environ.get("CREDITLENS_SERVER", "http://127.0.0.1:8000"))
    d.add_argument("--token", help="the server's read token, if it has one (default: $CREDITLENS_READ_TOKEN)")
    d.add_argument("--json", action="store_true", help="one JSON list instead of the table")
    d.set_defaults(fn=cmd_du)
    return p


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
