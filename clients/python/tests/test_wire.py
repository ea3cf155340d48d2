"""The generated functions of lockstep._wire (npm run client:python), called
directly: sync and asyncio twins against the server, answers that are streams
as unread responses, route() for the variants the document does not describe."""

import asyncio
import hashlib
import json

import pytest

from lockstep import InvalidArgumentError, NotFoundError, Sandbox, _wire
from lockstep._transport import Response, Transport


def test_route_fills_and_encodes_path_parameters():
    assert _wire.route("createSandbox") == ("POST", "/sandboxes")
    assert _wire.route("getEffect", id="sbx_1", effectId="a/b c") == ("GET", "/sandboxes/sbx_1/effects/a%2Fb%20c")
    with pytest.raises(ValueError, match="No operation 'nope'"):
        _wire.route("nope")
    with pytest.raises(ValueError, match="needs the path parameter id"):
        _wire.route("getSandbox")


def test_sync_and_async_functions_against_the_server(conn):
    t = Transport(conn["api_url"], conn["api_key"])
    info = _wire.create_sandbox(t, memory_mb=64, metadata={"suite": "python-wire"})
    sid = info["id"]
    try:
        assert info["state"] == "running" and info["metadata"] == {"suite": "python-wire"}
        assert _wire.get_sandbox(t, id=sid)["id"] == sid

        # A raw body (data) and the JSON form of a read, which the handles do not use.
        written = _wire.write_file(t, id=sid, path="w.txt", data=b"wire\n", tool_call_id="call-wire")
        assert written["sha256"] == hashlib.sha256(b"wire\n").hexdigest()
        read = _wire.read_file(t, id=sid, path="w.txt", encoding="base64")
        assert (read["content"], read["encoding"]) == ("d2lyZQo=", "base64")
        assert _wire.check_file_exists(t, id=sid, path="w.txt")["exists"] is True
        assert _wire.list_files(t, id=sid, path="/workspace", limit="10")["entries"][0]["name"] == "w.txt"

        ran = _wire.run_command(t, id=sid, cmd=["sh", "-c", "echo $X"], envs={"X": "from wire"})
        assert (ran["exitCode"], ran["stdout"]) == (0, "from wire\n")

        async def twins():
            ck = await _wire.create_checkpoint_async(t, id=sid, label="wire", context={"format": "openai-chat", "messages": [{"role": "user", "content": "wire"}]})
            listed, context = await asyncio.gather(
                _wire.list_checkpoints_async(t, id=sid), _wire.get_checkpoint_context_async(t, id=sid, ckpt=ck["id"])
            )
            await _wire.remove_file_async(t, id=sid, path="w.txt")
            gone = await _wire.check_file_exists_async(t, id=sid, path="w.txt")
            back = await _wire.rollback_sandbox_async(t, id=sid, checkpoint_id=ck["id"], with_recovery_summary=False)
            return ck, listed, context, gone, back

        ck, listed, context, gone, back = asyncio.run(twins())
        assert [c["id"] for c in listed] == [ck["id"]] and ck["label"] == "wire"
        assert context == {"checkpointId": ck["id"], "context": {"format": "openai-chat", "messages": [{"role": "user", "content": "wire"}]}}
        assert gone["exists"] is False
        assert back["checkpointId"] == ck["id"] and "recoverySummary" not in back
        assert _wire.check_file_exists(t, id=sid, path="w.txt")["exists"] is True

        # A PTY's stream: an answer that is no JSON comes back as the unread response.
        pid = _wire.create_pty(t, id=sid, cols=80, rows=24, cmd=["sh", "-c", "printf wire-pty"])["pid"]
        resp = _wire.stream_pty_output(t, id=sid, pid=str(pid))
        assert isinstance(resp, Response)
        events = [json.loads(line) for line in resp.iter_lines() if line.strip()]
        assert events[-1]["type"] == "exit" and events[-1]["exitCode"] == 0
        assert any(e["type"] == "data" for e in events)

        with pytest.raises(NotFoundError) as e:
            _wire.get_checkpoint_context(t, id=sid, ckpt="ckpt_missing0")
        assert e.value.code == "CHECKPOINT_NOT_FOUND"
    finally:
        assert _wire.remove_sandbox(t, id=sid) == {"id": sid, "removed": True}


def test_an_effect_spec_with_a_property_the_operation_does_not_take(conn):
    with Sandbox.create(memory_mb=64, **conn) as sbx:
        with pytest.raises(InvalidArgumentError) as e:
            sbx.effects.begin({"kind": "k", "input": 1, "reversibility": "irreversible", "bogus": True})
        assert e.value.field == "bogus"
        begun = sbx.effects.begin({"kind": "k", "input": 1, "reversibility": "irreversible", "toolCallId": "call-1"})
        assert sbx.effects.get(begun["effectId"])["toolCallId"] == "call-1"
