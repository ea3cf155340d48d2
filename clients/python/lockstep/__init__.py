"""Lockstep's Python SDK: copy-on-write sandboxes for AI agents, over the HTTP
API of ``lockstep serve``. Standard library only.

    from lockstep import Sandbox
    with Sandbox.create(api_url="http://127.0.0.1:7878", api_key="lst_...") as sbx:
        print(sbx.commands.run("echo hi").stdout)
"""

from .aio import AsyncCommandHandle, AsyncPtyHandle, AsyncSandbox, get_tenant_async, list_images_async
from .errors import (
    CommandAbortedError,
    InvalidArgumentError,
    InvalidStateError,
    LockstepConnectionError,
    LockstepError,
    NotFoundError,
    QuotaExceededError,
)
from .pty import PtyExit, PtyHandle, PtyOutput
from .sandbox import CommandHandle, CommandOutput, CommandResult, EntryInfo, FilePage, Sandbox, SandboxInfo, get_tenant, list_images
from .snapshots import Snapshots

__all__ = [
    "AsyncCommandHandle",
    "AsyncPtyHandle",
    "AsyncSandbox",
    "CommandAbortedError",
    "CommandHandle",
    "CommandOutput",
    "CommandResult",
    "EntryInfo",
    "FilePage",
    "InvalidArgumentError",
    "InvalidStateError",
    "LockstepConnectionError",
    "LockstepError",
    "NotFoundError",
    "PtyExit",
    "PtyHandle",
    "PtyOutput",
    "QuotaExceededError",
    "Sandbox",
    "SandboxInfo",
    "Snapshots",
    "get_tenant",
    "get_tenant_async",
    "list_images",
    "list_images_async",
]
__version__ = "0.1.0"
