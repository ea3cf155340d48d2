"""The shared scenario through the sync Python SDK, against a real server."""

import hashlib
import os
import uuid

import pytest

from lockstep import (
    Snapshots,
    CommandHandle,
    InvalidArgumentError,
    LockstepConnectionError,
    LockstepError,
    NotFoundError,
    QuotaExceededError,
    Sandbox,
    list_images,
)

from conftest import eventually


def test_create_list_connect_commands_and_background(conn):
    tag = uuid.uuid4().hex[:8]
    with Sandbox.create(memory_mb=64, metadata={"suite": "python", "tag": tag}, **conn) as sbx:
        assert sbx.sandbox_id.startswith("sbx_")
        assert [s.sandbox_id for s in Sandbox.list(metadata={"tag": tag}, **conn)] == [sbx.sandbox_id]
        assert Sandbox.list(metadata={"tag": "no-such-tag"}, **conn) == []
        again = Sandbox.connect(sbx.sandbox_id, **conn)
        assert again.get_info().metadata == {"suite": "python", "tag": tag}

        out, err = [], []
        r = again.commands.run("for i in 1 2 3; do echo line $i; done; echo warn >&2; exit 4", on_stdout=out.append, on_stderr=err.append)
        assert r.exit_code == 4
        assert r.stdout == "line 1\nline 2\nline 3\n"
        assert "".join(out) == r.stdout
        assert "".join(err) == r.stderr == "warn\n"
        assert sbx.commands.run(["sh", "-c", 'pwd; echo "$X"'], cwd="/tmp", envs={"X": "from envs"}).stdout == "/tmp\nfrom envs\n"

        bg = sbx.commands.run("sleep 0.2; exit 7", background=True)
        assert isinstance(bg, CommandHandle) and bg.pid > 1
        assert bg.wait() == 7
        forever = sbx.commands.run("sleep 600", background=True)
        assert forever.kill() is True
        assert forever.wait() is None

        # A background command's output, by offsets, and after reattaching by pid.
        talker = sbx.commands.run("echo out 1; echo err 1 >&2; sleep 0.3; echo out 2; exit 5", background=True)
        first = eventually(lambda: (lambda o: o if "out 1" in o.stdout and "err 1" in o.stderr else None)(talker.output()))
        assert talker.wait() == 5
        rest = talker.output(first.stdout_offset, first.stderr_offset)
        assert first.stdout + rest.stdout == "out 1\nout 2\n"
        assert not rest.rewound and not rest.running
        reattached = Sandbox.connect(sbx.sandbox_id, **conn).commands.connect(talker.pid)
        assert reattached.output().stdout == "out 1\nout 2\n"
        assert {"pid": talker.pid, "running": False, "exitCode": 5} in sbx.commands.list()
        with pytest.raises(InvalidArgumentError) as e:
            sbx.commands.connect(999999)
        assert e.value.field == "pid"
    # The with block killed it.
    assert Sandbox.kill(sbx.sandbox_id, **conn) is False
    with pytest.raises(NotFoundError) as e:
        Sandbox.connect(sbx.sandbox_id, **conn)
    assert e.value.code == "SANDBOX_NOT_FOUND"


def test_files_checkpoint_effect_rollback_replay_fork(conn):
    with Sandbox.create(memory_mb=128, **conn) as sbx:
        # A process that lives across the checkpoint and the rollback.
        sbx.commands.run("n=0; while true; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.05; done", background=True)
        eventually(lambda: int(sbx.files.read_text("/tmp/counter")) > 2)

        blob = bytes([0, 1, 2, 200, 255, 10])
        assert sbx.files.write("/workspace/data/blob.bin", blob)["bytes"] == len(blob)
        sbx.files.write("notes.txt", "version 1\n")
        assert sbx.files.read("/workspace/data/blob.bin") == blob
        assert sorted(e.name for e in sbx.files.list("/workspace")) == ["data", "notes.txt"]
        # A page at a time, sorted by name: the cursor is the last name of the page.
        first = sbx.files.list_page("/workspace", limit=1)
        assert [e.name for e in first.entries] == ["data"] and first.next_cursor == "data"
        rest = sbx.files.list_page("/workspace", limit=1, cursor=first.next_cursor)
        assert [e.name for e in rest.entries] == ["notes.txt"] and rest.next_cursor is None

        # Streams both ways (3 MiB: past the 1 MiB the server buffers).
        chunk = os.urandom(1 << 20)
        up = sbx.files.write_stream("big.bin", (chunk for _ in range(3)))
        want = hashlib.sha256(chunk * 3).hexdigest()
        assert up["sha256"] == want and up["bytes"] == 3 << 20
        h = hashlib.sha256()
        for c in sbx.files.read_stream("big.bin"):
            h.update(c)
        assert h.hexdigest() == want

        context = {"format": "openai-chat", "messages": [{"role": "user", "content": "Fix the notes."}]}
        ck = sbx.checkpoint(label="before edit", context=context)
        assert ck["id"].startswith("ckpt_") and ck["contextId"]

        sbx.files.write("notes.txt", "version 2 (broken)\n")
        sent = []
        with sbx.effects.effect("email.send", {"to": "ops@example.com"}, key="mail-1") as e:
            assert not e.replayed
            sent.append("m-1")
            e.output = {"messageId": "m-1"}

        report = sbx.rollback(ck["id"], failure="The edit broke the notes")
        assert report["checkpointId"] == ck["id"]
        assert report["context"] == context
        assert [x["id"] for x in report["effectsAfter"]] == [e.effect_id]
        assert any(w["effectId"] == e.effect_id and w["reason"] == "irreversible" for w in report["warnings"])
        assert sbx.files.read_text("notes.txt") == "version 1\n"

        # The retry after the rollback is a replay: the body must not send again.
        with sbx.effects.effect("email.send", {"to": "ops@example.com"}, key="mail-1") as again:
            if not again.replayed:
                sent.append("m-2")
        assert again.replayed and again.output == {"messageId": "m-1"}
        assert sent == ["m-1"]

        after = int(sbx.files.read_text("/tmp/counter"))
        eventually(lambda: int(sbx.files.read_text("/tmp/counter")) > after)

        (child,) = sbx.fork(ck["id"])
        try:
            assert child.files.read_text("notes.txt") == "version 1\n"

            @child.effects.effect("email.send", {"to": "ops@example.com"}, key="mail-1")
            def send():
                sent.append("from fork")
                return {"messageId": "m-3"}

            assert send() == {"messageId": "m-1"}
            assert sent == ["m-1"]
        finally:
            assert child.kill() is True


