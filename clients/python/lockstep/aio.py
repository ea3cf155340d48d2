"""The async SDK: the same names as the sync one, awaitable.

The standard library has no async HTTP client, so each call runs the sync
client's request on a worker thread (asyncio.to_thread): the event loop is
never blocked, and no dependency beyond Debian's python3 is needed. A call
that is one operation of the API awaits its generated ``_async`` function
(_wire.py); the others run the sync method on the thread. Streamed command
output is delivered to the callbacks from that thread.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional, Union

from . import _wire
from ._transport import Transport
from .errors import LockstepError
from .pty import PtyExit, PtyHandle, PtyOutput
from .sandbox import CommandHandle, CommandOutput, CommandResult, EntryInfo, FilePage, Sandbox, SandboxInfo


class AsyncCommandHandle:
    def __init__(self, handle: CommandHandle):
        self._h = handle
        self.pid = handle.pid

    async def wait(self, timeout_ms: Optional[int] = None) -> Optional[int]:
        sbx = self._h._sandbox
        return (await _wire.wait_command_async(sbx._t, id=sbx.sandbox_id, pid=self.pid, timeout_ms=timeout_ms))["exitCode"]

    async def kill(self, signal: str = "SIGKILL") -> bool:
        sbx = self._h._sandbox
        return bool((await _wire.kill_command_async(sbx._t, id=sbx.sandbox_id, pid=self.pid, signal=signal))["killed"])

    async def output(self, stdout_offset: int = 0, stderr_offset: int = 0) -> CommandOutput:
        return await asyncio.to_thread(self._h.output, stdout_offset, stderr_offset)

    async def send_stdin(self, data: Union[str, bytes]) -> None:
        await asyncio.to_thread(self._h.send_stdin, data)

    async def close_stdin(self) -> None:
        await asyncio.to_thread(self._h.close_stdin)


class AsyncPtyHandle:
    def __init__(self, handle: PtyHandle):
        self._h = handle
        self.pid = handle.pid

    async def write(self, data: Union[str, bytes]) -> None:
        await asyncio.to_thread(self._h.write, data)

    async def resize(self, cols: int, rows: int) -> None:
        await asyncio.to_thread(self._h.resize, cols, rows)

    async def output(self, offset: int = 0) -> PtyOutput:
        return await asyncio.to_thread(self._h.output, offset)

    async def follow(self, on_data: Callable[[bytes], None], offset: int = 0) -> PtyExit:
        """on_data is called from the worker thread that reads the stream."""
        return await asyncio.to_thread(self._h.follow, on_data, offset)

    async def wait(self, timeout_ms: Optional[int] = None) -> PtyExit:
        return await asyncio.to_thread(self._h.wait, timeout_ms)

    async def kill(self) -> bool:
        sbx = self._h._sandbox
        return bool((await _wire.kill_pty_async(sbx._t, id=sbx.sandbox_id, pid=self.pid))["killed"])


class AsyncPty:
    def __init__(self, sbx: Sandbox):
        self._sbx = sbx

    async def create(self, cols: int, rows: int, **kw: Any) -> AsyncPtyHandle:
        return AsyncPtyHandle(await asyncio.to_thread(functools.partial(self._sbx.pty.create, cols, rows, **kw)))

    async def connect(self, pid: int) -> AsyncPtyHandle:
        return AsyncPtyHandle(await asyncio.to_thread(self._sbx.pty.connect, pid))

    async def list(self) -> List[Dict[str, Any]]:
        return await _wire.list_ptys_async(self._sbx._t, id=self._sbx.sandbox_id)


class AsyncCommands:
    def __init__(self, sbx: Sandbox):
        self._sbx = sbx

    async def connect(self, pid: int) -> AsyncCommandHandle:
        return AsyncCommandHandle(await asyncio.to_thread(self._sbx.commands.connect, pid))

    async def list(self) -> List[Dict[str, Any]]:
        return await _wire.list_commands_async(self._sbx._t, id=self._sbx.sandbox_id)

    async def run(self, cmd: Union[str, List[str]], **kw: Any) -> Union[CommandResult, AsyncCommandHandle]:
        r = await asyncio.to_thread(functools.partial(self._sbx.commands.run, cmd, **kw))
        return AsyncCommandHandle(r) if isinstance(r, CommandHandle) else r


class AsyncFiles:
    def __init__(self, sbx: Sandbox):
        self._sbx = sbx

    async def read(self, path: str, **kw: Any) -> bytes:
        return await asyncio.to_thread(functools.partial(self._sbx.files.read, path, **kw))

    async def read_text(self, path: str, **kw: Any) -> str:
        return (await self.read(path, **kw)).decode("utf-8")

    async def write(self, path: str, data: Union[str, bytes], **kw: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(functools.partial(self._sbx.files.write, path, data, **kw))

    async def write_stream(self, path: str, chunks: Iterable[bytes]) -> Dict[str, Any]:
        return await asyncio.to_thread(self._sbx.files.write_stream, path, chunks)

    async def list(self, path: str = "/workspace") -> List[EntryInfo]:
        return await asyncio.to_thread(self._sbx.files.list, path)

    async def list_page(
        self, path: str = "/workspace", *, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> FilePage:
        return await asyncio.to_thread(functools.partial(self._sbx.files.list_page, path, limit=limit, cursor=cursor))

    async def exists(self, path: str) -> bool:
        return bool((await _wire.check_file_exists_async(self._sbx._t, id=self._sbx.sandbox_id, path=path))["exists"])

    async def remove(self, path: str) -> None:
        await _wire.remove_file_async(self._sbx._t, id=self._sbx.sandbox_id, path=path)


class AsyncEffect:
    """``async with`` an effect, or decorate an async function with it."""

    def __init__(self, effects: "AsyncEffects", kind: str, input: Any, key: Optional[str], reversibility: str):
        self._sync = effects._sbx.effects.effect(kind, input, key=key, reversibility=reversibility)

    @property
    def replayed(self) -> bool:
        return self._sync.replayed

    @property
    def effect_id(self) -> Optional[str]:
        return self._sync.effect_id

    @property
    def output(self) -> Any:
        return self._sync.output

    @output.setter
    def output(self, value: Any) -> None:
        self._sync.output = value

    async def __aenter__(self) -> "AsyncEffect":
        await asyncio.to_thread(self._sync.__enter__)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        return await asyncio.to_thread(self._sync.__exit__, exc_type, exc, tb)

    def __call__(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        e = self._sync

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            inp = e.input if e.input is not None else {"args": list(args), "kwargs": kwargs}
            r = await asyncio.to_thread(e._effects.begin, e._spec(inp))
            if r["replayed"]:
                return r.get("output")
            try:
                out = await fn(*args, **kwargs)
            except BaseException as err:
                await asyncio.to_thread(functools.partial(e._effects.fail, r["effectId"], err, definite=getattr(err, "definite", False) is True))
                raise
            await asyncio.to_thread(e._effects.commit, r["effectId"], out)
            return out

        return wrapper


class AsyncEffects:
    def __init__(self, sbx: Sandbox):
        self._sbx = sbx

    def effect(self, kind: str, input: Any = None, *, key: Optional[str] = None, reversibility: str = "irreversible") -> AsyncEffect:
        return AsyncEffect(self, kind, input, key, reversibility)

    async def begin(self, spec: Dict[str, Any]) -> Dict[str, Any]:
        return await asyncio.to_thread(self._sbx.effects.begin, spec)

    async def commit(self, effect_id: str, output: Any = None) -> Dict[str, Any]:
        return await asyncio.to_thread(self._sbx.effects.commit, effect_id, output)

    async def fail(self, effect_id: str, error: BaseException, *, definite: bool) -> Dict[str, Any]:
        return await asyncio.to_thread(functools.partial(self._sbx.effects.fail, effect_id, error, definite=definite))

    async def list(self) -> List[Dict[str, Any]]:
        return await _wire.list_effects_async(self._sbx._t, id=self._sbx.sandbox_id)

    async def get(self, effect_id: str) -> Dict[str, Any]:
        return await _wire.get_effect_async(self._sbx._t, id=self._sbx.sandbox_id, effect_id=effect_id)

    async def resolve_unknown(self, effect_id: str, outcome: str, output: Any = None) -> Dict[str, Any]:
        return await asyncio.to_thread(self._sbx.effects.resolve_unknown, effect_id, outcome, output)


class AsyncVerdicts:
    def __init__(self, sbx: Sandbox):
        self._sbx = sbx

    async def record(self, path: str, verdict: str, **kw: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(functools.partial(self._sbx.verdicts.record, path, verdict, **kw))

    async def list(self) -> List[Dict[str, Any]]:
        return await _wire.list_verdicts_async(self._sbx._t, id=self._sbx.sandbox_id)

    async def stale(self) -> List[Dict[str, Any]]:
        return await _wire.list_verdicts_async(self._sbx._t, id=self._sbx.sandbox_id, stale="true")


class AsyncPorts:
    def __init__(self, sbx: Sandbox):
        self._sbx = sbx

    async def expose(self, port: int) -> Dict[str, Any]:
        return await _wire.expose_port_async(self._sbx._t, id=self._sbx.sandbox_id, port=port)

    async def list(self) -> List[Dict[str, Any]]:
        return await _wire.list_ports_async(self._sbx._t, id=self._sbx.sandbox_id)

    async def close(self, port: int) -> bool:
        return await asyncio.to_thread(self._sbx.ports.close, port)


class AsyncSandbox:
    """The async twin of Sandbox: ``await AsyncSandbox.create(...)``."""

    def __init__(self, sbx: Sandbox):
        self._sbx = sbx
        self.sandbox_id = sbx.sandbox_id
        self.commands = AsyncCommands(sbx)
        self.pty = AsyncPty(sbx)
        self.files = AsyncFiles(sbx)
        self.effects = AsyncEffects(sbx)
        self.verdicts = AsyncVerdicts(sbx)
        self.ports = AsyncPorts(sbx)

    @classmethod
    async def create(cls, image: Optional[str] = None, **kw: Any) -> "AsyncSandbox":
        return cls(await asyncio.to_thread(functools.partial(Sandbox.create, image, **kw)))

    @classmethod
    async def connect(cls, sandbox_id: str, **kw: Any) -> "AsyncSandbox":
        return cls(await asyncio.to_thread(functools.partial(Sandbox.connect, sandbox_id, **kw)))

    @classmethod
    async def list(cls, **kw: Any) -> List[SandboxInfo]:
        return await asyncio.to_thread(functools.partial(Sandbox.list, **kw))

    async def kill(self) -> bool:
        return await asyncio.to_thread(self._sbx.kill)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.kill()

    async def get_info(self) -> SandboxInfo:
        return await asyncio.to_thread(self._sbx.get_info)

    async def checkpoint(self, **kw: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(functools.partial(self._sbx.checkpoint, **kw))

    async def checkpoints(self) -> List[Dict[str, Any]]:
        return await _wire.list_checkpoints_async(self._sbx._t, id=self.sandbox_id)

    async def context(self, checkpoint_id: str) -> Any:
        return (await _wire.get_checkpoint_context_async(self._sbx._t, id=self.sandbox_id, ckpt=checkpoint_id))["context"]

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        await _wire.delete_checkpoint_async(self._sbx._t, id=self.sandbox_id, ckpt=checkpoint_id)

    async def rollback(self, checkpoint_id: str, **kw: Any) -> Dict[str, Any]:
        return await asyncio.to_thread(functools.partial(self._sbx.rollback, checkpoint_id, **kw))

    async def fork(self, checkpoint_id: str, count: int = 1) -> List[Union["AsyncSandbox", LockstepError]]:
        """One result per fork, in order: an ``AsyncSandbox``, or the failed fork's error (not raised)."""
        return [AsyncSandbox(s) if isinstance(s, Sandbox) else s for s in await asyncio.to_thread(self._sbx.fork, checkpoint_id, count)]

    async def observations(self, *, include_stale: bool = False) -> List[Dict[str, Any]]:
        return await asyncio.to_thread(functools.partial(self._sbx.observations, include_stale=include_stale))


async def get_tenant_async(*, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any) -> Dict[str, Any]:
    """The tenant the API key belongs to, as get_tenant."""
    return await _wire.get_tenant_async(Transport(api_url, api_key, **transport_options))


async def list_images_async(*, api_url: Optional[str] = None, api_key: Optional[str] = None, **transport_options: Any) -> List[Dict[str, Any]]:
    """Images to create sandboxes from, as list_images."""
    return await _wire.list_images_async(Transport(api_url, api_key, **transport_options))
