"""``creditlens watch DIR --server URL --run NAME``: follow a trainer's dump folder and upload each
new step once, in step order, as a step of one run (created, or resumed by name).

Dump files it knows (the step is in the file name):

* verl ``trainer.rollout_data_dir``: ``{step}.jsonl`` (format ``verl_rollout``)
* NeMo-RL: ``train_data_step{N}.jsonl`` (format ``nemo_rl``)
* TRL ``log_completions``: ``completions/completions_{step:05d}.parquet`` (format ``trl_completions``;
  DIR may be the output folder or its ``completions/``)
* slime ``--dump-details``: ``rollout_data/{rollout_id}.pt`` (format ``slime_pt``; DIR may be the
  dump folder or its ``rollout_data/``). The per-rank ``train_data/{id}_{rank}.pt`` files are not
  followed: one step would be several files.
* prime-rl ``enable_token_export``: ``token_exports/step_{N}/rank_{R}.jsonl`` (format
  ``prime_rl_tokens``; DIR may be the output folder or its ``token_exports/``). A step is a folder
  with one file per rank; it is sent once, as its rank files joined in rank order, when the trainer
  has put its ``STABLE`` marker there (every rank flushed) and every rank file is whole.
* SkyRL ``trainer.dump_data_batch``: ``dumped_data/global_step_{N}_training_input.pkl`` (format
  ``skyrl_dump``; DIR may be the export path or its ``dumped_data/``).

A file is uploaded once it is complete: its size and mtime are the same on two looks
``--interval`` seconds apart and it parses (every JSONL line is JSON; a parquet file has its footer
and both ``PAR1`` magics; a ``.pt`` file is a whole zip archive). What was sent is remembered in a
small JSON state file (step -> file, sha256, size, what the server said), replaced atomically after
every step, so a restarted ``watch`` goes on where it stopped and never sends a step again. A 409
(the run already has the step) counts as sent. While the server is down the client retries with
backoff (creditlens.client.Run.send) and ``watch`` keeps trying the same step, in order, until the
server answers.

Needs only what the client needs (httpx); nothing here parses episodes: the server does.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import re
import signal
import sys
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .client import Client, Run

__all__ = ["DUMP_KINDS", "DumpKind", "Watcher", "add_arguments", "main", "run_watch"]

STATE_VERSION = 1


@dataclass(frozen=True)
class DumpKind:
    """One trainer's dump files: the server's format name, the file-name pattern (group 1 = the
    step), the sub-folders of DIR where the trainer puts them, and how completeness is checked."""

    format: str
    pattern: re.Pattern[str]
    subdirs: tuple[str, ...]
    check: str  # "jsonl" | "parquet" | "zip" | "pickle"
    label: str
    # A step is a folder (its name matches ``step_dirs``, group 1 = the step) holding one file per
    # rank (``pattern``, group 1 = the rank), complete once ``marker`` is there (None: no marker).
    step_dirs: re.Pattern[str] | None = None
    marker: str | None = None
    trainer: str | None = None  # the trainer that writes these files (the server's trainer name)


DUMP_KINDS: dict[str, DumpKind] = {
    k.format: k
    for k in (
        DumpKind(
            "verl_rollout",
            re.compile(r"(\d+)\.jsonl"),
            ("",),
            "jsonl",
            "verl rollout_data_dir",
            trainer="verl",
        ),
        DumpKind(
            "nemo_rl",
            re.compile(r"train_data_step(\d+)\.jsonl"),
            ("",),
            "jsonl",
            "NeMo-RL train_data",
            trainer="nemo_rl",
        ),
        DumpKind(
            "trl_completions",
            re.compile(r"completions_(\d+)\.parquet"),
            ("", "completions"),
            "parquet",
            "TRL completions",
            trainer="trl",
        ),
        DumpKind(
            "slime_pt",
            re.compile(r"(\d+)\.pt"),
            ("", "rollout_data"),
            "zip",
            "slime rollout dump",
            trainer="slime",
        ),
        DumpKind(
            "skyrl_dump",
            re.compile(r"global_step_(\d+)_training_input\.pkl"),
            ("", "dumped_data"),
            "pickle",
            "SkyRL dumped_data",
            trainer="skyrl",
        ),
        DumpKind(
            "prime_rl_tokens",
            re.compile(r"rank_(\d+)\.jsonl"),
            ("", "token_exports"),
            "jsonl",
            "prime-rl token_exports",
            step_dirs=re.compile(r"step_(\d+)"),
            marker="STABLE",
            trainer="prime_rl",
        ),
    )
}


@dataclass
class StepFile:
    step: int
    path: Path
    kind: DumpKind


@dataclass
class _Look:
    size: int
    mtime_ns: int
    reported: bool = False  # "waiting for ..." printed for this size already


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


# ---------------------------------------------------------------------------------- completeness


def incomplete_reason(data: bytes, check: str) -> str | None:
    """Why ``data`` is not yet a whole dump file of this kind (None: it is whole)."""
    if not data:
        return "empty"
    if check == "jsonl":
        for i, line in enumerate(data.split(b"\n"), start=1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except ValueError:
                return f"line {i} is not complete JSON"
        return None
    if check == "parquet":
        # A parquet file is "PAR1", the column chunks, the footer, its 4-byte length, "PAR1":
        # the writer puts the footer last, so a file with both magics and a footer that fits is whole.
        if len(data) < 12 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
            return "no parquet footer yet"
        footer = int.from_bytes(data[-8:-4], "little")
        if footer <= 0 or footer > len(data) - 12:
            return "the parquet footer length does not fit the file"
        return None
    if check == "zip":
        # torch.save writes a zip archive whose central directory comes last.
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as zf:
                zf.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            return f"not a whole zip archive yet ({e})"
        return None
    if check == "pickle":
        # pickle.dump writes the protocol opcode first and STOP (".") last; nothing is unpickled here.
        if data[:1] != b"\x80" or not data.endswith(b"."):
            return "not a whole pickle yet (no STOP opcode at its end)"
        return None
    raise ValueError(f"unknown check {check!r}")


# ---------------------------------------------------------------------------------- step folders


def rank_files(folder: Path, kind: DumpKind) -> list[Path]:
    """The rank files of a step folder, in rank order."""
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    ranks = [(int(m.group(1)), n) for n in names if (m := kind.pattern.fullmatch(n))]
    return [folder / n for _, n in sorted(ranks)]


def signature(f: StepFile) -> tuple[int, int] | None:
    """(size, mtime_ns) of a step file, or of a step folder's rank files together (total size,
    latest mtime; the marker's presence counts as one byte); None when it is gone."""
    try:
        if f.kind.step_dirs is None:
            st = f.path.stat()
            return st.st_size, st.st_mtime_ns
        stats = [p.stat() for p in rank_files(f.path, f.kind)]
        marked = f.kind.marker is not None and (f.path / f.kind.marker).exists()
    except FileNotFoundError:
        return None
    if not stats:
        return None
    return sum(s.st_size for s in stats) + marked, max(s.st_mtime_ns for s in stats)


