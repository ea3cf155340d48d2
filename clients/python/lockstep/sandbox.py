"""A Lockstep sandbox over the HTTP API, with E2B-like names:
``Sandbox.create`` / ``connect`` / ``list`` / ``kill``, and ``sbx.commands``,
``sbx.files``, ``sbx.effects``, ``sbx.checkpoint``, ``sbx.rollback``,
``sbx.fork``."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Union

from . import _wire
from ._transport import Transport
from .errors import InvalidArgumentError, LockstepConnectionError, LockstepError, NotFoundError, error_from_wire, fork_results
from .pty import Pty

_SANDBOX_ID = re.compile(r"^sbx_[a-z0-9]+$")


@dataclass
class CommandResult:
    """A finished command. A non-zero exit code is a result, not an error."""

    exit_code: int
    stdout: str
    stderr: str
    signal: Optional[str] = None
    truncated: bool = False
    duration_ms: float = 0.0
    observation_id: Optional[str] = None

    @classmethod
    def _from_wire(cls, d: Dict[str, Any], stdout: Optional[str] = None, stderr: Optional[str] = None) -> "CommandResult":
        return cls(
            exit_code=d["exitCode"],
            stdout=d.get("stdout", "") if stdout is None else stdout,
            stderr=d.get("stderr", "") if stderr is None else stderr,
            signal=d.get("signal"),
            truncated=bool(d.get("truncated", False)),
            duration_ms=float(d.get("durationMs", 0.0)),
            observation_id=d.get("observationId"),
        )


@dataclass
class SandboxInfo:
    """A sandbox as the API shows it."""

    sandbox_id: str
    image: str
    state: str
    metadata: Dict[str, str]
    memory_mb: Optional[float]
    head_checkpoint_id: Optional[str]
    forked_from: Optional[str]
    created_at: str
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @classmethod
    def _from_wire(cls, d: Dict[str, Any]) -> "SandboxInfo":
        return cls(
            sandbox_id=d["id"],
            image=d["image"],
            state=d["state"],
            metadata=d.get("metadata") or {},
            memory_mb=d.get("memoryMb"),
            head_checkpoint_id=d.get("headCheckpointId"),
            forked_from=d.get("forkedFrom"),
            created_at=d["createdAt"],
            raw=d,
        )


def _checked_id(sandbox_id: str) -> str:
    """The sandbox id, checked before it goes into a path (InvalidArgumentError naming sandbox_id)."""
    if not isinstance(sandbox_id, str) or not _SANDBOX_ID.match(sandbox_id):
        raise InvalidArgumentError("INVALID_ARGUMENT", f"Invalid sandbox_id: expected a sandbox id (sbx_...), received {sandbox_id!r}", field="sandbox_id")
    return sandbox_id


def _drop_none(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _keywords(fn: Callable[..., Any], spec: Dict[str, Any], what: str) -> Dict[str, Any]:
    """A body spelled with the API's names (camelCase) as the keyword arguments of a generated
    function; InvalidArgumentError naming a property the operation does not take."""
    accepted = inspect.signature(fn).parameters
    out: Dict[str, Any] = {}
    for k, v in spec.items():
        name = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", str(k)).lower()
        if name not in accepted or accepted[name].kind is not inspect.Parameter.KEYWORD_ONLY or name == "id":
            raise InvalidArgumentError("INVALID_ARGUMENT", f"Invalid {what}: {k!r} is not one of its properties", field=str(k))
        out[name] = v
    return out


class _class_or_instance:
    """``Sandbox.kill(id)`` on the class and ``sbx.kill()`` on an instance, as E2B has them."""

    def __init__(self, on_class: Callable[..., Any], on_instance: Callable[..., Any]):
        self._on_class = on_class
        self._on_instance = on_instance

    def __get__(self, obj: Any, owner: type) -> Callable[..., Any]:
        if obj is None:
            return functools.partial(self._on_class, owner)
        return functools.partial(self._on_instance, obj)


def _kill(transport: Transport, sandbox_id: str) -> bool:
    try:
        _wire.remove_sandbox(transport, id=_checked_id(sandbox_id))
        return True
    except NotFoundError:
        return False


@dataclass
class CommandOutput:
    """New output of a background command. ``rewound``: a rollback took the output back, and this starts at 0."""

    stdout: str
    stderr: str
    stdout_offset: int
    stderr_offset: int
    rewound: bool
    running: bool


class CommandHandle:
    """A background command: wait for it or signal it."""

    def __init__(self, sandbox: "Sandbox", pid: int):
        self._sandbox = sandbox
        self.pid = pid

    def wait(self, timeout_ms: Optional[int] = None) -> Optional[int]:
        """The exit code once it has exited (None if it was killed before reporting one)."""
        return _wire.wait_command(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, timeout_ms=timeout_ms)["exitCode"]

    def kill(self, signal: str = "SIGKILL") -> bool:
        """Sends a signal; False if it had already exited."""
        return bool(_wire.kill_command(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, signal=signal)["killed"])

    def send_stdin(self, data: Union[str, bytes]) -> None:
        """Writes bytes (str as UTF-8) to its stdin; it must have been started
        with stdin=True. InvalidStateError STDIN_FULL (nothing written) while it
        leaves too much unread, STDIN_CLOSED after close_stdin or once it exited."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        # Raw bytes: a body the document does not describe, so sent here.
        self._sandbox._t.json(*_wire.route("sendCommandStdin", id=self._sandbox.sandbox_id, pid=self.pid), body=raw)

    def close_stdin(self) -> None:
        """Closes its stdin: it reads EOF after what was sent before."""
        _wire.close_command_stdin(self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid)

    def output(self, stdout_offset: int = 0, stderr_offset: int = 0) -> CommandOutput:
        """What it wrote since the byte offsets (default the start); continue from the returned offsets."""
        r = _wire.get_command_output(
            self._sandbox._t, id=self._sandbox.sandbox_id, pid=self.pid, stdout_offset=str(stdout_offset), stderr_offset=str(stderr_offset)
        )
        return CommandOutput(r["stdout"], r["stderr"], r["offsets"]["stdout"], r["offsets"]["stderr"], bool(r["rewound"]), bool(r["running"]))


