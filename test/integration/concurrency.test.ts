/**
 * Nothing lost under load (issue 9): 16 sandboxes at once, across two
 * tenants, half driven through the SDK and half through the HTTP API (plain,
 * NDJSON and SSE), each writing, checkpointing, running commands, rolling
 * back through the warm standby and through a CRIU restore, forking and
 * removing. Every command's output and every file read is compared byte for
 * byte with what the step wrote (content unique to the sandbox and the step).
 * Afterwards: no 5xx, and nothing left on the host or in the catalog.
 */
import fs from 'node:fs';
import test from 'ava';
import type { Lockstep } from '../../src/index.js';
import { integration, openTestLockstep, eventually, sleep } from '../helpers/harness.js';
import { ApiClient, ndjson, sse, startServer, tenantId, tenantToken } from '../fixtures/http-client.js';
import { cgroupChildren, listDir, mountPointsUnder } from '../fixtures/host-state.js';

const SANDBOXES = 16;
/** Echo runs per sandbox between the other steps: where lost output showed (3-19% on main before the fix). */
const ECHOES = 8;

interface RunOut {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** The verbs a platform drives, through one channel. */
interface Driver {
  readonly channel: string;
  create(): Promise<string>;
  write(id: string, path: string, content: string): Promise<void>;
  read(id: string, path: string): Promise<string | null>;
  run(id: string, cmd: string, step: number): Promise<RunOut>;
  checkpoint(id: string, label: string, context: unknown): Promise<string>;
  rollback(id: string, checkpointId: string): Promise<{ path: string; context: unknown }>;
  fork(id: string, checkpointId: string): Promise<string>;
  remove(id: string): Promise<void>;
}

function sdkDriver(ls: Lockstep, tenant: string): Driver {
  return {
    channel: `sdk/${tenant}`,
    async create() {
      return (await ls.create({ memoryMb: 64, tenant })).id;
    },
    async write(id, path, content) {
      await ls.get(id, tenant).files.write(path, content);
    },
    async read(id, path) {
      const f = ls.get(id, tenant).files;
      return (await f.exists(path)) ? (await f.read(path)).content.toString('utf8') : null;
    },
    async run(id, cmd) {
      const { exitCode, stdout, stderr } = await ls.get(id, tenant).commands.run(cmd);
      return { exitCode, stdout, stderr };
    },
    async checkpoint(id, label, context) {
      return (await ls.get(id, tenant).checkpoint({ label, context: context as never })).id;
    },
    async rollback(id, checkpointId) {
      const r = await ls.get(id, tenant).rollback(checkpointId);
      return { path: r.path, context: r.context };
    },
    async fork(id, checkpointId) {
      const [r] = await ls.get(id, tenant).fork(checkpointId);
      if (!r?.ok) throw new Error(`fork failed: ${JSON.stringify(r)}`);
      return r.id;
    },
    async remove(id) {
      await ls.remove(id, tenant);
    },
  };
}

/** Every HTTP status seen, to check that none was a 5xx. */
const statuses: { status: number; what: string }[] = [];

function httpDriver(api: ApiClient, tenant: string): Driver {
  const expect = <T>(r: { status: number; text: string; body: T }, want: number, what: string): T => {
    statuses.push({ status: r.status, what });
    if (r.status !== want) throw new Error(`${what}: HTTP ${r.status} ${r.text.slice(0, 500)}`);
    return r.body;
  };
  return {
    channel: `http/${tenant}`,
    async create() {
      return expect(await api.post('/v1/sandboxes', { memoryMb: 64 }), 201, 'create').id;
    },
    async write(id, path, content) {
      expect(await api.put(`/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`, { content }), 200, 'write');
    },
    async read(id, path) {
      const r = await api.get(`/v1/sandboxes/${id}/files?path=${encodeURIComponent(path)}`);
      if (r.status === 404) {
        statuses.push({ status: r.status, what: 'read' });
        return null;
      }
      const body = expect(r, 200, 'read');
      return body.encoding === 'base64' ? Buffer.from(body.content, 'base64').toString('utf8') : body.content;
    },
    // Plain JSON, NDJSON and SSE in turn: the streamed forms are reassembled from their chunks.
    async run(id, cmd, step) {
      const mode = step % 3;
      if (mode === 0) {
        const { exitCode, stdout, stderr } = expect(
          await api.post(`/v1/sandboxes/${id}/commands`, { cmd }),
          200,
          'run',
        );
        return { exitCode, stdout, stderr };
      }
      const accept = mode === 1 ? 'application/x-ndjson' : 'text/event-stream';
      const r = await api.post(`/v1/sandboxes/${id}/commands`, { cmd }, { headers: { accept } });
      expect({ ...r, body: null }, 200, `run (${accept})`);
      const events =
        mode === 1 ? ndjson(r.text).map(({ type, ...data }) => ({ event: type as string, data })) : sse(r.text);
      const out: RunOut = { exitCode: -1, stdout: '', stderr: '' };
      for (const e of events) {
        if (e.event === 'stdout') out.stdout += e.data.data;
        else if (e.event === 'stderr') out.stderr += e.data.data;
        else if (e.event === 'result') out.exitCode = e.data.exitCode;
        else throw new Error(`run (${accept}): unexpected event ${JSON.stringify(e)}`);
      }
      if (events.at(-1)?.event !== 'result') throw new Error(`run (${accept}): the stream did not end with its result`);
      return out;
    },
    async checkpoint(id, label, context) {
      return expect(await api.post(`/v1/sandboxes/${id}/checkpoints`, { label, context }), 201, 'checkpoint').id;
    },
    async rollback(id, checkpointId) {
      const r = expect(await api.post(`/v1/sandboxes/${id}/rollback`, { checkpointId }), 200, 'rollback');
      return { path: r.path, context: r.context };
    },
    async fork(id, checkpointId) {
      const r = expect(await api.post(`/v1/sandboxes/${id}/fork`, { checkpointId }), 200, 'fork');
      if (r.ids.length !== 1) throw new Error(`fork: ${JSON.stringify(r)}`);
      return r.ids[0];
    },
    async remove(id) {
      expect(await api.del(`/v1/sandboxes/${id}`), 200, 'remove');
    },
  };
}

/** Text unique to a sandbox and a step, long enough to span several pipe reads. */
function payload(tag: string, step: string, lines = 200): string {
  let s = '';
  for (let i = 0; i < lines; i++) s += `${tag} ${step} line ${i} ${'x'.repeat(i % 37)}\n`;
  return s;
}

const chatContext = (tag: string, step: string) => ({
  format: 'openai-chat',
  messages: [
    { role: 'system', content: `You are agent ${tag}.` },
    { role: 'user', content: `Step ${step} of ${tag}.` },
  ],
});

/** Host processes whose cgroup or command line names one of the ids. */
function hostProcessesNaming(ids: string[]): string[] {
  const found: string[] = [];
  for (const pid of fs.readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    let text = '';
    try {
      text = fs.readFileSync(`/proc/${pid}/cgroup`, 'utf8') + fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    } catch {
      continue; // gone meanwhile
    }
    const id = ids.find((i) => text.includes(i));
    if (id) found.push(`${pid}:${id}`);
  }
  return found;
}

function snapshotCounts(ls: Lockstep): { snapshots: number; items: number } {
  const db = ls.engine.catalog.db;
  const n = (sql: string) => (db.prepare(sql).get() as { n: number }).n;
  return {
    snapshots: n('SELECT count(*) AS n FROM agent_context_snapshots'),
    items: n('SELECT count(*) AS n FROM agent_context_items'),
  };
}

/** Everything of a state directory that must be back to where it was once every sandbox is removed. */
function leftovers(ls: Lockstep) {
  const p = ls.engine.paths;
  return {
    mounts: mountPointsUnder(ls.home),
    cgroups: cgroupChildren(ls),
    uppers: listDir(p.uppers),
    layers: listDir(p.layers),
    processImages: listDir(p.processImages),
    runFolders: listDir(p.sandboxesRun),
    sandboxRows: ls.engine.catalog.allSandboxes().map((r) => r.id),
    checkpointRows: ls.engine.catalog.allCheckpoints().map((r) => r.id),
    operations: ls.engine.catalog.operations().map((o) => o.id),
    contexts: snapshotCounts(ls),
  };
}

integration(test, () => {
  test.serial(
    'a background process holding the pipes does not hold the call; what it wrote before the exit comes back; streamed UTF-8 is intact',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { client } = await startServer(t, ls);
      const api = client.as(tenantToken(ls, 'alpha'));
      const sb = await ls.create({ memoryMb: 64, tenant: tenantId(ls, 'alpha') });

      // The call returns while `sleep` still holds the pipes (it would hang until the test's timeout otherwise).
      const held = await sb.commands.run('sleep 1000 & echo early; echo on-stderr >&2');
      t.like(held, { exitCode: 0, stdout: 'early\n', stderr: 'on-stderr\n' });
      // Written by the background process before the command exited (the flag orders it): part of the result.
      const bg = await sb.commands.run(
        '(echo from-background; touch /tmp/flag; exec sleep 1000) & while [ ! -e /tmp/flag ]; do sleep 0.01; done; echo done',
      );
      t.like(bg, { exitCode: 0, stdout: 'from-background\ndone\n', stderr: '' });

      // 80 000 bytes of two-byte characters: pipe reads split some of them; the
      // streamed chunks must still join to the same text.
      const wide = 'é'.repeat(40_000);
      const cmd = "yes é | head -n 40000 | tr -d '\\n'";
      let streamed = '';
      const viaSdk = await sb.commands.run(cmd, { onStdout: (c) => (streamed += c) });
      t.is(viaSdk.stdout, wide);
      t.is(streamed, wide);
      const nd = await api.post(
        `/v1/sandboxes/${sb.id}/commands`,
        { cmd },
        { headers: { accept: 'application/x-ndjson' } },
      );
      const events = ndjson(nd.text);
      t.is(
        events
          .filter((e) => e.type === 'stdout')
          .map((e) => e.data)
          .join(''),
        wide,
      );
      t.like(events.at(-1), { type: 'result', exitCode: 0 });
    },
  );

  test.serial(
    '16 sandboxes at once, two tenants, SDK and HTTP: every byte of every output and file read is exact, nothing is left behind',
    async (t) => {
      t.timeout(15 * 60_000);
      const ls = await openTestLockstep(t);
      const { app, client } = await startServer(t, ls);
      const tenants = ['alpha', 'beta'];
      const apis = new Map(tenants.map((name) => [name, client.as(tenantToken(ls, name))]));

      // Warm up once (CRIU service, supervisor, images, HTTP), so that the
      // baseline holds what a manager keeps open anyway.
      const warm = httpDriver(apis.get('alpha')!, 'alpha');
      const wid = await warm.create();
      const wck = await warm.checkpoint(wid, 'warm', chatContext('warm', '0'));
      await warm.rollback(wid, wck);
      await warm.remove(wid);
      await ls.engine.drainLocks();
      // Idle keep-alive connections would count as fds; close them, and give
      // the client the moment it needs to see that before its next request.
      app.server.closeAllConnections();
      await sleep(500);
      const fdCount = () => fs.readdirSync('/proc/self/fd').length;
      // What the descriptors are, for the message when the count is off.
      const fdTargets = () =>
        fs.readdirSync('/proc/self/fd').map((fd) => {
          try {
            return fs.readlinkSync(`/proc/self/fd/${fd}`);
          } catch {
            return '?';
          }
        });
      const before = { fds: fdCount(), ...leftovers(ls) };

      const drivers: Driver[] = Array.from({ length: SANDBOXES }, (_, i) => {
        const tenant = tenants[(i >> 1) % 2]!;
        return i % 2 === 0 ? sdkDriver(ls, tenant) : httpDriver(apis.get(tenant)!, tenant);
      });
      const ids: string[] = [];
      const mismatches: string[] = [];
      let runs = 0;
      const paths: string[] = [];

      async function scenario(d: Driver, i: number): Promise<void> {
        const tag = `sb${i}-${Math.random().toString(36).slice(2, 8)}`;
        let step = 0;
        const same = (what: string, got: unknown, want: unknown) => {
          if (JSON.stringify(got) !== JSON.stringify(want))
            mismatches.push(
              `${d.channel} ${tag} ${what}: got ${JSON.stringify(got)?.slice(0, 200)}, want ${JSON.stringify(want)?.slice(0, 200)}`,
            );
        };
        const run = async (what: string, cmd: string, want: RunOut) => {
          runs++;
          same(what, await d.run(id, cmd, step++), want);
        };
        const echoes = async (phase: string) => {
          for (let k = 0; k < ECHOES; k++)
            await run(`echo ${phase}.${k}`, `echo ${tag}-${phase}-${k}`, {
              exitCode: 0,
              stdout: `${tag}-${phase}-${k}\n`,
              stderr: '',
            });
        };

        const id = await d.create();
        ids.push(id);
        const a1 = payload(tag, 'a1');
        await d.write(id, '/workspace/a.txt', a1);
        same('read a1', await d.read(id, '/workspace/a.txt'), a1);
        await run('cat a1', `cat /workspace/a.txt; echo ${tag}-err >&2; exit 7`, {
          exitCode: 7,
          stdout: a1,
          stderr: `${tag}-err\n`,
        });
        await echoes('p1');
        const c1 = await d.checkpoint(id, `${tag}-c1`, chatContext(tag, 'c1'));

        const a2 = payload(tag, 'a2', 300);
        const b2 = payload(tag, 'b2', 50);
        await d.write(id, '/workspace/a.txt', a2);
        await d.write(id, '/workspace/b.txt', b2);
        await run('cat a2 b2', 'cat /workspace/a.txt /workspace/b.txt', { exitCode: 0, stdout: a2 + b2, stderr: '' });
        const c2 = await d.checkpoint(id, `${tag}-c2`, chatContext(tag, 'c2'));

        const c3 = payload(tag, 'c3', 20);
        await d.write(id, '/workspace/c.txt', c3);
        await d.write(id, '/workspace/a.txt', 'overwritten\n');
        await echoes('p2');
        // Output several pipe buffers long, on both streams at once.
        await run('seq', `seq 1 20000 | sed 's/^/${tag} /'; seq 1 5000 >&2`, {
          exitCode: 0,
          stdout: Array.from({ length: 20000 }, (_, k) => `${tag} ${k + 1}\n`).join(''),
          stderr: Array.from({ length: 5000 }, (_, k) => `${k + 1}\n`).join(''),
        });

        // The latest checkpoint: its warm standby is swapped in.
        const r2 = await d.rollback(id, c2);
        paths.push(r2.path);
        same('rollback c2 path', r2.path, 'standby');
        same('rollback c2 context', r2.context, chatContext(tag, 'c2'));
        // Right after the rollback: the case where `cat` came back empty.
        await run(
          'cat after standby rollback',
          'cat /workspace/a.txt /workspace/b.txt; test -e /workspace/c.txt && echo c-present || echo c-absent',
          { exitCode: 0, stdout: `${a2}${b2}c-absent\n`, stderr: '' },
        );
        same('read a2', await d.read(id, '/workspace/a.txt'), a2);
        same('read c after standby rollback', await d.read(id, '/workspace/c.txt'), null);

        // An older checkpoint: no standby of it, so CRIU restores the tree.
        const r1 = await d.rollback(id, c1);
        paths.push(r1.path);
        same('rollback c1 path', r1.path, 'restore');
        same('rollback c1 context', r1.context, chatContext(tag, 'c1'));
        await run(
          'cat after restore rollback',
          'cat /workspace/a.txt; test -e /workspace/b.txt && echo b-present || echo b-absent',
          { exitCode: 0, stdout: `${a1}b-absent\n`, stderr: '' },
        );
        same('read a1 after restore', await d.read(id, '/workspace/a.txt'), a1);
        await echoes('p3');

        const f = await d.fork(id, c1);
        ids.push(f);
        const fk = payload(tag, 'fork', 30);
        runs++;
        same('fork cat a1', await d.run(f, 'cat /workspace/a.txt', step++), { exitCode: 0, stdout: a1, stderr: '' });
        await d.write(f, '/workspace/fork.txt', fk);
        runs++;
        same('fork cat own file', await d.run(f, 'cat /workspace/fork.txt', step++), {
          exitCode: 0,
          stdout: fk,
          stderr: '',
        });
        same('parent does not see the fork file', await d.read(id, '/workspace/fork.txt'), null);
        await d.remove(f);
        await d.remove(id);
      }

      const results = await Promise.allSettled(drivers.map((d, i) => scenario(d, i)));
      const failures = results.flatMap((r, i) =>
        r.status === 'rejected'
          ? [`${drivers[i]!.channel} #${i}: ${String((r.reason as Error)?.stack ?? r.reason)}`]
          : [],
      );
      t.deepEqual(failures, []);
      t.log(
        `${runs} command runs, ${mismatches.length} mismatches; rollback paths: ${paths.filter((p) => p === 'standby').length} standby, ${paths.filter((p) => p === 'restore').length} restore`,
      );
      t.deepEqual(mismatches, []);
      t.is(ids.length, 2 * SANDBOXES);

      t.deepEqual(
        statuses.filter((s) => s.status >= 500),
        [],
      );
      // Background work (standby removal) runs behind the sandbox locks; let it finish.
      await ls.engine.drainLocks();
      const { fds: fdsBefore, ...stateBefore } = before;
      t.deepEqual(leftovers(ls), stateBefore);
      t.deepEqual(hostProcessesNaming(ids), []);
      for (const id of ids)
        t.deepEqual(
          ls.engine.cgroups.pids(ls.engine.runtime.cgroupName(id)),
          [],
          `processes left in the cgroup of ${id}`,
        );
      app.server.closeAllConnections();
      // Client sockets close when the server's end does; the count settles.
      await eventually(() => fdCount() === fdsBefore, 10_000).catch(() => undefined);
      const fdsAfter = fdCount();
      t.is(fdsAfter, fdsBefore, `file descriptors: ${fdsBefore} before, ${fdsAfter} after: ${fdTargets().join(', ')}`);
    },
  );
});