def read_step(f: StepFile) -> tuple[bytes, str | None]:
    """(the bytes to upload, why the step is not complete yet or None). A step folder's rank
    files are joined in rank order, each ending with a newline (JSONL)."""
    if f.kind.step_dirs is None:
        return f.path.read_bytes(), None
    if f.kind.marker is not None and not (f.path / f.kind.marker).exists():
        n = len(rank_files(f.path, f.kind))
        return b"", f"no {f.kind.marker} marker yet ({n} rank file(s) so far)"
    parts = []
    for p in rank_files(f.path, f.kind):
        data = p.read_bytes()
        if not data:
            continue  # a rank with nothing to export (the marker says every rank flushed)
        why = incomplete_reason(data, f.kind.check)
        if why is not None:
            return b"", f"{p.name}: {why}"
        parts.append(data if data.endswith(b"\n") else data + b"\n")
    return b"".join(parts), None


# ---------------------------------------------------------------------------------- state


def default_state_path(folder: Path, run_name: str) -> Path:
    """The state file next to DIR: ``<DIR>.creditlens-watch-<run>.json`` in DIR's parent."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_name)[:80] or "run"
    folder = folder.resolve()
    return folder.parent / f".{folder.name}.creditlens-watch-{safe}.json"


def load_state(path: Path) -> dict[str, Any]:
    """The state file's content, or a fresh state when it does not exist."""
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {"version": STATE_VERSION, "steps": {}}
    if not isinstance(state, dict) or not isinstance(state.get("steps"), dict):
        raise ValueError(f"{path} is not a creditlens watch state file")
    return state


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Write the state atomically: a temp file in the same folder, fsynced, then renamed over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------- the watcher


