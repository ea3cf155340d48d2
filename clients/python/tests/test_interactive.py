"""Stdin of background commands and PTYs through the sync and async SDK, against a real server."""

import asyncio
import hashlib
import os
import re

import pytest

from lockstep import AsyncSandbox, InvalidArgumentError, InvalidStateError, PtyExit, Sandbox

from conftest import eventually


def test_send_stdin_bytes_exact_and_close(conn):
    with Sandbox.create(memory_mb=64, **conn) as sbx:
        h = sbx.commands.run("sha256sum", background=True, stdin=True)
        data = bytes(range(256)) + os.urandom(150 * 1024)
        h.send_stdin(data[:1000])
        h.send_stdin(data[1000:])
        h.close_stdin()
        assert h.wait(timeout_ms=60_000) == 0
        assert h.output().stdout == hashlib.sha256(data).hexdigest() + "  -\n"
        with pytest.raises(InvalidStateError) as e:
            h.send_stdin("late")
        assert e.value.code == "STDIN_CLOSED"
        plain = sbx.commands.run("sleep 600", background=True)
        with pytest.raises(InvalidStateError) as e:
            plain.send_stdin("x")
        assert e.value.code == "STDIN_CLOSED"
        assert plain.kill()


def test_pty_python_repl(conn):
    with Sandbox.create(image="dev", memory_mb=256, **conn) as sbx:
        pty = sbx.pty.create(80, 24, cmd=["python3", "-q"])
        seen = []
        at = [0]

        def read_until(pattern):
            def step():
                r = pty.output(at[0])
                seen.append(r.data)
                at[0] = r.offset
                return re.search(pattern, b"".join(seen).decode("utf-8", "replace"))

            return eventually(step, timeout=30)

        read_until(r">>> ")
        pty.write("print(6*7)\n")
        read_until(r"\r\n42\r\n")
        pty.resize(90, 30)
        pty.write('import os; os.system("stty size")\n')
        read_until(r"\r\n30 90\r\n")
        assert [p["pid"] for p in sbx.pty.list()] == [pty.pid]
        # The stream from offset 0 replays the transcript, then follows.
        again = sbx.pty.connect(pty.pid)
        stream = again.iter_output(0)
        first = next(stream)
        assert b">>> " in first
        assert pty.kill()
        tail = [item for item in stream]
        assert isinstance(tail[-1], PtyExit) and tail[-1].reason == "killed"
        assert pty.wait(timeout_ms=30_000) == PtyExit(None, "killed")
        with pytest.raises(InvalidArgumentError):
            sbx.pty.connect(pty.pid + 1000)


def test_async_pty_and_stdin(conn):
    async def scenario():
        async with await AsyncSandbox.create(memory_mb=64, **conn) as sbx:
            h = await sbx.commands.run("cat", background=True, stdin=True)
            await h.send_stdin(b"async bytes\x00\xff")
            await h.close_stdin()
            assert await h.wait(timeout_ms=60_000) == 0
            pty = await sbx.pty.create(40, 10, cmd="read x; echo got $x; exit 4")
            await pty.write("it\n")
            chunks = []
            ended = await pty.follow(chunks.append)
            assert ended == PtyExit(4, "exited")
            assert b"got it" in b"".join(chunks)
            return (await h.output()).stdout

    # cat's output is read back as text: the bytes that are not UTF-8 come back replaced.
    assert asyncio.run(scenario()).startswith("async bytes\x00")
