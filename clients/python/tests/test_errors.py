"""error_from_wire without a server: each code's class from CLASS_FOR_CODE,
the server's code, message, field and status kept, an unknown code a
LockstepError carrying it."""

from lockstep.errors import (
    CLASS_FOR_CODE,
    CommandAbortedError,
    InvalidStateError,
    LockstepConnectionError,
    LockstepError,
    NotFoundError,
    QuotaExceededError,
    error_from_wire,
)


def test_every_code_becomes_its_class_with_the_servers_fields():
    for code, cls in CLASS_FOR_CODE.items():
        e = error_from_wire(418, {"code": code, "message": f"says {code}", "field": "f"})
        assert type(e) is cls, code
        assert e.code == code and e.message == f"says {code}"
        if cls is not LockstepConnectionError:
            assert e.field == "f" and e.status == 418


def test_the_classes_callers_catch():
    assert isinstance(error_from_wire(404, {"code": "SANDBOX_NOT_FOUND", "message": "m"}), NotFoundError)
    assert isinstance(error_from_wire(409, {"code": "SANDBOX_BUSY", "message": "m"}), InvalidStateError)
    assert isinstance(error_from_wire(504, {"code": "COMMAND_TIMEOUT", "message": "m"}), CommandAbortedError)
    assert isinstance(error_from_wire(429, {"code": "QUOTA_EXCEEDED", "message": "m"}), QuotaExceededError)


def test_an_unknown_code_is_a_lockstep_error_carrying_it():
    e = error_from_wire(409, {"code": "FROM_A_NEWER_SERVER", "message": "new"})
    assert type(e) is LockstepError
    assert e.code == "FROM_A_NEWER_SERVER" and e.message == "new" and e.status == 409