@dataclass
class Watcher:
    """Follows ``folder`` and sends each complete step file to ``run`` in step order.

    ``fmt``: a DUMP_KINDS name, or "auto" (the kind is read from the file names). ``out``: where
    progress lines go. Call :meth:`look` repeatedly, ``interval`` seconds apart."""

    folder: Path
    run: Run
    state_path: Path
    fmt: str = "auto"
    out: Any = sys.stdout
    state: dict[str, Any] = field(default_factory=dict)
    looks: dict[Path, _Look] = field(default_factory=dict)
    server_down: bool = False
    stuck: str | None = None  # the first pending file is unchanged but not whole (why)
    busy: bool = False  # between a step's answer and its saved state
    stop_requested: bool = False
    max_sent: int = -1
    _changed_warned: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.state = load_state(self.state_path)
        name = self.state.get("run")
        if name is not None and name != self.run.name:
            raise ValueError(
                f"{self.state_path} belongs to run {name!r}, not {self.run.name!r}; pass --state "
                "to keep a separate state file for this run."
            )
        self.state.update(version=STATE_VERSION, run=self.run.name, folder=str(self.folder.resolve()))
        done = [int(s) for s, e in self.state["steps"].items() if e.get("status") in ("sent", "exists")]
        self.max_sent = max(done, default=-1)

    def check_run(self) -> None:
        """ValueError when the run found by name is not the one the state's steps went to (a
        second run of that name, or a server that lost it): sending on would split the steps."""
        had = self.state.get("run_id")
        if self.run.id is not None and had is not None and had != self.run.id:
            raise ValueError(
                f"{self.state_path} records steps sent to run {had}, but the run named "
                f"{self.run.name!r} on {self.run._client.url} is now run {self.run.id}; pass another "
                "--state (or --run) to start over."
            )

    def say(self, msg: str) -> None:
        print(msg, file=self.out, flush=True)

    # -- discovery ------------------------------------------------------------------------------

    def kinds(self) -> list[DumpKind]:
        return list(DUMP_KINDS.values()) if self.fmt == "auto" else [DUMP_KINDS[self.fmt]]

    def scan(self) -> list[StepFile]:
        """Step files present now, by step. In auto mode one kind must own all of them."""
        found: dict[str, dict[int, Path]] = {}
        for kind in self.kinds():
            for sub in kind.subdirs:
                d = self.folder / sub if sub else self.folder
                try:
                    entries = list(os.scandir(d))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for e in entries:
                    if kind.step_dirs is not None:
                        m = kind.step_dirs.fullmatch(e.name)
                        if not (m and e.is_dir() and rank_files(Path(e.path), kind)):
                            continue
                    else:
                        m = kind.pattern.fullmatch(e.name)
                        if not (m and e.is_file()):
                            continue
                    found.setdefault(kind.format, {}).setdefault(int(m.group(1)), Path(e.path))
        if len(found) > 1:
            raise ValueError(
                f"{self.folder} holds dump files of several trainers ("
                + ", ".join(DUMP_KINDS[k].label for k in found)
                + "); pass --format to choose one."
            )
        if not found:
            return []
        ((fmt, steps),) = found.items()
        return [StepFile(s, p, DUMP_KINDS[fmt]) for s, p in sorted(steps.items())]

    # -- one look ---------------------------------------------------------------------------------

    def pending(self, files: list[StepFile]) -> list[StepFile]:
        """Files still to send: not in the state, or refused before and changed since."""
        out = []
        for f in files:
            entry = self.state["steps"].get(str(f.step))
            if entry is None:
                out.append(f)
            elif entry.get("status") == "refused":
                sig = signature(f)
                if sig is None:
                    continue
                if sig != (entry.get("size"), entry.get("mtime_ns")):
                    out.append(f)
            elif f.step not in self._changed_warned:
                sig = signature(f)
                if sig is None:
                    continue
                if sig[0] != entry.get("size"):
                    self._changed_warned.add(f.step)
                    self.say(
                        f"note: step {f.step} ({f.path.name}) changed after it was sent; steps are "
                        "sent once, so the server keeps the first version."
                    )
        return out

    def ready(self, f: StepFile) -> bytes | None:
        """The file's bytes when it is complete (same size and mtime as on the last look, and it
        parses; a step folder: its marker is there and every rank file is whole); else None, and a
        "waiting" line once per size seen."""
        sig = signature(f)
        if sig is None:
            self.looks.pop(f.path, None)
            return None
        prev = self.looks.get(f.path)
        now = _Look(*sig)
        if prev is None or (prev.size, prev.mtime_ns) != (now.size, now.mtime_ns):
            self.looks[f.path] = now  # first sight of this version: look again next time
            return None
        data, why = read_step(f)
        sig2 = signature(f)
        if sig2 != sig:
            if sig2 is not None:
                self.looks[f.path] = _Look(*sig2)
            return None
        if why is None:
            why = incomplete_reason(data, f.kind.check)
        self.stuck = None if why is None else f"step {f.step} ({f.path.name}): {why}"
        if why is not None:
            if not prev.reported:
                prev.reported = True
                self.say(f"waiting for step {f.step} ({f.path.name}, {_human(len(data))}): {why}")
            return None
        return data

    def look(self) -> tuple[int, int]:
        """Send every complete pending step in order, stopping at the first one that is not
        complete or not taken. Returns (steps sent now, steps still pending)."""
        self.check_run()
        todo = self.pending(self.scan())
        self.stuck = None
        sent = 0
        for i, f in enumerate(todo):
            data = self.ready(f)
            if data is None:
                return sent, len(todo) - i  # later steps wait: uploads go in step order
            if not self.send(f, data):
                return sent, len(todo) - i
            sent += 1
        return sent, 0

    def send(self, f: StepFile, data: bytes) -> bool:
        """Post one step; True when it is settled (sent, already there, or refused)."""
        if self.run.trainer is None:  # the dump's own trainer, unless --trainer said otherwise
            self.run.trainer = f.kind.trainer
        r = self.run.send(f.step, data, f.kind.format, name=f"{self.run.name} · step {f.step}")
        if r is None:
            if not self.server_down:
                self.server_down = True
                self.say(
                    f"server {self.run._client.url} is not answering; step {f.step} will be sent when it does"
                )
            return False
        self.check_run()  # the run may have been created or found only now
        # From the answer to the saved state a SIGTERM waits (see run_watch): a step the server
        # took is always in the state file, so a restart never posts it again.
        self.busy = True
        try:
            self._settle(f, data, r)
        finally:
            self.busy = False
        if self.stop_requested:
            raise KeyboardInterrupt
        return True

    def _settle(self, f: StepFile, data: bytes, r: Any) -> None:
        """Record the server's answer for step ``f`` in the state file, then print it."""
        lines = []
        if self.server_down:
            self.server_down = False
            lines.append(f"server {self.run._client.url} is answering again")
        entry = {
            "file": f.path.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "size": self.looks[f.path].size,  # the file's (a step folder's: its rank files')
            "mtime_ns": self.looks[f.path].mtime_ns,
            "at": _now(),
        }
        order = f" (after step {self.max_sent}: out of order)" if f.step < self.max_sent else ""
        if r.status_code == 409:
            entry["status"] = "exists"
            lines.append(f"exists step {f.step} ({f.path.name}): the run already has it{order}")
        elif r.status_code < 300:
            body = r.json()
            n = len(body.get("episodes") or [])
            entry.update(status="sent", batch_id=body.get("batch_id"), n_episodes=n)
            link = self.run._client.absolute(f"/b/{body['batch_id']}") if "batch_id" in body else ""
            lines.append(
                f"sent step {f.step} ({f.path.name}, {_human(len(data))}): {n} episode(s) -> {link}{order}"
            )
        else:
            try:
                msg = r.json()["error"]["message"]
            except Exception:  # noqa: BLE001 - not our error shape
                msg = r.text[:300]
            entry.update(status="refused", http_status=r.status_code, error=msg)
            lines.append(f"refused step {f.step} ({f.path.name}): HTTP {r.status_code} {msg}")
        if entry["status"] != "refused":
            self.max_sent = max(self.max_sent, f.step)
        self.state["run_id"] = self.run.id
        self.state["server"] = self.run._client.url
        self.state["steps"][str(f.step)] = entry
        save_state(self.state_path, self.state)
        for ln in lines:
            self.say(ln)


