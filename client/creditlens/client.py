"""``Client`` and ``Run``: log a training run into a creditlens server, one batch per step.

Logging never breaks or stalls the training loop, and loses no step short of a full disk:

* ``run.log`` / ``run.log_tensors`` copy their arguments and return. Two daemon threads per run
  do the rest: a writer serialises each step and writes it to the run's spool folder on disk
  (``spool_dir``, see ``creditlens._spool``), a sender posts the spooled steps in order and
  removes each file once the server has answered for it. Steps waiting for the writer are bounded
  by count (``max_queue``) and bytes (``max_queue_bytes``); when that is full, ``log`` waits for
  the writer (local work, never the network). Only beyond ``max_spool_bytes`` on disk (or when
  the disk refuses a write) is a step dropped, counted in ``run.dropped``, with one warning.
* A server that is down, slow (connect/read timeouts) or answering 429/502/503/504 costs
  retries with exponential backoff and jitter for as long as the run is open; other 5xx
  answers are retried ``max_retries`` times, then the step is given up (``run.failed``). A 4xx
  answer is not retried: it is logged once per kind and counted in ``run.failed``. A 409 (the
  step exists, e.g. sent again after a restart) counts as sent.
* ``run.close()`` (and interpreter exit) waits for the sender, then leaves what is still unsent
  in the spool; ``client.run(name, resume=True)`` in a later process sends it first, each step
  once (the server's 409 makes a step sent twice harmless).
* Wrong arguments (shapes, missing tokens) warn once per message and count in ``run.failed``;
  ``Client(strict=True)`` raises ValueError instead (for tests and first runs).
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import os
import random
import tempfile
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx

from . import _batch
from ._spool import Entry, Spool, default_spool_dir
from .upload import config_file_text
from .wire import PROTOCOL_HEADER, PROTOCOL_VERSION

__all__ = ["Client", "Run"]

log = logging.getLogger("creditlens")

_OPEN_RUNS: weakref.WeakSet[Run] = weakref.WeakSet()


@atexit.register
def _close_open_runs() -> None:  # pragma: no cover - runs at interpreter exit
    for run in list(_OPEN_RUNS):
        run.close(timeout=run._client.exit_timeout)


@dataclass
class _Item:
    step: int
    build: Callable[[], tuple[bytes, str]]  # -> (body, format name)
    nbytes: int


class Client:
    """A connection to a creditlens server.

    ``url``: the server; ``token``: its write token (``CREDITLENS_WRITE_TOKEN``), if it has one.
    ``timeout``: per request (seconds, or an ``httpx.Timeout``); ``max_queue`` / ``max_queue_bytes``:
    the per-run bound on steps in memory waiting to be written to the spool; ``spool_dir``: the
    spool folder (None: ``$CREDITLENS_SPOOL_DIR``, else ``creditlens/spool`` in the user's cache
    folder); ``max_spool_bytes``: the per-run bound on unsent steps on disk, beyond which steps are
    dropped; ``max_retries``, ``backoff``, ``max_backoff``: the retry policy (waits of
    ``backoff * 2**attempt`` capped at ``max_backoff``, half of it random; ``max_retries`` bounds
    the retries of 5xx answers other than 502/503/504, and of :meth:`Run.send`);
    ``create_timeout``: how long ``client.run`` waits for the server before leaving the run's
    creation to the sender thread; ``exit_timeout``: how long interpreter exit waits for unsent
    steps of runs left open (the rest stays in the spool); ``strict``: raise ValueError on wrong
    arguments instead of warning."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = httpx.Timeout(30.0, connect=5.0),
        max_queue: int = 16,
        max_queue_bytes: int = 512 * 1024 * 1024,
        spool_dir: str | os.PathLike[str] | None = None,
        max_spool_bytes: int = 4 * 1024**3,
        max_retries: int = 6,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        create_timeout: float = 5.0,
        exit_timeout: float = 30.0,
        strict: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        # Every request names the wire protocol it speaks: a server older than this client answers
        # a 4xx naming both versions instead of misreading what it is sent.
        headers = {"user-agent": "creditlens-client", PROTOCOL_HEADER: str(PROTOCOL_VERSION)}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        self.spool_dir = Path(spool_dir) if spool_dir is not None else default_spool_dir()
        self.max_spool_bytes = max_spool_bytes
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.create_timeout = create_timeout
        self.exit_timeout = exit_timeout
        self.strict = strict
        self._runs: list[Run] = []

    def run(
        self,
        name: str,
        config: dict[str, Any] | str | os.PathLike[str] | None = None,
        resume: bool = False,
        keep: int | None = None,
        trainer: str | None = None,
    ) -> Run:
        """A run on the server (created now when the server answers; else by the sender thread
        before its first step). ``resume=True`` reuses the newest run of that name, and first sends
        the steps earlier processes left unsent in the spool for it. ``keep``: the episodes the
        server keeps in full per step (whole groups, the telling ones first; its metrics still count
        every episode); None keeps every one. ``trainer``: the trainer whose advantages the steps
        carry (verl, trl, openrlhf, skyrl, areal, nemo_rl, prime_rl, slime; the adapters say it
        themselves): the server shows that trainer's estimator, which ``config`` names, beside them.
        ``config``: a dict, or the path of the trainer's configuration file (verl's Hydra
        ``.hydra/config.yaml``, or the Hydra output folder holding it; OpenRLHF's arguments; JSON),
        sent as it is for the server to read."""
        run = Run(self, name, config or {}, resume, keep, trainer)
        self._runs.append(run)
        return run

    def close(self) -> None:
        """Close every run (waiting for their unsent batches) and the connection."""
        for run in self._runs:
            run.close()
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def absolute(self, url: str) -> str:
        return urljoin(self.url + "/", url)


