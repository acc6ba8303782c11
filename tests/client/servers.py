"""Small real servers on 127.0.0.1 for the client tests: one that accepts and never answers, one
that answers every request with a fixed status, one that records what it is sent and answers the
run endpoints like the service will (id, url, delete_token; 201 per step; 409 for a step it already
has), and a TCP proxy that makes a real server slow (every request waits before it is passed on)."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class HoldingServer:
    """Accepts connections, reads the request, never answers until ``release()``.

    ``got_request`` is set once the first request's bytes have arrived."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.got_request = threading.Event()
        self.released = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.released.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            if conn.recv(65536):
                self.got_request.set()
        except OSError:
            return
        self.released.wait()

    def release(self) -> None:
        self.released.set()
        for c in self.conns:
            c.close()
        self.sock.close()


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _body(self) -> bytes:
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n)

    def _answer(self, status: int, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:  # noqa: N802
        srv = self.server
        with srv.lock:
            srv.requests.append(("GET", self.path, b""))
        if srv.status is not None:
            return self._answer(srv.status, {"error": {"status": srv.status, "code": "x", "message": "no"}})
        self._answer(200, [{"id": i, "name": n, "url": f"/r/{i}"} for i, n in srv.runs.items()])

    def do_POST(self) -> None:  # noqa: N802
        srv = self.server
        body = self._body()
        with srv.lock:
            srv.requests.append(("POST", self.path, body))
        if srv.status is not None:
            return self._answer(srv.status, {"error": {"status": srv.status, "code": "x", "message": "no"}})
        if self.path == "/api/runs":
            with srv.lock:
                rid = len(srv.runs) + 1
                srv.runs[rid] = json.loads(body)["name"]
            return self._answer(201, {"id": rid, "url": f"/r/{rid}", "delete_token": "tok"})
        m = re.fullmatch(r"/api/runs/(\d+)/steps/(\d+)\?format=(\w+)(&.*)?", self.path)
        if not m:
            return self._answer(404, {"error": {"status": 404, "code": "not_found", "message": self.path}})
        key = (int(m.group(1)), int(m.group(2)))
        with srv.lock:
            busy = srv.unavailable > 0
            srv.unavailable -= busy
        if busy:
            return self._answer(503, {"error": {"status": 503, "code": "busy", "message": "later"}})
        if srv.step_status is not None:
            code = srv.step_status
            return self._answer(code, {"error": {"status": code, "code": "invalid", "message": "bad step"}})
        with srv.lock:
            if key in srv.steps:
                return self._answer(409, {"error": {"status": 409, "code": "conflict", "message": "exists"}})
            srv.steps[key] = (m.group(3), body)
            srv.step_params[key] = dict(parse_qsl(self.path.partition("?")[2]))
            srv.cond.notify_all()
        self._answer(201, {"batch_id": 1, "episodes": [], "delete_token": "t", "step": key[1]})


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True


class HTTPServer:
    """A real HTTP server thread. ``status=None``: records run steps (``steps[(run, step)] =
    (format, body)``); ``status=503``: answers every request with 503; ``step_status``:
    answers step uploads (only) with that status; ``unavailable``: answers that many step uploads
    with 503 first."""

    def __init__(
        self, status: int | None = None, step_status: int | None = None, unavailable: int = 0
    ) -> None:
        self.httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.status = status
        self.httpd.step_status = step_status
        self.httpd.unavailable = unavailable
        self.httpd.requests = []
        self.httpd.runs = {}
        self.httpd.steps = {}
        self.httpd.step_params = {}
        self.httpd.lock = threading.Lock()
        self.httpd.cond = threading.Condition(self.httpd.lock)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def requests(self) -> list:
        return self.httpd.requests

    @property
    def steps(self) -> dict:
        return self.httpd.steps

    @property
    def step_params(self) -> dict:
        """The query of each recorded step upload: ``step_params[(run, step)] = {name: value}``."""
        return self.httpd.step_params

    @property
    def runs(self) -> dict:
        return self.httpd.runs

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class SlowProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target`` (a URL): what the client sends waits
    ``delay`` seconds before it is passed on, per chunk read, so every request (and every part of a
    large body) reaches the real server late. Answers come back as they are. ``delay`` may be
    changed at any time (0: a plain proxy)."""

    def __init__(self, target: str, delay: float) -> None:
        host, port = target.rsplit("//", 1)[1].rsplit(":", 1)
        self.target = (host, int(port))
        self.delay = delay
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.target)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=self._pump, args=(conn, up, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, conn, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if slow and self.delay:
                    time.sleep(self.delay)  # the slowness under test, not a synchronisation
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