# ---------------------------------------------------------------------------------- command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``watch`` subcommand's options."""
    p.add_argument("dir", help="the trainer's dump folder")
    p.add_argument("--server", default=os.environ.get("CREDITLENS_SERVER", "http://127.0.0.1:8000"))
    p.add_argument("--run", required=True, help="run name: created, or resumed when it exists")
    p.add_argument("--token", help="write token (default: $CREDITLENS_WRITE_TOKEN)")
    p.add_argument(
        "--format",
        default="auto",
        choices=["auto", *DUMP_KINDS],
        help="the dump kind (default: from the file names)",
    )
    p.add_argument(
        "--trainer",
        help="the trainer whose advantages the dumps carry (default: the one that writes this dump kind)",
    )
    p.add_argument(
        "--config",
        help="the trainer's configuration file, sent with the new run: verl's .hydra/config.yaml (or the "
        "Hydra output folder holding it), OpenRLHF's arguments, JSON",
    )
    p.add_argument("--once", action="store_true", help="upload the complete step files there now, then exit")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between looks (default 5)")
    p.add_argument("--state", help="state file (default: .<DIR>.creditlens-watch-<run>.json next to DIR)")
    p.add_argument(
        "--max-backoff",
        type=float,
        default=30.0,
        help="longest wait between retries while the server is down (seconds, default 30)",
    )