def test_effect_decorator_records_arguments_and_failures(conn):
    with Sandbox.create(memory_mb=64, **conn) as sbx:
        calls = []

        @sbx.effects.effect("payment.charge")
        def charge(amount, currency="EUR"):
            calls.append(amount)
            return {"charged": amount, "currency": currency}

        assert charge(5, currency="USD") == {"charged": 5, "currency": "USD"}
        assert charge(5, currency="USD") == {"charged": 5, "currency": "USD"}  # same input: the ledger's key
        assert calls == [5]

        class Declined(Exception):
            definite = True

        @sbx.effects.effect("payment.charge", key="declined")
        def declined():
            raise Declined("card declined")

        with pytest.raises(Declined):
            declined()
        rows = {r["idempotencyKey"]: r for r in sbx.effects.list()}
        failed = [r for r in rows.values() if r["status"] == "failed"]
        assert len(failed) == 1 and failed[0]["definite"] is True and failed[0]["error"]["message"] == "card declined"


def test_typed_errors(conn):
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.connect("not-an-id", **conn)
    assert e.value.field == "sandbox_id"
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.list(api_url=conn["api_url"], api_key="")
    assert e.value.field == "api_key"
    with pytest.raises(LockstepError) as e:
        Sandbox.list(api_url=conn["api_url"], api_key="lst_wrong")
    assert e.value.code == "UNAUTHENTICATED" and e.value.status == 401
    with pytest.raises(LockstepConnectionError):
        Sandbox.list(api_url="http://127.0.0.1:9", api_key="k", max_attempts=2, retry_delay=0.01)

    with Sandbox.create(memory_mb=64, **conn) as sbx:
        with pytest.raises(NotFoundError) as e:
            sbx.files.read("/workspace/none.txt")
        assert e.value.code == "FILE_NOT_FOUND"
        with pytest.raises(LockstepError) as e:
            sbx.files.read("../../etc/shadow")
        assert e.value.code == "PATH_ESCAPES_SANDBOX"
        with pytest.raises(InvalidArgumentError) as e:
            sbx.commands.run("true", cwd="/no/such/dir")
        assert e.value.field == "cwd"

    with pytest.raises(NotFoundError) as e:
        Sandbox.create("nosuch", **conn)
    assert e.value.code == "IMAGE_NOT_FOUND" and e.value.field == "image"
    assert "lockstep image" in e.value.message
    assert any(i["name"] == "base" and i["ready"] for i in list_images(**conn))


