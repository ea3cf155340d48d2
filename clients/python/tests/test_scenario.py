"""Issue 12's one scenario through the Python SDK, with the steps and checks of
test/helpers/scenario.ts (which runs it through the in-process SDK and
lockstep/client): create, a process, files; checkpoint with a context, an
irreversible effect; rollback and its report, the effect retried without a
second run; fork; and an interactive process fed through its stdin."""

import hashlib
import os

from lockstep import Sandbox

from conftest import eventually


def counter(sbx):
    return int(sbx.files.read_text("/tmp/counter"))


def test_scenario_create_process_files_checkpoint_effect_rollback_fork(conn):
    with Sandbox.create(memory_mb=128, **conn) as sbx:
        # A process that lives across the checkpoint: its counter carries on after the rollback.
        sbx.commands.run("n=0; while true; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.05; done", background=True)
        eventually(lambda: counter(sbx) > 2)

        # An interactive process: bytes to its stdin in two writes, EOF, its answer read back.
        data = os.urandom(50_000)
        summer = sbx.commands.run("sha256sum", background=True, stdin=True)
        summer.send_stdin(data[:7])
        summer.send_stdin(data[7:])
        summer.close_stdin()
        assert summer.wait(timeout_ms=30_000) == 0
        out = summer.output()
        assert out.stdout == hashlib.sha256(data).hexdigest() + "  -\n"
        assert not out.running

        blob = bytes([0, 1, 2, 200, 255, 10])
        assert sbx.files.write("/workspace/data/blob.bin", blob)["bytes"] == len(blob)
        sbx.files.write("notes.txt", "version 1\n")
        assert sbx.files.read("/workspace/data/blob.bin") == blob

        context = {
            "format": "openai-chat",
            "messages": [
                {"role": "system", "content": "You fix bugs."},
                {"role": "user", "content": "Fix the notes."},
            ],
        }
        ck = sbx.checkpoint(label="before edit", context=context)
        assert ck["id"].startswith("ckpt_")
        assert ck["contextId"]

        # The abandoned attempt: files change and an e-mail goes out (irreversible).
        sbx.files.write("notes.txt", "version 2 (broken)\n")
        sbx.files.write("new.txt", "new")
        sent = []
        spec = ("email.send", {"to": "ops@example.com"})
        with sbx.effects.effect(*spec, key="mail-1", reversibility="irreversible") as first:
            assert not first.replayed
            sent.append("m-1")
            first.output = {"messageId": "m-1"}

        report = sbx.rollback(ck["id"], failure="The edit broke the notes")
        assert report["checkpointId"] == ck["id"]
        assert report["context"] == context
        assert len(report["effectsAfter"]) == 1
        assert any(w["effectId"] == report["effectsAfter"][0]["id"] and w["reason"] == "irreversible" for w in report["warnings"])
        assert sbx.files.read_text("notes.txt") == "version 1\n"
        assert not sbx.files.exists("new.txt")

        # Retrying the effect after the rollback returns what it returned, without running it.
        with sbx.effects.effect(*spec, key="mail-1", reversibility="irreversible") as retried:
            if not retried.replayed:
                sent.append("m-2")
                retried.output = {"messageId": "m-2"}
        assert retried.output == {"messageId": "m-1"}
        assert sent == ["m-1"]
        assert sbx.effects.begin({"kind": spec[0], "input": spec[1], "key": "mail-1", "reversibility": "irreversible"})["replayed"] is True

        # The restored process runs on.
        after = counter(sbx)
        eventually(lambda: counter(sbx) > after)

        # A fork starts from the checkpoint's files, and knows the effect too.
        forks = sbx.fork(ck["id"], count=1)
        assert len(forks) == 1
        (child,) = forks
        try:
            assert child.files.read_text("notes.txt") == "version 1\n"
            assert child.files.read("/workspace/data/blob.bin") == blob
            with child.effects.effect(*spec, key="mail-1", reversibility="irreversible") as in_fork:
                if not in_fork.replayed:
                    sent.append("m-3")
                    in_fork.output = {"messageId": "m-3"}
            assert in_fork.output == {"messageId": "m-1"}
            assert sent == ["m-1"]
        finally:
            assert child.kill() is True


def test_scenario_egress_sandbox_with_an_allow_list(conn):
    # python-sdk.test.ts gives the server a network range of its own (LOCKSTEP_NETWORK_RANGE).
    allow = ["203.0.113.7:443", "example.test"]
    with Sandbox.create(memory_mb=64, network="egress", allow_out=allow, bandwidth_mbit=10, **conn) as sbx:
        net = sbx.get_info().raw["network"]
        assert net["mode"] == "egress"
        # The server shows each entry in its canonical form (an address as a /32).
        assert net["allowOut"] == ["203.0.113.7/32:443", "example.test"]
        assert net["bandwidthMbit"] == 10
        assert net["address"] and net["gateway"]
        # The sandbox holds its routed address besides loopback.
        assert net["address"] in sbx.commands.run("cat /proc/net/fib_trie").stdout
