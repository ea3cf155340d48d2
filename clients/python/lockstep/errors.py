"""Typed errors: the server's ``{"error": {"code", "message", "field"}}`` bodies
as exceptions. Callers branch on ``code`` (stable), never on the message."""

from __future__ import annotations

from typing import Dict, List, Optional, Type, Union


class LockstepError(Exception):
    """Base class of every error the SDK raises; ``code`` is stable."""

    def __init__(self, code: str, message: str, *, field: Optional[str] = None, status: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.status = status

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, field={self.field!r})"


class InvalidArgumentError(LockstepError):
    """Bad input; ``field`` names it."""


class NotFoundError(LockstepError):
    """No such sandbox, checkpoint, effect, file or image for this tenant."""


class InvalidStateError(LockstepError):
    """The object's state does not allow it (busy, not running, key in use, ...)."""


class CommandAbortedError(LockstepError):
    """The command timed out (COMMAND_TIMEOUT) or was aborted (COMMAND_ABORTED)."""


class QuotaExceededError(LockstepError):
    """The tenant's quota would be exceeded."""


class LockstepConnectionError(LockstepError):
    """The server could not be reached, or the answer was not the API's."""

    def __init__(self, message: str):
        super().__init__("CONNECTION_FAILED", message)


# The exception each code arrives as: the same classes as the TypeScript
# client's CLASS_FOR_CODE (src/errors-from-wire.ts), plus QuotaExceededError.
# A code missing here (from a newer server) is a LockstepError carrying it.
# test/unit/errors-from-wire.test.ts checks that every ErrorCode is listed
# and that the classes agree.
CLASS_FOR_CODE: Dict[str, Type[LockstepError]] = {
    "INVALID_ARGUMENT": InvalidArgumentError,
    "INVALID_JSON": LockstepError,
    "BAD_REQUEST": LockstepError,
    "USAGE": LockstepError,
    "PATH_ESCAPES_SANDBOX": LockstepError,
    "CONTEXT_FORMAT_UNSUPPORTED": LockstepError,
    "FILE_TYPE_NOT_SUPPORTED": LockstepError,
    "FILE_TOO_LARGE": LockstepError,
    "PAYLOAD_TOO_LARGE": LockstepError,
    "UNSUPPORTED_MEDIA_TYPE": LockstepError,
    "LIMIT_UNSUPPORTED": LockstepError,
    "QUOTA_EXCEEDED": QuotaExceededError,
    "RATE_LIMITED": LockstepError,
    "UNAUTHENTICATED": LockstepError,
    "SANDBOX_NOT_FOUND": NotFoundError,
    "IMAGE_NOT_FOUND": NotFoundError,
    "CHECKPOINT_NOT_FOUND": NotFoundError,
    "EFFECT_NOT_FOUND": NotFoundError,
    "OBSERVATION_NOT_FOUND": NotFoundError,
    "CONTEXT_NOT_FOUND": NotFoundError,
    "LAYER_NOT_FOUND": NotFoundError,
    "TENANT_NOT_FOUND": NotFoundError,
    "FILE_NOT_FOUND": NotFoundError,
    "ROUTE_NOT_FOUND": LockstepError,
    "DOCKER_IMAGE_NOT_FOUND": NotFoundError,
    "BUNDLE_NOT_FOUND": NotFoundError,
    "SNAPSHOT_NOT_FOUND": NotFoundError,
    "EXPOSURE_NOT_FOUND": NotFoundError,
    "IMAGE_EXISTS": InvalidStateError,
    "TENANT_EXISTS": InvalidStateError,
    "SANDBOX_BUSY": InvalidStateError,
    "SANDBOX_NOT_RUNNING": InvalidStateError,
    "IMAGE_IN_USE": InvalidStateError,
    "TENANT_HAS_SANDBOXES": InvalidStateError,
    "NETWORK_NOT_ALLOWED": InvalidStateError,
    "FILE_BUSY": InvalidStateError,
    "CHECKPOINT_DAMAGED": InvalidStateError,
    "EFFECT_OUTCOME_UNKNOWN": InvalidStateError,
    "EFFECT_NOT_UNKNOWN": InvalidStateError,
    "EFFECT_NOT_COMPENSABLE": InvalidStateError,
    "EFFECT_ALREADY_SETTLED": InvalidStateError,
    "ROLLBACK_REFUSED_IRREVERSIBLE": InvalidStateError,
    "IDEMPOTENCY_KEY_CONFLICT": InvalidStateError,
    "IDEMPOTENCY_KEY_IN_PROGRESS": InvalidStateError,
    "IDEMPOTENCY_KEY_REUSED": InvalidStateError,
    "AGENT_STATE_SCHEMA_TOO_NEW": InvalidStateError,
    "LANGGRAPH_SANDBOX_DIVERGED": InvalidStateError,
    "LANGGRAPH_CONTEXT_MISSING": InvalidStateError,
    "CGROUP_TIMEOUT": InvalidStateError,
    "STDIN_FULL": InvalidStateError,
    "STDIN_CLOSED": InvalidStateError,
    "SNAPSHOT_EXISTS": InvalidStateError,
    "SNAPSHOT_BUSY": InvalidStateError,
    "PORT_NOT_LISTENING": InvalidStateError,
    "SNAPSHOT_INCOMPATIBLE": LockstepError,
    "BUNDLE_CORRUPT": InvalidStateError,
    "BUNDLE_UNTRUSTED": LockstepError,
    "PULL_SOURCE_NOT_ALLOWED": LockstepError,
    "STORE_NOT_CONFIGURED": LockstepError,
    "COMMAND_TIMEOUT": CommandAbortedError,
    "COMMAND_ABORTED": CommandAbortedError,
    "FORK_ABORTED": LockstepError,
    "FORK_FAILED": LockstepError,
    "SERVER_SHUTTING_DOWN": LockstepError,
    "IMAGE_BUILDING": InvalidStateError,
    "DISK_QUOTA_EXCEEDED": LockstepError,
    "DISK_FULL": LockstepError,
    "NATIVE_NOT_BUILT": LockstepError,
    "NATIVE_LOAD_FAILED": LockstepError,
    "NATIVE_BUILD_FAILED": LockstepError,
    "UNSUPPORTED_PLATFORM": LockstepError,
    "CRIU_NOT_INSTALLED": LockstepError,
    "HOST_PROVISIONING_FAILED": LockstepError,
    "CATALOG_TOO_NEW": LockstepError,
    "CONFIG_INVALID": LockstepError,
    "NOT_ROOT": LockstepError,
    "HOME_LOCKED": LockstepError,
    "MANAGER_CLOSED": LockstepError,
    "CRIU_TOO_OLD": LockstepError,
    "CRIU_UNAVAILABLE": LockstepError,
    "CRIU_CHECK_FAILED": LockstepError,
    "CRIU_DUMP_FAILED": LockstepError,
    "CRIU_RESTORE_FAILED": LockstepError,
    "SUPERVISOR_TIMEOUT": LockstepError,
    "SUPERVISOR_START_FAILED": LockstepError,
    "HELPER_NO_ANSWER": LockstepError,
    "HELPER_FAILED": LockstepError,
    "SANDBOX_INIT_DIED": LockstepError,
    "SANDBOX_ENTER_FAILED": LockstepError,
    "OVERLAY_MOUNT_FAILED": LockstepError,
    "DEV_FOLDER_FAILED": LockstepError,
    "LAYER_STORE_FAILED": LockstepError,
    "LAYER_STORE_MOUNT_FAILED": LockstepError,
    "BTRFS_UNAVAILABLE": LockstepError,
    "DISK_QUOTA_UNAVAILABLE": LockstepError,
    "CGROUP_UNAVAILABLE": LockstepError,
    "CGROUP_CONTROLLERS": LockstepError,
    "DOCKER_IMPORT_FAILED": LockstepError,
    "IMAGE_BUILD_FAILED": LockstepError,
    "FILE_ACCESS_FAILED": LockstepError,
    "CHECKPOINT_CORRUPT": InvalidStateError,
    "STORE_UNAVAILABLE": LockstepError,
    "TRANSFER_ABORTED": LockstepError,
    "SUPERVISOR_UNREACHABLE": LockstepError,
    "HOME_NOT_SEARCHABLE": LockstepError,
    "ID_RANGES_EXHAUSTED": LockstepError,
    "NETWORK_ADDRESSES_EXHAUSTED": LockstepError,
    "NETWORK_SETUP_FAILED": LockstepError,
    "MCP_SESSION_NOT_FOUND": NotFoundError,
    "CONNECTION_FAILED": LockstepConnectionError,
    "REQUEST_ABORTED": LockstepError,
    "PORT_UNREACHABLE": LockstepError,
    "INTERNAL": LockstepError,
}


def error_from_wire(status: int, body: dict) -> LockstepError:
    """The SDK exception for an error body the server sent."""
    code = str(body.get("code", "INTERNAL"))
    message = str(body.get("message", ""))
    field = body.get("field")
    cls = CLASS_FOR_CODE.get(code, LockstepError)
    if cls is LockstepConnectionError:
        return LockstepConnectionError(message)
    return cls(code, message, field=field if isinstance(field, str) else None, status=status)


def fork_results(answer: dict) -> List[Union[str, LockstepError]]:
    """A fork's or start's ``results``, in order: each started sandbox's id, or the
    exception for the one that failed (with the status the server gave its code)."""
    return [r["id"] if "id" in r else error_from_wire(int(r["error"]["status"]), r["error"]) for r in answer["results"]]
