"""``Client`` and ``Run``: log a training run into a creditlens server, one batch per step.

Logging never breaks or stalls the training loop:

* ``run.log`` / ``run.log_tensors`` copy their arguments and return; a background daemon thread
  per run serialises and sends. Unsent batches are bounded by count (``max_queue``) and bytes
  (``max_queue_bytes``), the one being sent included; a batch that does not fit is dropped,
  counted in ``run.dropped``, with one warning per run.
* A server that is down, slow (connect/read timeouts) or answering 5xx/429 costs retries with
  exponential backoff and jitter, at most ``max_retries`` per batch; then the batch is given up
  (``run.failed``). A 4xx answer is not retried: it is logged once per kind and counted in
  ``run.failed``. A 409 (the step exists, e.g. after a restart) counts as sent.
* Wrong arguments (shapes, missing tokens) warn once per message and count in ``run.failed``;
  ``Client(strict=True)`` raises ValueError instead (for tests and first runs).
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import random
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import httpx

from . import _batch

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
    the per-run bound on unsent batches; ``max_retries``, ``backoff``, ``max_backoff``: the retry
    policy (waits of ``backoff * 2**attempt`` capped at ``max_backoff``, half of it random);
    ``create_timeout``: how long ``client.run`` waits for the server before leaving the run's
    creation to the sender thread; ``exit_timeout``: how long interpreter exit waits for unsent batches of runs left open;
    ``strict``: raise ValueError on wrong arguments instead of warning."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = httpx.Timeout(30.0, connect=5.0),
        max_queue: int = 16,
        max_queue_bytes: int = 512 * 1024 * 1024,
        max_retries: int = 6,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        create_timeout: float = 5.0,
        exit_timeout: float = 30.0,
        strict: bool = False,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"user-agent": "creditlens-client"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.create_timeout = create_timeout
        self.exit_timeout = exit_timeout
        self.strict = strict
        self._runs: list[Run] = []

    def run(
        self, name: str, config: dict | None = None, resume: bool = False, keep: int | None = None
    ) -> Run:
        """A run on the server (created now when the server answers; else by the sender thread
        before its first batch). ``resume=True`` reuses the newest run of that name. ``keep``: the
        episodes the server keeps in full per step (whole groups, the telling ones first; its
        metrics still count every episode); None keeps every one."""
        run = Run(self, name, config or {}, resume, keep)
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
    pass


class Run:
    """One training run. Use :meth:`log` / :meth:`log_tensors` once per training step."""

    def __init__(
        self, client: Client, name: str, config: dict, resume: bool, keep: int | None = None
    ) -> None:
        self._client = client
        self.name = name
        self.config = config
        self.resume = resume
        self.keep = keep
        self.id: int | None = None
        self.url: str | None = None
        self.delete_token: str | None = None
        self._ref: int | str | None = None
        self.dropped = 0  # batches not queued: the queue was full
        self.failed = 0  # batches the server refused (4xx), given up after retries, or unbuildable
        self.sent = 0  # batches the server stored (or already had: 409)
        self._warned: set[str] = set()
        self._queue: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._unsent = 0
        self._unsent_bytes = 0
        self._closing = False
        self._abort = threading.Event()
        self._disabled = False
        try:
            # Once, briefly, so run.id and run.url are usually known on return.
            self._ensure_created(timeout=httpx.Timeout(client.create_timeout))
        except _Retry:
            self._warn_once(
                "create",
                f"creditlens: the server at {client.url} is not answering yet; "
                "the run will be created when it does.",
            )
        self._thread = threading.Thread(target=self._loop, name=f"creditlens-run-{name}", daemon=True)
        self._thread.start()
        _OPEN_RUNS.add(self)

    # -- the caller's side ---------------------------------------------------------------------

    def log(self, step: int, episodes: Iterable[dict]) -> None:
        """Log one step's episodes in the native format (dicts with tokens, kinds, reward, ...).

        Lists are copied here, so the caller may reuse them; the JSON is written by the sender."""
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
    ) -> None:
        """Log one step as [B, T] tensors (numpy arrays or torch tensors; [B] for ``reward`` and
        ``groups``), sent in the safetensors wire format (see ``creditlens.wire``).

        Padding: positions where ``attention_mask`` is 0 are dropped. Kinds: ``kinds`` (0 prompt,
        1 policy, 2 tool, 255 padding, or the strings), else from ``policy_mask`` (1 policy; 0
        before a row's first policy token prompt, after it tool), else all policy. Token text:
        ``tokens`` (B lists of strings), else ``token_ids`` decoded with ``tokenizer`` (anything
        with ``convert_ids_to_tokens`` or ``id_to_token``), else the server shows ⟨id⟩.
        ``groups``: [B] ints or B strings. ``meta``: a dict for every episode, or B dicts."""
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
            )
        except Exception as e:  # noqa: BLE001 - the training loop must go on
            self._bad_argument(e)
            return
        self._put(_Item(int(step), lambda: (_batch.build(snap), "safetensors"), snap.nbytes))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every logged batch was sent or given up; False if ``timeout`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: self._unsent == 0, timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Send what is queued (waiting at most ``timeout`` seconds), then stop the sender."""
        if self._closing:
            return
        done = self.flush(timeout)
        with self._cond:
            self._closing = True
            left = self._unsent
            self._cond.notify_all()
        self._abort.set()  # cut retry waits short
        if not done:
            self._warn_once(
                "abandon",
                f"creditlens: run {self.name!r} closed with {left} batch(es) not sent "
                f"(the server did not take them within {timeout} s).",
            )
        self._thread.join(timeout=1.0)
        _OPEN_RUNS.discard(self)

    @property
    def pending(self) -> int:
        """Batches logged but not yet sent or given up (the one being sent included)."""
        return self._unsent

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
            fits = (
                not self._closing
                and not self._disabled
                and self._unsent < c.max_queue
                and self._unsent_bytes + item.nbytes <= c.max_queue_bytes
            )
            if fits:
                self._queue.append(item)
                self._unsent += 1
                self._unsent_bytes += item.nbytes
                self._cond.notify_all()
                return
            self.dropped += 1
        why = (
            "it is closed or disabled"
            if (self._closing or self._disabled)
            else (f"{c.max_queue} batches / {c.max_queue_bytes} bytes are waiting to be sent")
        )
        self._warn_once(
            "drop",
            f"creditlens: dropping step {item.step} of run {self.name!r} because {why}; "
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

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                item = self._queue.popleft()
            ok = False
            try:
                ok = self._deliver(item)
            except Exception as e:  # noqa: BLE001 - a sender bug must not end the thread
                self._warn_once(
                    f"bug:{type(e).__name__}", f"creditlens: could not send step {item.step}: {e!r}"
                )
            with self._cond:
                if ok:
                    self.sent += 1
                else:
                    self.failed += 1
                self._unsent -= 1
                self._unsent_bytes -= item.nbytes
                self._cond.notify_all()

    def _deliver(self, item: _Item) -> bool:
        if self._abort.is_set():  # closed with a timeout that ran out: what is left is abandoned
            return False
        try:
            body, fmt = item.build()
        except Exception as e:  # noqa: BLE001 - bad data never reaches the caller as an exception
            if self._client.strict:
                log.error("creditlens: step %s could not be encoded: %s", item.step, e)
            self._warn_once(f"build:{e}", f"creditlens: step {item.step} not logged: {e}")
            return False
        return self._post(item.step, body, fmt) is not None

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

    def _post(
        self, step: int, body: bytes, fmt: str | None, *, name: str | None = None, final_4xx: bool = False
    ) -> httpx.Response | None:
        """The retry loop: the answer (2xx or 409; with ``final_4xx`` any 4xx too), else None."""
        params = {k: v for k, v in (("format", fmt), ("name", name)) if v}
        for attempt in range(self._client.max_retries + 1):
            if attempt:
                if self._abort.wait(self._delay(attempt - 1)):
                    return None
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
                self._note_retry(step, e)
                continue
            if r.status_code < 300 or r.status_code == 409:
                return r
            if r.status_code >= 500 or r.status_code == 429:
                self._note_retry(step, f"HTTP {r.status_code}")
                continue
            self._refused(r, f"step {step}")
            return r if final_4xx else None
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
        d = min(c.max_backoff, c.backoff * (2**attempt))
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
                    raise _Retry(f"HTTP {r.status_code}")
            new = {"name": self.name, "config": self.config}
            if self.keep is not None:
                new["keep"] = self.keep
            r = http.post("/api/runs", json=new, **kw)
        except httpx.TransportError as e:
            raise _Retry(str(e)) from None
        if r.status_code >= 500 or r.status_code == 429:
            raise _Retry(f"HTTP {r.status_code}")
        if r.status_code >= 400:
            self._refused(r, "the new run")
            self._disabled = True
            if self._client.strict:
                raise ValueError(f"the server refused run {self.name!r}: HTTP {r.status_code}")
            return
        self._adopt(r.json())

    def _adopt(self, body: dict) -> None:
        self.id = body["id"]
        # What the run's URLs carry: its id, or its slug when the run is unlisted (its id is a 404).
        self._ref = body.get("ref", self.id)
        self.delete_token = body.get("delete_token", self.delete_token)
        url = body.get("url") or f"/r/{self.id}"
        self.url = self._client.absolute(url)


def _find_run(body: Any, name: str) -> dict | None:
    """The newest run called ``name`` in a GET /api/runs answer (a list, or {"runs": [...]})."""
    runs = body.get("runs", body.get("items", [])) if isinstance(body, dict) else body
    same = [r for r in runs if isinstance(r, dict) and r.get("name") == name and "id" in r]
    return max(same, key=lambda r: r["id"]) if same else None


def _copy_episode(e: dict) -> dict:
    """A copy the caller cannot change afterwards: lists copied (C speed), meta deep-copied."""
    if not isinstance(e, dict):
        raise ValueError(f"an episode must be a dict; got {type(e).__name__}")
    out = {}
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
