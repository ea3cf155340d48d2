"""Typed errors: the server's ``{"error": {"code", "message", "field"}}`` bodies
as exceptions. Callers branch on ``code`` (stable), never on the message."""

from __future__ import annotations

from typing import List, Optional, Union


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


def error_from_wire(status: int, body: dict) -> LockstepError:
    """The SDK exception for an error body the server sent."""
    code = str(body.get("code", "INTERNAL"))
    message = str(body.get("message", ""))
    field = body.get("field")
    if code == "INVALID_ARGUMENT":
        cls = InvalidArgumentError
    elif code.endswith("_NOT_FOUND") and code != "ROUTE_NOT_FOUND":
        cls = NotFoundError
    elif code in ("COMMAND_TIMEOUT", "COMMAND_ABORTED"):
        cls = CommandAbortedError
    elif code == "QUOTA_EXCEEDED":
        cls = QuotaExceededError
    elif status == 409:
        cls = InvalidStateError
    else:
        cls = LockstepError
    return cls(code, message, field=field if isinstance(field, str) else None, status=status)


def fork_results(answer: dict) -> List[Union[str, LockstepError]]:
    """A fork's or start's ``results``, in order: each started sandbox's id, or the
    exception for the one that failed (with the status the server gave its code)."""
    return [r["id"] if "id" in r else error_from_wire(int(r["error"]["status"]), r["error"]) for r in answer["results"]]