def test_snapshot_outlives_its_sandbox_and_its_bundle_round_trips(conn, tmp_path):
    tag = uuid.uuid4().hex[:8]
    snaps = Snapshots(**conn)
    with Sandbox.create(memory_mb=64, **conn) as sbx:
        sbx.files.write("/workspace/kept.txt", "kept\n")
        ck = sbx.checkpoint(context={"format": "openai-chat", "messages": [{"role": "user", "content": "py"}]})
        snap = snaps.create(ck["id"], name=f"py-{tag}", metadata={"lang": "python"})
    # The sandbox is gone; the snapshot is not.
    assert snaps.get(f"py-{tag}")["id"] == snap["id"]
    assert snap["metadata"] == {"lang": "python"}
    assert snaps.context(snap["id"]) == {"format": "openai-chat", "messages": [{"role": "user", "content": "py"}]}
    bundle = tmp_path / "snap.bundle"
    with open(bundle, "wb") as f:
        for chunk in snaps.export(snap["id"]):
            f.write(chunk)
    with open(bundle, "rb") as f:
        copy = snaps.import_(f, name=f"py-{tag}-copy")
    assert copy["lineageId"] == snap["lineageId"]
    with Sandbox.create(from_snapshot=copy["id"], **conn) as again:
        assert again.files.read_text("/workspace/kept.txt") == "kept\n"
    # Through the server's snapshot store: pushed, listed, pushed again (nothing sent), pulled back, removed.
    pushed = snaps.push(snap["id"], key=f"py-{tag}")
    assert pushed["key"] == f"py-{tag}" and pushed["uploadedChunks"] >= 1
    assert [b["digest"] for b in snaps.list_stored() if b["name"] == f"py-{tag}"] == [pushed["digest"]]
    assert snaps.push(snap["id"], key=f"py-{tag}")["uploadedChunks"] == 0
    stored = snaps.pull_stored(f"py-{tag}", name=f"py-{tag}-stored")
    assert stored["snapshot"]["lineageId"] == snap["lineageId"]
    with Sandbox.create(from_snapshot=stored["snapshot"]["id"], **conn) as from_store:
        assert from_store.files.read_text("/workspace/kept.txt") == "kept\n"
    snaps.delete(stored["snapshot"]["id"])
    snaps.delete_stored(f"py-{tag}")
    with pytest.raises(NotFoundError) as e:
        snaps.pull_stored(f"py-{tag}")
    assert e.value.code == "BUNDLE_NOT_FOUND"
    [started] = snaps.start(snap["id"])
    Sandbox.connect(started, **conn).kill()
    with pytest.raises(NotFoundError) as e:
        snaps.get("snap_nothere")
    assert e.value.code == "SNAPSHOT_NOT_FOUND"
    snaps.delete(copy["id"])
    snaps.delete(snap["id"])
    assert all(s["id"] not in (snap["id"], copy["id"]) for s in snaps.list())


def test_ports_expose_reach_list_close(conn):
    import urllib.error
    import urllib.request

    with Sandbox.create(memory_mb=64, **conn) as sbx:
        sbx.files.write("/workspace/www/index.html", "served to python\n")
        sbx.commands.run("httpd -f -p 127.0.0.1:8080 -h /workspace/www", background=True)
        with pytest.raises(LockstepError) as e:
            sbx.ports.expose(8081)
        assert e.value.code == "PORT_NOT_LISTENING"
        exposed = eventually(lambda: _try_expose(sbx, 8080))
        assert exposed["url"].endswith(exposed["path"])
        req = urllib.request.Request(exposed["url"], headers={"X-Lockstep-Token": exposed["token"]})
        with urllib.request.urlopen(req) as res:
            assert res.read() == b"served to python\n"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(exposed["url"])
        assert denied.value.code == 401
        assert [(p["id"], p["port"]) for p in sbx.ports.list()] == [(exposed["id"], 8080)]
        assert "token" not in sbx.ports.list()[0]
        assert sbx.ports.close(8080) is True
        assert sbx.ports.close(8080) is False


def _try_expose(sbx, port):
    try:
        return sbx.ports.expose(port)
    except LockstepError:
        return None


def test_fork_answers_each_result_in_order_with_the_failure_as_its_error(disk_quota_conn):
    with Sandbox.create(memory_mb=64, **disk_quota_conn) as sbx:
        ck = sbx.checkpoint(label="before forks")
        results = sbx.fork(ck["id"], count=3)
        try:
            assert len(results) == 3
            assert all(isinstance(r, Sandbox) for r in results[:2])
            assert isinstance(results[2], QuotaExceededError)
            assert results[2].code == "QUOTA_EXCEEDED" and results[2].status == 429
            assert "at most 7000" in results[2].message
            assert sorted(s.sandbox_id for s in Sandbox.list(**disk_quota_conn)) == sorted(
                [sbx.sandbox_id] + [r.sandbox_id for r in results[:2]]
            )
        finally:
            for r in results:
                if isinstance(r, Sandbox):
                    r.kill()


def test_list_sends_the_metadata_filter_to_the_server(conn):
    tag = uuid.uuid4().hex[:8]
    with Sandbox.create(memory_mb=64, metadata={"tag": tag, "side": "a"}, **conn) as a, Sandbox.create(
        memory_mb=64, metadata={"tag": tag, "side": "b"}, **conn
    ) as b:
        assert [s.sandbox_id for s in Sandbox.list(metadata={"tag": tag}, **conn)] == [a.sandbox_id, b.sandbox_id]
        assert [s.sandbox_id for s in Sandbox.list(metadata={"tag": tag, "side": "b"}, **conn)] == [b.sandbox_id]
        # The server checks the filter: a label value past 1024 characters is its INVALID_ARGUMENT.
        with pytest.raises(InvalidArgumentError) as e:
            Sandbox.list(metadata={"tag": "x" * 1025}, **conn)
        assert e.value.field == "metadata.tag"
