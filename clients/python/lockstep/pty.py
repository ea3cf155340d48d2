"""PTYs of a sandbox: programs on a terminal of the sandbox's own.

``sbx.pty.create(cols=80, rows=24)`` starts ``/bin/sh -i`` (or ``cmd``) on a
new terminal; the handle writes keys, resizes, reads the transcript by byte
offsets, follows it as a stream (``iter_output`` / ``on_data``), waits and
kills. Output offsets count the transcript's bytes: reattach with
``sbx.pty.connect(pid)`` and pass the last offset seen to miss nothing. The
wire format is in docs/http-reference.md ("PTYs").
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Union

from .errors import LockstepConnectionError, error_from_wire

if TYPE_CHECKING:
    from .sandbox import Sandbox


@dataclass
class PtyOutput:
    """Terminal output since an offset. ``rewound``: a rollback cut the transcript back; data starts at 0."""

    data: bytes
    offset: int
    rewound: bool
    running: bool


@dataclass
class PtyExit:
    """How a PTY ended: reason is "exited" (exit_code set), "killed" or "rolled-back"."""

    exit_code: Optional[int]
    reason: str


def _drop_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class PtyHandle:
    """One PTY of a sandbox; ``pid`` is its id."""

    def __init__(self, sandbox: "Sandbox", pid: int):
        self._sandbox = sandbox
        self.pid = pid

    def _path(self, tail: str) -> str:
        return self._sandbox._path(f"/pty/{self.pid}{tail}")

    def write(self, data: Union[str, bytes]) -> None:
        """Types bytes (str as UTF-8) on the terminal."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self._sandbox._t.json("POST", self._path("/input"), body=raw)

    def resize(self, cols: int, rows: int) -> None:
        self._sandbox._t.json("POST", self._path("/resize"), json_body={"cols": cols, "rows": rows})

    def output(self, offset: int = 0) -> PtyOutput:
        """Output from byte ``offset`` of the transcript (at most 1 MiB per call)."""
        r = self._sandbox._t.json("GET", self._path("/output"), query={"offset": str(offset)})
        return PtyOutput(base64.b64decode(r["data"]), r["offset"], bool(r["rewound"]), bool(r["running"]))

    def iter_output(self, offset: int = 0) -> Iterator[Union[bytes, PtyExit]]:
        """The output from ``offset`` on, chunk by chunk, as the server streams it;
        the last item is the PtyExit. A rollback in between shows as an empty
        chunk, after which the data starts again at offset 0."""
        resp = self._sandbox._t.request("GET", self._path("/stream"), query={"offset": str(offset)}, accept="application/x-ndjson", timeout=None)
        for line in resp.iter_lines():
            if not line.strip():
                continue
            ev = json.loads(line)
            kind = ev.get("type")
            if kind == "data":
                yield base64.b64decode(ev["data"])
            elif kind == "rewound":
                yield b""
            elif kind == "exit":
                yield PtyExit(ev.get("exitCode"), ev.get("reason", "exited"))
                return
            elif kind == "error":
                raise error_from_wire(500, ev.get("error") or {})
        raise LockstepConnectionError("The PTY stream ended before the PTY did: the connection was cut")

    def follow(self, on_data: Callable[[bytes], None], offset: int = 0) -> PtyExit:
        """Calls on_data with each chunk until the PTY ends; returns how it ended."""
        for item in self.iter_output(offset):
            if isinstance(item, PtyExit):
                return item
            if item:
                on_data(item)
        raise LockstepConnectionError("The PTY stream ended before the PTY did")

    def wait(self, timeout_ms: Optional[int] = None) -> PtyExit:
        r = self._sandbox._t.json("POST", self._path("/wait"), json_body=_drop_none({"timeoutMs": timeout_ms}))
        return PtyExit(r.get("exitCode"), r.get("reason", "exited"))

    def kill(self) -> bool:
        """Kills the PTY and the program on it; False if it had already ended."""
        return bool(self._sandbox._t.json("POST", self._path("/kill"))["killed"])


class Pty:
    """The PTYs of a sandbox (E2B's ``sandbox.pty``)."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    def create(
        self,
        cols: int,
        rows: int,
        *,
        cmd: Union[str, List[str], None] = None,
        envs: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        on_data: Optional[Callable[[bytes], None]] = None,
    ) -> PtyHandle:
        """Starts cmd (default /bin/sh -i) on a new terminal. With on_data, a
        daemon thread follows the output and calls it with each chunk."""
        body = _drop_none({"cols": cols, "rows": rows, "cmd": cmd, "envs": envs, "cwd": cwd})
        h = PtyHandle(self._sandbox, self._sandbox._t.json("POST", self._sandbox._path("/pty"), json_body=body)["pid"])
        if on_data is not None:
            threading.Thread(target=h.follow, args=(on_data,), daemon=True).start()
        return h

    def connect(self, pid: int) -> PtyHandle:
        """Reattaches by id (InvalidArgumentError unless the sandbox has that PTY)."""
        h = PtyHandle(self._sandbox, pid)
        h.output()
        return h

    def list(self) -> List[Dict[str, Any]]:
        return self._sandbox._t.json("GET", self._sandbox._path("/pty"))
