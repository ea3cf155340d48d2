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

from . import _wire
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


class PtyHandle:
    """One PTY of a sandbox; ``pid`` is its id."""

    def __init__(self, sandbox: "Sandbox", pid: int):
        self._sandbox = sandbox
        self.pid = pid

    def write(self, data: Union[str, bytes]) -> None:
        """Types bytes (str as UTF-8) on the terminal."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        _wire.write_pty_input(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, data=raw)

    def resize(self, cols: int, rows: int) -> None:
        _wire.resize_pty(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, cols=cols, rows=rows)

    def output(self, offset: int = 0) -> PtyOutput:
        """Output from byte ``offset`` of the transcript (at most 1 MiB per call)."""
        r = _wire.get_pty_output(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, offset=str(offset))
        return PtyOutput(base64.b64decode(r["data"]), r["offset"], bool(r["rewound"]), bool(r["running"]))

    def iter_output(self, offset: int = 0) -> Iterator[Union[bytes, PtyExit]]:
        """The output from ``offset`` on, chunk by chunk, as the server streams it;
        the last item is the PtyExit. A rollback in between shows as an empty
        chunk, after which the data starts again at offset 0."""
        resp = _wire.stream_pty_output(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, offset=str(offset))
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
        r = _wire.wait_pty(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, timeout_ms=timeout_ms)
        return PtyExit(r.get("exitCode"), r.get("reason", "exited"))

    def kill(self) -> bool:
        """Kills the PTY and the program on it; False if it had already ended."""
        return bool(_wire.kill_pty(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid)["killed"])


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
        r = _wire.create_pty(self._sandbox._t, id=self._sandbox.sandbox_id, cols=cols, rows=rows, cmd=cmd, envs=envs, cwd=cwd)
        h = PtyHandle(self._sandbox, r["pid"])
        if on_data is not None:
            threading.Thread(target=h.follow, args=(on_data,), daemon=True).start()
        return h

    def connect(self, pid: int) -> PtyHandle:
        """Reattaches by id (InvalidArgumentError unless the sandbox has that PTY)."""
        h = PtyHandle(self._sandbox, pid)
        h.output()
        return h

    def list(self) -> List[Dict[str, Any]]:
        return _wire.list_ptys(self._sandbox._t, id=self._sandbox.sandbox_id)