def run_watch(args: argparse.Namespace) -> int:
    """Run ``creditlens watch`` with parsed arguments; the exit status (0 ok, 1 a step was
    refused or not sent with --once, 2 bad arguments)."""
    folder = Path(args.dir)
    if folder.exists() and not folder.is_dir():
        print(f"creditlens watch: {folder} is not a folder", file=sys.stderr)
        return 2
    if args.interval <= 0:
        print("creditlens watch: --interval must be positive", file=sys.stderr)
        return 2
    state_path = Path(args.state) if args.state else default_state_path(folder, args.run)
    token = args.token or os.environ.get("CREDITLENS_WRITE_TOKEN")
    # The client's own warnings would repeat what the lines below say about each step.
    logging.getLogger("creditlens").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="creditlens: ", category=RuntimeWarning)
    client = Client(args.server, token, max_backoff=args.max_backoff, create_timeout=2.0)
    try:
        run = client.run(args.run, resume=True, trainer=args.trainer, config=args.config)
    except ValueError as e:
        print(f"creditlens watch: {e}", file=sys.stderr)
        return 2
    try:
        w = Watcher(folder, run, state_path, fmt=args.format)
    except ValueError as e:
        print(f"creditlens watch: {e}", file=sys.stderr)
        return 2

    def on_term(*_: object) -> None:
        # SIGTERM ends like Ctrl-C, but never between a step's answer and its saved state.
        w.stop_requested = True
        if not w.busy:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    done = sum(e.get("status") in ("sent", "exists") for e in w.state["steps"].values())
    where = f"run {run.name!r}" + (f" ({run.url})" if run.url else " (the server is not answering yet)")
    w.say(f"watching {folder} for {where}; state {state_path}; {done} step(s) already sent")
    try:
        while True:
            try:
                _, left = w.look()
            except ValueError as e:
                print(f"creditlens watch: {e}", file=sys.stderr)
                return 2
            if args.once and left == 0:
                break
            if run._disabled:
                print(f"creditlens watch: the server refused run {run.name!r}", file=sys.stderr)
                return 1
            if args.once and w.stuck:
                print(f"creditlens watch: not complete, not sent: {w.stuck}", file=sys.stderr)
                return 1
            if args.once and w.server_down:
                print(
                    f"creditlens watch: {left} step(s) not sent: the server is not answering", file=sys.stderr
                )
                return 1
            time.sleep(args.interval)
    except KeyboardInterrupt:
        w.say("stopped")
    finally:
        run.close(timeout=1.0)
        client.close()
    refused = [s for s, e in w.state["steps"].items() if e.get("status") == "refused"]
    return 1 if refused else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m creditlens.watch DIR --server URL --run NAME`` (same as ``creditlens watch``)."""
    p = argparse.ArgumentParser(prog="creditlens watch", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run_watch(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
