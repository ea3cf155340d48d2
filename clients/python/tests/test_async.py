"""The scenario through the async SDK."""

import asyncio

from lockstep import AsyncCommandHandle, AsyncSandbox, NotFoundError


def test_async_scenario(conn):
    async def scenario():
        async with await AsyncSandbox.create(memory_mb=64, metadata={"suite": "python-async"}, **conn) as sbx:
            # Two commands at once: the loop is not blocked by either.
            a, b = await asyncio.gather(sbx.commands.run("sleep 0.3; echo a"), sbx.commands.run("echo b"))
            assert (a.stdout, b.stdout) == ("a\n", "b\n")
            bg = await sbx.commands.run("exit 3", background=True)
            assert isinstance(bg, AsyncCommandHandle)
            assert await bg.wait() == 3
            assert (await (await sbx.commands.connect(bg.pid)).output()).running is False
            assert {"pid": bg.pid, "running": False, "exitCode": 3} in await sbx.commands.list()

            await sbx.files.write("notes.txt", "v1\n")
            ck = await sbx.checkpoint(label="v1", context={"format": "anthropic", "messages": [{"role": "user", "content": "hi"}]})
            await sbx.files.write("notes.txt", "v2\n")
            ran = []

            @sbx.effects.effect("ticket.create", {"title": "bug"}, key="t-1")
            async def create_ticket():
                ran.append(1)
                return {"ticket": 42}

            assert await create_ticket() == {"ticket": 42}
            report = await sbx.rollback(ck["id"])
            assert report["context"]["messages"] == [{"role": "user", "content": "hi"}]
            assert await sbx.files.read_text("notes.txt") == "v1\n"
            assert await create_ticket() == {"ticket": 42}
            async with sbx.effects.effect("ticket.create", {"title": "bug"}, key="t-1") as e:
                assert e.replayed
            assert ran == [1]

            (child,) = await sbx.fork(ck["id"])
            assert await child.files.read_text("notes.txt") == "v1\n"
            assert await child.kill() is True
            sid = sbx.sandbox_id
        try:
            await AsyncSandbox.connect(sid, **conn)
            raise AssertionError("the sandbox should be gone")
        except NotFoundError as e:
            assert e.code == "SANDBOX_NOT_FOUND"

    asyncio.run(scenario())
