"""``creditlens upload FILE --server URL``: send one file of episodes to a running server as a batch.

The file is streamed as it is (the server detects or is told its format and parses it); the answer
names the stored batch, its episodes' links and the delete token. Needs only the client's own
dependencies (httpx); the progress bar for files of 1 MB and more is shown when ``tqdm`` is
installed (the server installs it). The same code runs as ``creditlens upload`` (with the server)
and ``python -m creditlens upload`` (the client alone).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

__all__ = ["API_UPLOADS", "add_arguments", "config_file_text", "main", "run_upload"]

API_UPLOADS = "/api/uploads"  # the server's POST route for whole files (app/core/urls.py names it too)


class _NoBar:
    def __init__(self, **_: Any) -> None:
        pass

    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress_bar(total: int, desc: str, quiet: bool) -> Any:
    if quiet or total < (1 << 20):  # small files skip the bar
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc)


def _chunks(path: Path, bar: Any, size: int = 1 << 20) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(size):
            bar.update(len(chunk))
            yield chunk


def config_file_text(path: str | os.PathLike[str]) -> str:
    """The text of a trainer's configuration file; for a folder, the Hydra run configuration in it
    (``.hydra/config.yaml``, as verl's ``outputs/<date>/<time>/`` holds it). ValueError when there
    is none."""
    p = Path(path)
    if p.is_dir():
        p = p / ".hydra" / "config.yaml" if (p / ".hydra" / "config.yaml").is_file() else p / "config.yaml"
    if not p.is_file():
        raise ValueError(f"creditlens: no configuration file at {path} (nor .hydra/config.yaml in it)")
    return p.read_text(encoding="utf-8")


class _Counted:
    """A file whose reads move the progress bar (a multipart part is read in chunks as it is sent)."""

    def __init__(self, f: Any, bar: Any) -> None:
        self._f = f
        self._bar = bar

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._f.read(size)
        self._bar.update(len(data))
        return data


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``upload`` subcommand's options."""
    p.add_argument("file")
    p.add_argument("--server", default=os.environ.get("CREDITLENS_SERVER", "http://127.0.0.1:8000"))
    p.add_argument("--format", default="auto", help="auto or a format name (see GET /api/formats)")
    p.add_argument("--name", help="batch name (default: the file name)")
    p.add_argument(
        "--token",
        help="write token (default: $CREDITLENS_WRITE_TOKEN); the read token for a private server without one",
    )
    p.add_argument(
        "--visibility",
        choices=["public", "unlisted"],
        help="unlisted: never listed, reachable only by its link (default: the server's setting)",
    )
    p.add_argument(
        "--map",
        action="append",
        metavar="MAPPING",
        help='when no format fits: {native field: record key} as JSON (\'{"messages": "traj", "reward": "reward"}\') '
        "or repeated field=key pairs (--map messages=traj --map group=task_id)",
    )
    p.add_argument(
        "--trainer",
        help="the trainer that computed the file's advantages: verl, trl, openrlhf, skyrl, areal, nemo_rl, "
        "prime_rl or slime (its episodes then open on that trainer's estimator beside yours)",
    )
    p.add_argument(
        "--config",
        help="the trainer's configuration file (verl's .hydra/config.yaml, or the Hydra output folder "
        "holding it; OpenRLHF's arguments; JSON): the estimator, gamma and lambda it names",
    )
    p.add_argument("--json", action="store_true", help="also print the server's JSON answer")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def mapping_arg(items: list[str]) -> str:
    """``--map`` values -> the JSON of the server's ``mapping=``: one JSON object, or ``field=key``
    pairs."""
    if len(items) == 1 and items[0].lstrip().startswith("{"):
        return items[0]
    return json.dumps(dict(item.split("=", 1) for item in items if "=" in item))


def run_upload(args: argparse.Namespace) -> int:
    """Run ``creditlens upload`` with parsed arguments; the exit status (0 stored, 1 refused or
    unreachable, 2 no such file)."""
    import httpx

    path = Path(args.file)
    if not path.is_file():
        print(f"creditlens upload: no such file: {path}", file=sys.stderr)
        return 2
    total = path.stat().st_size
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(total)}
    token = args.token or os.environ.get("CREDITLENS_WRITE_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    params = {"name": args.name or path.name}
    if args.format and args.format != "auto":
        params["format"] = args.format
    if args.visibility:
        params["visibility"] = args.visibility
    if getattr(args, "map", None):
        params["mapping"] = mapping_arg(args.map)
    if getattr(args, "trainer", None):
        params["trainer"] = args.trainer
    config = None
    if getattr(args, "config", None):
        try:
            config = config_file_text(args.config)
        except (ValueError, OSError) as e:
            print(f"creditlens upload: {e}", file=sys.stderr)
            return 2
    base = args.server.rstrip("/")
    url = base + API_UPLOADS
    with _progress_bar(total, path.name, args.quiet) as bar:
        try:
            if config is None:
                r = httpx.post(url, content=_chunks(path, bar), headers=headers, params=params, timeout=600)
            else:  # the file and its trainer's configuration, as two parts of one form
                del headers["Content-Type"], headers["Content-Length"]
                with path.open("rb") as f:
                    part = cast("IO[bytes]", _Counted(f, bar))
                    files: dict[str, tuple[str, IO[bytes] | bytes]] = {
                        "file": (path.name, part),
                        "config": ("config", config.encode()),
                    }
                    r = httpx.post(url, files=files, headers=headers, params=params, timeout=600)
        except httpx.HTTPError as e:
            print(f"creditlens upload: could not reach {url}: {e}", file=sys.stderr)
            return 1
    try:
        body = r.json()
    except ValueError:
        body = {"error": {"message": r.text[:500]}}
    if r.status_code != 201:
        message = body.get("error", {}).get("message", body) if isinstance(body, dict) else body
        print(f"creditlens upload: {r.status_code}: {message}", file=sys.stderr)
        return 1
    n = len(body["episodes"])
    print(
        f"stored batch {body['batch_id']} with {n} episode(s): {base}{body.get('url') or '/b/' + str(body['batch_id'])}"
    )
    for ep in body["episodes"][:5]:
        print(f"  {base}{ep['url']}")
    if n > 5:
        print(f"  ... and {n - 5} more")
    print(f"delete token (shown once): {body['delete_token']}")
    for warning in body.get("warnings") or []:  # e.g. no reward found: stored, but say so
        print(f"creditlens upload: warning: {warning}", file=sys.stderr)
    if args.json:
        print(json.dumps(body))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m creditlens.upload FILE --server URL`` (same as ``creditlens upload``)."""
    p = argparse.ArgumentParser(prog="creditlens upload", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run_upload(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
