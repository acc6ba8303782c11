"""A lean asyncio HTTP/1.1 client for the load benchmark: one keep-alive connection per simulated
user, requests written as bytes and answers read by their length.

Why not httpx: a load generator that spends milliseconds of Python per request on the same two
cores as the server measures itself. This one costs tens of microseconds per request, so the
figures are the server's. It speaks only what our server answers: ``Content-Length`` or chunked
bodies, no redirects, no TLS.
"""

from __future__ import annotations

import asyncio


class HttpError(Exception):
    """The connection broke or the answer was not HTTP/1.1 as expected."""


class Connection:
    """One keep-alive connection to ``host:port``; reconnects after the server closed it."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(
        self, method: str, target: str, body: bytes = b"", content_type: str = "application/octet-stream"
    ) -> tuple[int, bytes]:
        """(status, body) of one request; HttpError if the connection fails."""
        if self.writer is None:
            await self._connect()
        assert self.reader is not None and self.writer is not None
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.extra}"
        if body or method == "POST":
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        try:
            self.writer.write(head.encode() + b"\r\n" + body)
            status_line = await self.reader.readuntil(b"\r\n")
            status = int(status_line.split(b" ", 2)[1])
            length, chunked, close = None, False, False
            while True:
                line = await self.reader.readuntil(b"\r\n")
                if line == b"\r\n":
                    break
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif name == b"connection" and b"close" in value.lower():
                    close = True
            if chunked:
                parts = []
                while True:
                    size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    parts.append(await self.reader.readexactly(size + 2))
                    if size == 0:
                        break
                data = b"".join(p[:-2] for p in parts)
            else:
                data = await self.reader.readexactly(length or 0)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as e:
            self.close()
            raise HttpError(f"{type(e).__name__}: {e}") from e
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None