class Commands:
    """Commands of a sandbox."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    def connect(self, pid: int) -> CommandHandle:
        """Reattaches to a background command by pid (InvalidArgumentError unless the sandbox started one)."""
        h = CommandHandle(self._sandbox, pid)
        h.output()
        return h

    def list(self) -> List[Dict[str, Any]]:
        """Background commands: [{pid, running, exitCode}]."""
        return _wire.list_commands(self._sandbox._t, id=self._sandbox.sandbox_id)

    def run(
        self,
        cmd: Union[str, List[str]],
        *,
        cwd: Optional[str] = None,
        envs: Optional[Dict[str, str]] = None,
        timeout_ms: Optional[int] = None,
        tool_call_id: Optional[str] = None,
        background: bool = False,
        stdin: bool = False,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> Union[CommandResult, CommandHandle]:
        """Runs a command (a string through /bin/sh -c, a list as argv). With
        on_stdout/on_stderr the output is streamed as it is produced;
        background=True returns a CommandHandle at once (with stdin=True its
        stdin stays open for send_stdin)."""
        t = self._sandbox._t
        sid = self._sandbox.sandbox_id
        options: Dict[str, Any] = {
            "cwd": cwd,
            "envs": envs,
            "timeout_ms": timeout_ms,
            "tool_call_id": tool_call_id,
            "background": True if background else None,
            "stdin": True if stdin else None,
        }
        if background:
            return CommandHandle(self._sandbox, _wire.run_command(t, id=sid, cmd=cmd, **options)["pid"])
        if on_stdout is None and on_stderr is None:
            return CommandResult._from_wire(_wire.run_command(t, id=sid, cmd=cmd, **options))
        # Streamed output (Accept: application/x-ndjson), a variant the document does not describe.
        body = _drop_none({"cmd": cmd, "cwd": cwd, "envs": envs, "timeoutMs": timeout_ms, "toolCallId": tool_call_id, "stdin": options["stdin"]})
        resp = t.request(*_wire.route("runCommand", id=sid), json_body=body, accept="application/x-ndjson")
        out: List[str] = []
        err: List[str] = []
        result: Optional[Dict[str, Any]] = None
        for line in resp.iter_lines():
            if not line.strip():
                continue
            ev = json.loads(line)
            kind = ev.get("type")
            if kind == "stdout":
                out.append(ev["data"])
                if on_stdout:
                    on_stdout(ev["data"])
            elif kind == "stderr":
                err.append(ev["data"])
                if on_stderr:
                    on_stderr(ev["data"])
            elif kind == "result":
                result = ev
            elif kind == "error":
                raise error_from_wire(500, ev.get("error") or {})
        if result is None:
            raise LockstepConnectionError("The command stream ended before its result: the connection was cut")
        return CommandResult._from_wire(result, "".join(out), "".join(err))


@dataclass
class EntryInfo:
    """One directory entry."""

    name: str
    path: str
    type: str
    size: int


@dataclass
class FilePage:
    """One page of a directory listing: pass ``next_cursor`` to ``list_page`` for the next (None: the last)."""

    entries: List[EntryInfo]
    next_cursor: Optional[str]


# The most entries the server returns in one page (LIST_MAX_LIMIT in src/instances/files.ts).
_LIST_MAX_LIMIT = 10000


class Files:
    """Files of a sandbox; the agent's reads and writes are recorded as observations."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    def read(self, path: str, *, tool_call_id: Optional[str] = None) -> bytes:
        # The raw bytes (Accept: application/octet-stream), a variant the document does not describe.
        method, route = _wire.route("readFile", id=self._sandbox.sandbox_id)
        resp = self._sandbox._t.request(method, route, query={"path": path, "toolCallId": tool_call_id}, accept="application/octet-stream")
        sent = resp.headers.get("x-lockstep-sha256")
        data = resp.read()
        if sent and hashlib.sha256(data).hexdigest() != sent:
            raise LockstepConnectionError(f"The bytes of {path} arrived damaged")
        return data

    def read_text(self, path: str, **kw: Any) -> str:
        return self.read(path, **kw).decode("utf-8")

    def read_stream(self, path: str, *, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """The file's bytes in chunks, for files of any size."""
        method, route = _wire.route("readFile", id=self._sandbox.sandbox_id)
        resp = self._sandbox._t.request(method, route, query={"path": path}, accept="application/octet-stream")
        return resp.iter_chunks(chunk_size)

    def write(self, path: str, data: Union[str, bytes], *, tool_call_id: Optional[str] = None) -> Dict[str, Any]:
        """Writes a file (parents are created); returns {path, sha256, bytes, observationId}."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        return _wire.write_file(self._sandbox._t, id=self._sandbox.sandbox_id, path=path, data=raw, tool_call_id=tool_call_id)

    def write_stream(self, path: str, chunks: Iterable[bytes]) -> Dict[str, Any]:
        """Writes a file from an iterable of chunks, sent as they come (not retried)."""
        return _wire.write_file(self._sandbox._t, id=self._sandbox.sandbox_id, path=path, data=iter(chunks))

    def list(self, path: str = "/workspace") -> List[EntryInfo]:
        """Every entry of a directory, sorted by name (pages through list_page, 10000 entries a request)."""
        entries: List[EntryInfo] = []
        cursor: Optional[str] = None
        while True:
            page = self.list_page(path, limit=_LIST_MAX_LIMIT, cursor=cursor)
            entries.extend(page.entries)
            cursor = page.next_cursor
            if cursor is None:
                return entries

    def list_page(self, path: str = "/workspace", *, limit: Optional[int] = None, cursor: Optional[str] = None) -> "FilePage":
        """One page of a directory, sorted by name: at most ``limit`` entries (server default 1000, at most
        10000) after ``cursor``, the previous page's ``next_cursor``; ``next_cursor`` is None on the last page."""
        r = _wire.list_files(self._sandbox._t, id=self._sandbox.sandbox_id, path=path, limit=None if limit is None else str(limit), cursor=cursor)
        return FilePage(
            [EntryInfo(e["name"], e["path"], e["type"], e["size"]) for e in r["entries"]], r.get("nextCursor")
        )

    def exists(self, path: str) -> bool:
        return bool(_wire.check_file_exists(self._sandbox._t, id=self._sandbox.sandbox_id, path=path)["exists"])

    def remove(self, path: str) -> None:
        _wire.remove_file(self._sandbox._t, id=self._sandbox.sandbox_id, path=path)


class Effect:
    """One effect, as a context manager or a decorator (see Effects.effect)."""

    def __init__(self, effects: "Effects", kind: str, input: Any, key: Optional[str], reversibility: str):
        self._effects = effects
        self.kind = kind
        self.input = input
        self.key = key
        self.reversibility = reversibility
        self.effect_id: Optional[str] = None
        self.replayed = False
        self.output: Any = None

    def _spec(self, input: Any) -> Dict[str, Any]:
        return _drop_none({"kind": self.kind, "input": input, "key": self.key, "reversibility": self.reversibility})

    # Context manager: the body runs only when `not e.replayed`; set e.output.
    def __enter__(self) -> "Effect":
        r = self._effects.begin(self._spec(self.input))
        self.effect_id = r["effectId"]
        self.replayed = bool(r["replayed"])
        if self.replayed:
            self.output = r.get("output")
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self.replayed:
            return False
        if exc is None:
            self._effects.commit(self.effect_id, self.output)
        else:
            self._effects.fail(self.effect_id, exc, definite=getattr(exc, "definite", False) is True)
        return False

    # Decorator: the call's arguments are the input (unless one was given); a replay returns the recorded output.
    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inp = self.input if self.input is not None else {"args": list(args), "kwargs": kwargs}
            r = self._effects.begin(self._spec(inp))
            if r["replayed"]:
                return r.get("output")
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:
                self._effects.fail(r["effectId"], e, definite=getattr(e, "definite", False) is True)
                raise
            self._effects.commit(r["effectId"], out)
            return out

        return wrapper


class Effects:
    """The effect ledger of a sandbox: intents recorded before side effects run, so
    that after a rollback or in a fork a committed effect is not run again."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    def effect(self, kind: str, input: Any = None, *, key: Optional[str] = None, reversibility: str = "irreversible") -> Effect:
        """``with sbx.effects.effect("email.send", {...}, key="k") as e:`` (run the effect when
        ``not e.replayed`` and set ``e.output``), or ``@sbx.effects.effect("email.send")`` on a function."""
        return Effect(self, kind, input, key, reversibility)

    def begin(self, spec: Dict[str, Any]) -> Dict[str, Any]:
        return _wire.begin_effect(self._sandbox._t, id=self._sandbox.sandbox_id, **_keywords(_wire.begin_effect, spec, "effect spec"))

    def commit(self, effect_id: Optional[str], output: Any = None) -> Dict[str, Any]:
        return _wire.commit_effect(self._sandbox._t, id=self._sandbox.sandbox_id, effect_id=str(effect_id), output=output)

    def fail(self, effect_id: Optional[str], error: BaseException, *, definite: bool) -> Dict[str, Any]:
        err = {"name": type(error).__name__[:200], "message": str(error)[:4000]}
        return _wire.fail_effect(self._sandbox._t, id=self._sandbox.sandbox_id, effect_id=str(effect_id), error=err, definite=definite)

    def list(self) -> List[Dict[str, Any]]:
        return _wire.list_effects(self._sandbox._t, id=self._sandbox.sandbox_id)

    def get(self, effect_id: str) -> Dict[str, Any]:
        """One effect of this sandbox (NotFoundError EFFECT_NOT_FOUND unless it recorded it)."""
        return _wire.get_effect(self._sandbox._t, id=self._sandbox.sandbox_id, effect_id=effect_id)

    def resolve_unknown(self, effect_id: str, outcome: str, output: Any = None) -> Dict[str, Any]:
        """Settles an effect whose outcome is unknown, after checking the outside world:
        ``outcome`` "committed" (with its ``output``) or "failed". Returns the effect."""
        kept = output if outcome == "committed" else None
        return _wire.resolve_effect(self._sandbox._t, id=self._sandbox.sandbox_id, effect_id=effect_id, outcome=outcome, output=kept)


class Verdicts:
    """Verdicts about files of a sandbox, bound to the file's content hash: one goes
    stale when the file changes."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    def record(self, path: str, verdict: str, *, tool_call_id: Optional[str] = None) -> Dict[str, Any]:
        """Records a verdict about the file as it is now; returns it (with ``contentHash``)."""
        return _wire.record_verdict(self._sandbox._t, id=self._sandbox.sandbox_id, path=path, verdict=verdict, tool_call_id=tool_call_id)

    def list(self) -> List[Dict[str, Any]]:
        return _wire.list_verdicts(self._sandbox._t, id=self._sandbox.sandbox_id)

    def stale(self) -> List[Dict[str, Any]]:
        """Verdicts whose file no longer has the content they were made on."""
        return _wire.list_verdicts(self._sandbox._t, id=self._sandbox.sandbox_id, stale="true")


class Ports:
    """Ports the sandbox listens on, exposed through the server at ``/ports/<id>/``
    (E2B's ``get_host``). The token is returned only by ``expose``; send it as
    the ``X-Lockstep-Token`` header (or ``?lockstep_token=``)."""

    def __init__(self, sandbox: "Sandbox"):
        self._sandbox = sandbox

    def expose(self, port: int) -> Dict[str, Any]:
        """``{id, sandboxId, port, path, url, token, createdAt}``; PORT_NOT_LISTENING when nothing listens there."""
        return _wire.expose_port(self._sandbox._t, id=self._sandbox.sandbox_id, port=port)

    def list(self) -> List[Dict[str, Any]]:
        return _wire.list_ports(self._sandbox._t, id=self._sandbox.sandbox_id)

    def close(self, port: int) -> bool:
        """Closes an exposed port; False when it was not exposed."""
        return bool(_wire.close_port(self._sandbox._t, id=self._sandbox.sandbox_id, port=int(port))["closed"])


class Sandbox:
    """A sandbox of the calling tenant. Get one with Sandbox.create or Sandbox.connect."""

    def __init__(self, sandbox_id: str, transport: Transport):
        self.sandbox_id = sandbox_id
        self._t = transport
        self.commands = Commands(self)
        self.pty = Pty(self)
        self.files = Files(self)
        self.effects = Effects(self)
        self.verdicts = Verdicts(self)
        self.ports = Ports(self)

    @classmethod
    def create(
        cls,
        image: Optional[str] = None,
        *,
        api_url: Optional[str] = None,
        api_key: Optional[str] = None,
        memory_mb: Optional[int] = None,
        pids: Optional[int] = None,
        cpu_weight: Optional[int] = None,
        cpus: Optional[float] = None,
        io_weight: Optional[int] = None,
        disk_mb: Optional[int] = None,
        envs: Optional[Dict[str, str]] = None,
        network: Optional[str] = None,
        allow_out: Optional[List[str]] = None,
        bandwidth_mbit: Optional[int] = None,
        metadata: Optional[Dict[str, str]] = None,
        timeout_ms: Optional[int] = None,
        from_snapshot: Optional[str] = None,
        **transport_options: Any,
    ) -> "Sandbox":
        """Creates and starts a sandbox from an image, or from a snapshot (``from_snapshot``: its processes resume).
        ``network``: "none" (loopback only) or "egress" (outbound connections to ``allow_out``: addresses,
        CIDRs or domain names, each with an optional :PORT or :LOW-HIGH; none given: anywhere outside the deny list)."""
        t = Transport(api_url, api_key, **transport_options)
        info = _wire.create_sandbox(
            t,
            image=image,
            memory_mb=memory_mb,
            pids=pids,
            cpu_weight=cpu_weight,
            cpus=cpus,
            io_weight=io_weight,
            disk_mb=disk_mb,
            envs=envs,
            network=network,
            allow_out=allow_out,
            bandwidth_mbit=bandwidth_mbit,
            metadata=metadata,
            timeout_ms=timeout_ms,
            from_snapshot=from_snapshot,
        )
        return cls(info["id"], t)

    @classmethod
    def connect(cls, sandbox_id: str, *, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any) -> "Sandbox":
        t = Transport(api_url, api_key, **transport_options)
        info = _wire.get_sandbox(t, id=_checked_id(sandbox_id))
        return cls(info["id"], t)

    @classmethod
    def list(cls, *, metadata: Optional[Dict[str, str]] = None, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any) -> List[SandboxInfo]:
        """The tenant's sandboxes, oldest first; with metadata, those whose labels include every pair."""
        t = Transport(api_url, api_key, **transport_options)
        if not metadata:
            return [SandboxInfo._from_wire(d) for d in _wire.list_sandboxes(t)]
        # The server filters: ?metadata.KEY=VALUE for each label asked for (parameters the document cannot name).
        query: Dict[str, Optional[str]] = {f"metadata.{k}": v for k, v in metadata.items()}
        return [SandboxInfo._from_wire(d) for d in t.json(*_wire.route("listSandboxes"), query=query)]

    def _kill_class(cls, sandbox_id: str, *, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any) -> bool:
        return _kill(Transport(api_url, api_key, **transport_options), sandbox_id)

    def _kill_instance(self) -> bool:
        return _kill(self._t, self.sandbox_id)

    kill = _class_or_instance(_kill_class, _kill_instance)
    """``Sandbox.kill(id, api_key=...)`` or ``sbx.kill()``: removes the sandbox; False if it was already gone."""

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()

    def get_info(self) -> SandboxInfo:
        return SandboxInfo._from_wire(_wire.get_sandbox(self._t, id=self.sandbox_id))

    def checkpoint(self, *, label: Optional[str] = None, context: Any = None, context_format: Optional[str] = None) -> Dict[str, Any]:
        """Checkpoints files, processes, the agent's context and the ledger cursor together."""
        return _wire.create_checkpoint(self._t, id=self.sandbox_id, label=label, context=context, context_format=context_format)

    def checkpoints(self) -> List[Dict[str, Any]]:
        return _wire.list_checkpoints(self._t, id=self.sandbox_id)

    def context(self, checkpoint_id: str) -> Any:
        """The context stored with a checkpoint (None if none)."""
        return _wire.get_checkpoint_context(self._t, id=self.sandbox_id, ckpt=checkpoint_id)["context"]

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Deletes a checkpoint (its children move to its parent)."""
        _wire.delete_checkpoint(self._t, id=self.sandbox_id, ckpt=checkpoint_id)

    def rollback(
        self,
        checkpoint_id: str,
        *,
        policy: Optional[str] = None,
        failure: Optional[str] = None,
        lessons: Optional[List[str]] = None,
        with_recovery_summary: Optional[bool] = None,
    ) -> Dict[str, Any]:
        """Rolls back to a checkpoint; the report has the context, stale observations, effects after it and warnings
        (and recoverySummary, contextWithRecovery unless ``with_recovery_summary=False``)."""
        return _wire.rollback_sandbox(
            self._t,
            id=self.sandbox_id,
            checkpoint_id=checkpoint_id,
            policy=policy,
            failure=failure,
            lessons=lessons,
            with_recovery_summary=with_recovery_summary,
        )

    def fork(self, checkpoint_id: str, count: int = 1) -> List[Union["Sandbox", LockstepError]]:
        """Starts sandboxes from a checkpoint: one result per fork, in order, a ``Sandbox``
        or, for a fork that failed, its error (the exception class its code maps to, not raised)."""
        r = _wire.fork_sandbox(self._t, id=self.sandbox_id, checkpoint_id=checkpoint_id, count=count)
        return [Sandbox(i, self._t) if isinstance(i, str) else i for i in fork_results(r)]

    def observations(self, *, include_stale: bool = False) -> List[Dict[str, Any]]:
        return _wire.list_observations(self._t, id=self.sandbox_id, include_stale="true" if include_stale else None)


def get_tenant(*, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any) -> Dict[str, Any]:
    """The tenant the API key belongs to: its id (tn_...), name, quotas and ``usage``."""
    return _wire.get_tenant(Transport(api_url, api_key, **transport_options))


def list_images(*, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any) -> List[Dict[str, Any]]:
    """Images to create sandboxes from (ready: False for recipes the operator has not built)."""
    return _wire.list_images(Transport(api_url, api_key, **transport_options))