class _Retry(Exception):
    """The server did not answer for the run (``status``: its 5xx/429 answer; None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# Answers that mean "not now" (rate limited; a proxy in front of a server that is down or busy).
_UNAVAILABLE = frozenset({429, 502, 503, 504})


class Run:
    """One training run. Use :meth:`log` / :meth:`log_tensors` once per training step."""

    def __init__(
        self,
        client: Client,
        name: str,
        config: dict[str, Any] | str | os.PathLike[str],
        resume: bool,
        keep: int | None = None,
        trainer: str | None = None,
    ) -> None:
        self._client = client
        self.name = name
        # A configuration file travels as its text; the server reads it (YAML, arguments, JSON).
        self.config_text = None if isinstance(config, dict) else config_file_text(config)
        config = config if isinstance(config, dict) else {}
        # The trainer travels in the config (a server of any version keeps it) and with each step.
        self.config = {**config, "trainer": trainer} if trainer else config
        self.trainer = trainer
        self.resume = resume
        self.keep = keep
        self.id: int | None = None
        self.url: str | None = None
        self.delete_token: str | None = None
        self._ref: int | str | None = None
        self.dropped = 0  # steps not kept: beyond the spool's disk budget, or logged after close
        self.failed = 0  # steps the server refused (4xx), given up after retries, or unbuildable
        self.sent = 0  # steps the server stored (or already had: 409)
        self._warned: set[str] = set()
        self._queue: deque[_Item] = deque()  # logged, not yet on disk (the one being written included)
        self._queue_bytes = 0
        self._outbox: deque[Entry] = deque()  # on disk, not yet answered for, in sending order
        self._spool_bytes = 0
        self._cond = threading.Condition()
        self._closing = False
        self._abort = threading.Event()
        self._disabled = False
        self._spool = self._open_spool()
        if resume:
            left = self._spool.leftovers()
            self._outbox.extend(left)
            self._spool_bytes += sum(e.nbytes for e in left)
        else:
            waiting = self._spool.others()
            if waiting:
                self._warn_once(
                    "others",
                    f"creditlens: {waiting} step(s) logged to run {name!r} by other processes wait in "
                    f"{self._spool.run_dir}; client.run({name!r}, resume=True) sends those an ended "
                    "process left.",
                )
        try:
            # Once, briefly, so run.id and run.url are usually known on return.
            self._ensure_created(timeout=httpx.Timeout(client.create_timeout))
        except ValueError:  # strict, and the server refused the run
            self._spool.close()
            raise
        except _Retry:
            self._warn_once(
                "create",
                f"creditlens: the server at {client.url} is not answering yet; "
                "the run will be created when it does.",
            )
        self._writer = threading.Thread(target=self._write_loop, name=f"creditlens-spool-{name}", daemon=True)
        self._sender = threading.Thread(target=self._send_loop, name=f"creditlens-run-{name}", daemon=True)
        self._writer.start()
        self._sender.start()
        _OPEN_RUNS.add(self)

    def _open_spool(self) -> Spool:
        c = self._client
        try:
            return Spool(c.spool_dir, c.url, self.name)
        except OSError as e:
            tmp = Path(tempfile.mkdtemp(prefix="creditlens-spool-"))
            self._warn_once(
                "spool_dir",
                f"creditlens: cannot use the spool folder {c.spool_dir} ({e}); spooling to {tmp} "
                "instead (a restarted process will not find what is left there).",
            )
            return Spool(tmp, c.url, self.name)

    # -- the caller's side ---------------------------------------------------------------------

    def log(self, step: int, episodes: Iterable[dict[str, Any]]) -> None:
        """Log one step's episodes in the native format (dicts with tokens, kinds, reward, ...).

        Lists are copied here, so the caller may reuse them; the JSON is written by the spool writer."""
        try:
            eps = [_copy_episode(e) for e in episodes]
        except Exception as e:  # noqa: BLE001 - the training loop must go on
            self._bad_argument(e)
            return
        nbytes = sum(48 * len(e.get("tokens", ())) + 256 for e in eps)

        def build() -> tuple[bytes, str]:
            return "".join(json.dumps(e) + "\n" for e in eps).encode(), "native"

        self._put(_Item(int(step), build, nbytes))

    def log_tensors(
        self,
        step: int,
        *,
        token_ids: Any = None,
        tokens: Any = None,
        kinds: Any = None,
        policy_mask: Any = None,
        attention_mask: Any = None,
        rewards: Any = None,
        reward: Any = None,
        values: Any = None,
        logprobs: Any = None,
        ref_logprobs: Any = None,
        rollout_logprobs: Any = None,
        entropy: Any = None,
        advantages: Any = None,
        groups: Any = None,
        tokenizer: Any = None,
        meta: Any = None,
        token_signals: dict[str, Any] | None = None,
    ) -> None:
        """Log one step as [B, T] tensors (numpy arrays or torch tensors; [B] for ``reward`` and
        ``groups``), sent in the safetensors wire format (see ``creditlens.wire``).

        Padding: positions where ``attention_mask`` is 0 are dropped. Kinds: ``kinds`` (0 prompt,
        1 policy, 2 tool, 255 padding, or the strings), else from ``policy_mask`` (1 policy; 0
        before a row's first policy token prompt, after it tool), else all policy. Token text:
        ``tokens`` (B lists of strings), else ``token_ids`` decoded with ``tokenizer`` (anything
        with ``convert_ids_to_tokens`` or ``id_to_token``), else the server shows ⟨id⟩.
        ``groups``: [B] ints or B strings. ``meta``: a dict for every episode, or B dicts.
        ``token_signals``: your own per-token numbers, ``{name: [B, T]}`` (importance ratios,
        mismatch KL, masks, loss weights; floats, ints or bools, NaN for "not scored"), kept as
        each episode's ``meta.token_signals[name]`` like a prime-rl export's."""
        try:
            snap = _batch.snapshot(
                token_ids=token_ids,
                tokens=tokens,
                kinds=kinds,
                policy_mask=policy_mask,
                attention_mask=attention_mask,
                rewards=rewards,
                reward=reward,
                values=values,
                logprobs=logprobs,
                ref_logprobs=ref_logprobs,
                rollout_logprobs=rollout_logprobs,
                entropy=entropy,
                advantages=advantages,
                groups=groups,
                tokenizer=tokenizer,
                meta=copy.deepcopy(meta),
                token_signals=token_signals,
            )
        except Exception as e:  # noqa: BLE001 - the training loop must go on
            self._bad_argument(e)
            return
        self._put(_Item(int(step), lambda: (_batch.build(snap), "safetensors"), snap.nbytes))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every logged step was sent or given up; False if ``timeout`` ran out (or the
        server refused the run: what is spooled then waits for a later ``resume=True``)."""
        with self._cond:
            self._cond.wait_for(lambda: self._unsent == 0 or self._disabled, timeout)
            return self._unsent == 0

    def sync(self, timeout: float | None = None) -> bool:
        """Wait until every step logged so far is on disk in the spool (or already sent): from then
        on a crash loses none of them. False if ``timeout`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue, timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Send what is waiting (at most ``timeout`` seconds), then stop; what is still unsent stays
        in the spool for ``client.run(name, resume=True)`` in a later process."""
        if self._closing:
            return
        self.flush(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._abort.set()  # cut retry waits short
        self._writer.join()  # what is in memory goes to disk: local work, never the network
        self._sender.join(timeout=1.0)
        with self._cond:
            left = self._unsent
        self._spool.close()
        if left:
            self._warn_once(
                "left",
                f"creditlens: run {self.name!r} closed with {left} step(s) not sent; they are kept in "
                f"{self._spool.run_dir}: client.run({self.name!r}, resume=True) in a later process "
                "sends them.",
            )
        _OPEN_RUNS.discard(self)

    @property
    def pending(self) -> int:
        """Steps logged but not yet sent or given up (in memory or in the spool)."""
        with self._cond:
            return self._unsent

    @property
    def spool_folder(self) -> Path:
        """This process's spool folder for the run."""
        return self._spool.folder

    @property
    def _unsent(self) -> int:
        return len(self._queue) + len(self._outbox)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Run(name={self.name!r}, id={self.id}, sent={self.sent}, dropped={self.dropped}, failed={self.failed})"

    # -- internals -----------------------------------------------------------------------------

    def _put(self, item: _Item) -> None:
        c = self._client
        with self._cond:
            if not self._closing:
                # Back-pressure, not loss: the writer only serialises and writes to a local disk.
                self._cond.wait_for(
                    lambda: (
                        self._closing
                        or not self._queue
                        or (
                            len(self._queue) < c.max_queue
                            and self._queue_bytes + item.nbytes <= c.max_queue_bytes
                        )
                    )
                )
            if not self._closing:
                self._queue.append(item)
                self._queue_bytes += item.nbytes
                self._cond.notify_all()
                return
            self.dropped += 1
        self._drop_warning(item.step, "the run is closed")

    def _drop_warning(self, step: int, why: str) -> None:
        self._warn_once(
            "drop",
            f"creditlens: dropping step {step} of run {self.name!r} because {why}; "
            "the training loop goes on (run.dropped counts the dropped steps).",
        )

    def _bad_argument(self, e: Exception) -> None:
        if self._client.strict:
            raise e if isinstance(e, ValueError) else ValueError(str(e))
        with self._cond:
            self.failed += 1
        self._warn_once(f"arg:{e}", f"creditlens: not logged: {e}")

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _write_loop(self) -> None:
        """Memory -> disk: build each logged step and write it to the spool, in order."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                item = self._queue[0]  # stays counted until it is on disk
            entry, why = None, None
            try:
                body, fmt = self._build(item)
            except Exception:  # noqa: BLE001 - bad data never reaches the caller as an exception
                body = None
            if body is not None:
                with self._cond:
                    room = self._spool_bytes + len(body) <= self._client.max_spool_bytes
                if room:
                    try:
                        entry = self._spool.write(item.step, fmt, body)
                    except Exception as e:  # noqa: BLE001 - a full disk (OSError) or worse: never end the thread
                        why = f"the spool folder refused it ({e})"
                else:
                    why = (
                        f"{self._client.max_spool_bytes} bytes of unsent steps are on disk (max_spool_bytes)"
                    )
            with self._cond:
                self._queue.popleft()
                self._queue_bytes -= item.nbytes
                if entry is not None:
                    self._outbox.append(entry)
                    self._spool_bytes += entry.nbytes
                elif body is None:
                    self.failed += 1
                else:
                    self.dropped += 1
                self._cond.notify_all()
            if why is not None:
                self._drop_warning(item.step, why)

    def _build(self, item: _Item) -> tuple[bytes, str]:
        try:
            return item.build()
        except Exception as e:
            if self._client.strict:
                log.error("creditlens: step %s could not be encoded: %s", item.step, e)
            self._warn_once(f"build:{e}", f"creditlens: step {item.step} not logged: {e}")
            raise

    def _send_loop(self) -> None:
        """Disk -> server: post the oldest spooled step until the server answers for it."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._outbox or self._closing)
                if not self._outbox or self._abort.is_set() or self._disabled:
                    return
                entry = self._outbox[0]
            ok: bool | None = None
            try:
                ok = self._deliver(entry)
            except Exception as e:  # noqa: BLE001 - a sender bug must not end the thread
                self._warn_once(
                    f"bug:{type(e).__name__}", f"creditlens: could not send step {entry.step}: {e!r}"
                )
                ok = False
            if ok is None:  # closed while the server was not answering, or the run was refused
                with self._cond:
                    self._cond.notify_all()
                return
            Spool.remove(entry)
            with self._cond:
                self._outbox.popleft()
                self._spool_bytes -= entry.nbytes
                if ok:
                    self.sent += 1
                else:
                    self.failed += 1
                self._cond.notify_all()

    def _deliver(self, entry: Entry) -> bool | None:
        """True: stored (or 409); False: refused or given up (the file goes); None: not answered
        for before the run was closed (the file stays for a later resume)."""
        try:
            body = entry.path.read_bytes()
        except OSError as e:
            self._warn_once(f"read:{e}", f"creditlens: step {entry.step}: the spool file is gone: {e}")
            return False
        r = self._post(entry.step, body, entry.fmt, spooled=True)
        if r is None:
            return None if (self._abort.is_set() or self._disabled) else False
        return r.status_code < 300 or r.status_code == 409

    def send(
        self, step: int, body: bytes, format: str | None = None, *, name: str | None = None
    ) -> httpx.Response | None:
        """Post one step now, in the calling thread, with the run's retry policy (creating the run
        first if needed): for callers that must know what became of a step before the next one
        (``creditlens watch``). ``body`` is a whole upload file; ``format`` its format name (None:
        the server detects it). Returns the server's final answer -- 201, 409 (the step exists),
        or another 4xx, which is not retried -- or None when the server did not answer within
        the retries (or the run was closed)."""
        return self._post(int(step), body, format, name=name, final_4xx=True)

    def update_config(self, config: dict[str, Any], *, trainer: str | None = None) -> bool:
        """Add ``config`` to the run's configuration (merged setting by setting; the adapters send
        their trainer's own, e.g. TRL's ``GRPOConfig``) and name its ``trainer``: the server then
        shows that trainer's estimator with the options, gamma and lambda it sets. Before the run
        exists on the server this only changes what its creation sends; after, it is sent now
        (``PATCH /api/runs/{ref}``). True when the server has it (or will, at creation)."""
        if trainer is not None:
            self.trainer = trainer
        if self.id is None:
            self.config = {**self.config, **config, **({"trainer": trainer} if trainer else {})}
            return True
        body: dict[str, Any] = {"config": config}
        if trainer is not None:
            body["trainer"] = trainer
        try:
            r = self._client._http.patch(f"/api/runs/{self._ref}", json=body)
        except httpx.TransportError as e:
            self._warn_once("config", f"creditlens: the run's configuration was not sent: {e}")
            return False
        if r.status_code >= 400:
            self._refused(r, "the configuration")
            if self._client.strict and r.status_code < 500:
                raise ValueError(f"the server refused the configuration: HTTP {r.status_code} {r.text[:300]}")
            return False
        self.config = r.json().get("config", self.config)
        return True

    def log_metrics_file(
        self, path: str | os.PathLike[str], *, replace: bool = False
    ) -> dict[str, Any] | None:
        """Attach the trainer's own metrics log at ``path`` to the run, now, in the calling thread
        (``POST /api/runs/{ref}/logged-metrics``): verl's file logger JSONL, TRL's
        ``trainer_state.json``, prime-rl's ``metrics.jsonl``, a W&B history export, or their gzip.
        The run page draws its series as the trainer's own numbers. Merged by step (a step of the
        file replaces that step's logged metrics); ``replace=True`` drops the earlier ones first.
        Returns the server's answer (steps and metrics stored, values skipped), or None when it
        refused the file (a warning says why; ``strict`` raises ValueError) or did not answer
        within the retries."""
        try:
            body = Path(path).read_bytes()
        except OSError as e:
            self._bad_argument(ValueError(f"cannot read the metrics log {path}: {e}"))
            return None
        params = {"replace": "true"} if replace else {}
        for attempt in range(self._client.max_retries + 1):
            if attempt and self._abort.wait(self._delay(attempt - 1)):
                return None
            try:
                self._ensure_created()
                if self._disabled:
                    return None
                r = self._client._http.post(
                    f"/api/runs/{self._ref}/logged-metrics",
                    params=params,
                    files={"file": (Path(path).name, body)},
                )
            except (_Retry, httpx.TransportError) as e:
                self._note_retry(-1, e)
                continue
            if r.status_code >= 500 or r.status_code == 429:
                continue
            if r.status_code >= 400:
                self._refused(r, f"the metrics log {Path(path).name}")
                if self._client.strict:
                    raise ValueError(
                        f"the server refused the metrics log {path}: HTTP {r.status_code} {r.text[:300]}"
                    )
                return None
            answer: dict[str, Any] = r.json()
            return answer
        self._warn_once("gave_up_metrics", f"creditlens: gave up sending the metrics log {path}.")
        return None

    def _post(
        self,
        step: int,
        body: bytes,
        fmt: str | None,
        *,
        name: str | None = None,
        final_4xx: bool = False,
        spooled: bool = False,
    ) -> httpx.Response | None:
        """The retry loop: the answer (2xx or 409; any 4xx too with ``final_4xx`` or ``spooled``),
        else None (given up, or the run closed). ``spooled``: a server that is down, slow or
        unavailable (429/502/503/504) is retried until it answers or the run is closed;
        ``max_retries`` bounds only the other 5xx answers. Otherwise every retry counts."""
        params = {k: v for k, v in (("format", fmt), ("name", name), ("trainer", self.trainer)) if v}
        attempt = counted = 0
        while counted <= self._client.max_retries:
            if attempt:
                if self._abort.wait(self._delay(min(attempt - 1, 16))):
                    return None
            attempt += 1
            try:
                self._ensure_created()
                if self._disabled:
                    return None
                r = self._client._http.post(
                    f"/api/runs/{self._ref}/steps/{step}",
                    params=params,
                    content=body,
                    headers={"content-type": "application/octet-stream"},
                )
            except (_Retry, httpx.TransportError) as e:
                status = getattr(e, "status", None)
                counted += not (spooled and (status is None or status in _UNAVAILABLE))
                self._note_retry(step, e)
                continue
            if r.status_code < 300 or r.status_code == 409:
                return r
            if r.status_code >= 500 or r.status_code == 429:
                counted += not (spooled and r.status_code in _UNAVAILABLE)
                self._note_retry(step, f"HTTP {r.status_code}")
                continue
            self._refused(r, f"step {step}")
            return r if (final_4xx or spooled) else None
        self._warn_once(
            "gave_up",
            f"creditlens: gave up sending step {step} of run {self.name!r} after "
            f"{self._client.max_retries + 1} attempts (run.failed counts such steps).",
        )
        return None

    def _note_retry(self, step: int, why: object) -> None:
        log.debug("creditlens: step %s of run %r: %s; retrying", step, self.name, why)

    def _delay(self, attempt: int) -> float:
        c = self._client
        d: float = min(c.max_backoff, c.backoff * (2**attempt))
        return d / 2 + random.uniform(0, d / 2)

    def _refused(self, r: httpx.Response, what: str) -> None:
        try:
            err = r.json().get("error", {})
            code, message = err.get("code", ""), err.get("message", r.text[:300])
        except Exception:  # noqa: BLE001 - not our error shape (a proxy's page)
            code, message = "", r.text[:300]
        self._warn_once(
            f"http:{r.status_code}:{code}",
            f"creditlens: the server refused {what} of run {self.name!r}: HTTP {r.status_code} {message}",
        )

    def _ensure_created(self, timeout: httpx.Timeout | None = None) -> None:
        """Create (or, with resume, find) the run on the server; _Retry when it does not answer."""
        if self.id is not None or self._disabled:
            return
        http = self._client._http
        kw: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        try:
            if self.resume:
                r = http.get("/api/runs", params={"name": self.name}, **kw)
                if r.status_code == 200:
                    found = _find_run(r.json(), self.name)
                    if found is not None:
                        self._adopt(found)
                        return
                elif r.status_code >= 500:
                    raise _Retry(f"HTTP {r.status_code}", r.status_code)
            # The protocol version goes in the header only: servers from before the versioning
            # refuse unknown body fields.
            new: dict[str, Any] = {"name": self.name, "config": self.config}
            if self.config_text is not None:
                new["config_text"] = self.config_text
            if self.keep is not None:
                new["keep"] = self.keep
            r = http.post("/api/runs", json=new, **kw)
        except httpx.TransportError as e:
            raise _Retry(str(e)) from None
        if r.status_code >= 500 or r.status_code == 429:
            raise _Retry(f"HTTP {r.status_code}", r.status_code)
        if r.status_code >= 400:
            self._refused(r, "the new run")
            self._disabled = True
            if self._client.strict:
                raise ValueError(f"the server refused run {self.name!r}: HTTP {r.status_code}")
            return
        self._adopt(r.json())

    def _adopt(self, body: dict[str, Any]) -> None:
        self.id = body["id"]
        # What the run's URLs carry: its id, or its slug when the run is unlisted (its id is a 404).
        self._ref = body.get("ref", self.id)
        self.delete_token = body.get("delete_token", self.delete_token)
        url = body.get("url") or f"/r/{self.id}"
        self.url = self._client.absolute(url)


def _find_run(body: Any, name: str) -> dict[str, Any] | None:
    """The newest run called ``name`` in a GET /api/runs answer (a list, or {"runs": [...]})."""
    runs: list[Any] = body
    if isinstance(body, dict):
        runs = body["runs"] if "runs" in body else body["items"] if "items" in body else []
    same = [r for r in runs if isinstance(r, dict) and r.get("name") == name and "id" in r]
    return max(same, key=lambda r: r["id"]) if same else None


def _copy_episode(e: dict[str, Any]) -> dict[str, Any]:
    """A copy the caller cannot change afterwards: lists copied (C speed), meta deep-copied."""
    if not isinstance(e, dict):
        raise ValueError(f"an episode must be a dict; got {type(e).__name__}")
    out: dict[str, Any] = {}
    for k, v in e.items():
        if isinstance(v, list):
            out[k] = list(v)
        elif hasattr(v, "tolist"):  # a numpy array or torch tensor for a per-token field
            out[k] = v.tolist()
        elif isinstance(v, dict):
            out[k] = copy.deepcopy(v)
        else:
            out[k] = v
    return out
