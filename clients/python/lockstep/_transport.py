"""The SDK's one way to the server: http.client with the tenant's bearer
token, typed errors, and retries that cannot run anything twice.

A request is retried only when that is safe: GET, PUT (with a body the SDK
still holds) and DELETE are idempotent, and every POST carries an
Idempotency-Key chosen once per call and sent again on each attempt, so the
server replays its first answer instead of running the command, checkpoint
or fork again. Retried: a connection that failed or was cut before an answer,
503 SERVER_SHUTTING_DOWN and 409 IDEMPOTENCY_KEY_IN_PROGRESS.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import uuid
from typing import Any, Dict, Iterable, Iterator, Optional, Union
from urllib.parse import urlencode, urlsplit

from .errors import InvalidArgumentError, LockstepConnectionError, LockstepError, error_from_wire

DEFAULT_API_URL = "http://127.0.0.1:7878"
_TOKEN = re.compile(r"^[\x21-\x7e]+$")

Body = Union[None, bytes, Iterable[bytes]]


class Response:
    """An answer whose body may still be streaming; close() frees the connection."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self._conn = conn
        self.raw = resp
        self.status = resp.status
        self.headers = resp.headers

    def read(self) -> bytes:
        try:
            return self.raw.read()
        finally:
            self.close()

    def json(self) -> Any:
        return json.loads(self.read() or b"null")

    def iter_lines(self) -> Iterator[bytes]:
        try:
            while True:
                line = self.raw.readline()
                if not line:
                    return
                yield line
        finally:
            self.close()

    def iter_chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        try:
            while True:
                chunk = self.raw.read(size)
                if not chunk:
                    return
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        self._conn.close()


class Transport:
    """Resolved connection settings plus the request loop."""

    def __init__(
        self,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        max_attempts: int = 4,
        retry_delay: float = 0.2,
        timeout: Optional[float] = None,
    ):
        url = api_url or os.environ.get("LOCKSTEP_API_URL") or DEFAULT_API_URL
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError("INVALID_ARGUMENT", f"Invalid api_url: expected an http(s) URL, received {url!r}", field="api_url")
        key = api_key if api_key is not None else os.environ.get("LOCKSTEP_API_KEY")
        if not isinstance(key, str) or not _TOKEN.match(key):
            raise InvalidArgumentError(
                "INVALID_ARGUMENT",
                "Invalid api_key: expected the tenant token printed by `lockstep tenant add NAME` (or LOCKSTEP_API_KEY)",
                field="api_key",
            )
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidArgumentError("INVALID_ARGUMENT", f"Invalid max_attempts: expected an integer of at least 1, received {max_attempts!r}", field="max_attempts")
        self.api_url = url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._key = key
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.timeout = timeout

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Dict[str, Optional[str]]] = None,
        json_body: Any = None,
        body: Body = None,
        accept: str = "application/json",
        idempotency_key: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Response:
        """Sends a request; returns the 2xx answer (body unread) or raises the typed error."""
        url = self._prefix + "/v1" + path
        q = {k: v for k, v in (query or {}).items() if v is not None}
        if q:
            url += "?" + urlencode(q)
        headers = {"Authorization": f"Bearer {self._key}", "Accept": accept}
        if method == "POST":
            headers["Idempotency-Key"] = idempotency_key or str(uuid.uuid4())
        payload: Any = None
        replayable = True
        if json_body is not None:
            payload = json.dumps(json_body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        elif isinstance(body, (bytes, bytearray, memoryview)):
            payload = bytes(body)
            headers["Content-Type"] = "application/octet-stream"
        elif body is not None:
            # A stream is sent once (chunked): a retry would have nothing to send.
            payload = body
            replayable = False
            headers["Content-Type"] = "application/octet-stream"
        elif method == "POST":
            payload = b"{}"
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            attempt += 1
            conn = self._connect(timeout if timeout is not None else self.timeout)
            try:
                conn.request(method, url, body=payload, headers=headers, encode_chunked=not replayable)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if replayable and attempt < self.max_attempts:
                    time.sleep(self.retry_delay * 2 ** (attempt - 1))
                    continue
                raise LockstepConnectionError(f"Cannot reach {self.api_url}: {e!r}") from e
            if 200 <= resp.status < 300:
                return Response(conn, resp)
            err = _error(resp)
            conn.close()
            if replayable and attempt < self.max_attempts and _retryable(resp.status, err):
                time.sleep(self.retry_delay * 2 ** (attempt - 1))
                continue
            raise err

    def json(self, method: str, path: str, **kw: Any) -> Any:
        return self.request(method, path, **kw).json()


def _retryable(status: int, err: LockstepError) -> bool:
    if err.code == "IDEMPOTENCY_KEY_IN_PROGRESS":
        return True
    # 503 is also a host that is not set up (CRIU_NOT_INSTALLED, ...): waiting does not fix that.
    return status == 503 and err.code == "SERVER_SHUTTING_DOWN"


def _error(resp: http.client.HTTPResponse) -> LockstepError:
    text = resp.read()
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            return error_from_wire(resp.status, parsed["error"])
    except ValueError:
        pass
    return LockstepConnectionError(f"The server answered {resp.status} {resp.reason} with a body that is not a Lockstep error: {text[:200]!r}")
