/**
 * Checkpoint and rollback on real sandboxes (issue 3 §8): process memory,
 * files, open file offsets, a Python interpreter and servers all come back
 * as they were at the checkpoint; rollback reaches any checkpoint of the
 * tree; bad targets change nothing; the tree keeps its links and frees disk.
 */
import fs from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import test, { type ExecutionContext } from 'ava';
import { Lockstep, type CheckpointInfo, type Sandbox } from '../../src/index.js';
import { drawTree } from '../../src/checkpoints/tree.js';
import { dropStandby } from '../../src/checkpoints/standby.js';
import { eventually, integration, openTestLockstep, sleep } from '../helpers/harness.js';
import { listDir, sameProcessAlive } from '../fixtures/host-state.js';
import {
  SEQ_LOG,
  counterInLayer,
  counterValue,
  expectedPySum,
  hostPath,
  layerPath,
  oneTo,
  pyState,
  seqLines,
  setTag,
  startCounter,
  startMemo,
  startPyState,
  tagInMemory,
  tellPy,
  waitCounter,
  waitPy,
} from '../fixtures/stub-workloads.js';

integration(test, () => {
  let ls: Lockstep;
  const teardowns: (() => Promise<void>)[] = [];

  test.before(async () => {
    ls = await openTestLockstep(
      { teardown: (fn: () => Promise<void>) => teardowns.push(fn) },
      { images: ['base', 'dev'] },
    );
  });
  test.after.always(async () => {
    for (const fn of teardowns.reverse()) await fn();
  });

  async function sandbox(t: ExecutionContext, image = 'base'): Promise<Sandbox> {
    const sb = await ls.create({ image });
    t.teardown(() => ls.remove(sb.id).catch(() => undefined));
    return sb;
  }

  /** Lets the counter run well past a value, so values before and after it cannot be confused. */
  const runPast = (sb: Sandbox, v: number) => waitCounter(ls, sb.id, (x) => x >= v + 20);

  const counterResumes = test.macro({
    async exec(t, path: 'standby' | 'restore') {
      const sb = await sandbox(t);
      const pid = await startCounter(sb, ls);
      await waitCounter(ls, sb.id, (v) => v >= 5);
      const ckpt = await sb.checkpoint({ label: 'counter' });
      const atCheckpoint = await counterInLayer(ls, ckpt);
      await sb.settled(); // the warm standby of ckpt is ready
      if (path === 'restore') await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      const beforeRollback = await runPast(sb, atCheckpoint);

      const report = await sb.rollback(ckpt.id);
      t.is(report.path, path);
      // Every read from here on sees the restored root: the first value above
      // the checkpoint's is the first one the restored process wrote.
      const after = await waitCounter(ls, sb.id, (v) => v > atCheckpoint);
      t.true(
        after < beforeRollback,
        `the in-memory i was restored: restarted from ${atCheckpoint}, not from ${beforeRollback} (got ${after})`,
      );
      // Same process (CRIU keeps pids inside the sandbox), still counting.
      const alive = await sb.commands.run(`kill -0 ${pid} && cat /proc/${pid}/cmdline | tr '\\0' ' '`);
      t.is(alive.exitCode, 0);
      t.regex(alive.stdout, /while/);
      t.true((await waitCounter(ls, sb.id, (v) => v > after)) > after);
      t.is(sb.info().headCheckpointId, ckpt.id);
      t.is(sb.info().branchId, report.branchId);
      t.not(report.branchId, report.previousBranchId);
    },
    title: (_provided, path) => `a counter process continues from its checkpointed value after rollback (${path} path)`,
  });
  test.serial(counterResumes, 'standby');
  test.serial(counterResumes, 'restore');

  test.serial('files written after the checkpoint are gone and deleted ones are back with their bytes', async (t) => {
    const sb = await sandbox(t);
    const blob = randomBytes(64 * 1024);
    await sb.files.write('/workspace/keep.txt', 'kept\n');
    await sb.files.write('/workspace/doomed.bin', blob);
    const ckpt = await sb.checkpoint();

    await sb.files.write('/workspace/new.txt', 'written after the checkpoint');
    await sb.files.remove('/workspace/doomed.bin');
    await sb.files.write('/workspace/keep.txt', 'changed\n');
    t.false(await sb.files.exists('/workspace/doomed.bin'));

    await sb.rollback(ckpt.id);
    t.false(await sb.files.exists('/workspace/new.txt'));
    t.deepEqual((await sb.files.read('/workspace/doomed.bin')).content, blob);
    t.is((await sb.files.read('/workspace/keep.txt')).content.toString(), 'kept\n');
    // The sandbox sees the same through its own eyes.
    const inside = await sb.commands.run('ls /workspace; sha256sum /workspace/doomed.bin');
    t.is(inside.stdout.split('\n').slice(0, 2).join(' '), 'doomed.bin keep.txt');
    t.true(inside.stdout.includes(createHashHex(blob)));
  });

  test.serial('open files keep their offsets across rollback: no holes, no overwritten lines', async (t) => {
    const sb = await sandbox(t);
    // fd 3 without O_APPEND (its offset decides where each line lands), fd 4 with O_APPEND.
    await sb.commands.spawn(
      `exec 3>${SEQ_LOG} 4>>/tmp/append.log; i=0; while :; do i=$((i+1)); echo $i >&3; echo $i >&4; sleep 0.05; done`,
    );
    const seq = hostPath(ls, sb.id, SEQ_LOG);
    const app = hostPath(ls, sb.id, '/tmp/append.log');
    await eventually(() => seqLines(seq).length >= 5, 5000, 5);
    const ckpt = await sb.checkpoint();
    const atCheckpoint = seqLines(layerPath(ls, ckpt, SEQ_LOG));
    t.deepEqual(atCheckpoint, oneTo(atCheckpoint.length));
    await eventually(() => seqLines(seq).length >= atCheckpoint.length + 20, 5000, 5);

    await sb.rollback(ckpt.id);
    await eventually(
      () => seqLines(seq).length >= atCheckpoint.length + 5 && seqLines(app).length >= atCheckpoint.length + 5,
      5000,
      5,
    );
    for (const file of [seq, app]) {
      const lines = seqLines(file);
      t.deepEqual(lines, oneTo(lines.length), `${file} continues right after line ${atCheckpoint.length}`);
    }
    t.is(
      fs.statSync(seq).size,
      Buffer.byteLength(
        seqLines(seq)
          .map((n) => `${n}\n`)
          .join(''),
      ),
    );
  });

  test.serial('a Python process (dev image) keeps its in-memory dict across rollback', async (t) => {
    const sb = await sandbox(t, 'dev');
    await startPyState(sb, ls);
    await tellPy(ls, sb.id, 'alpha'); // only in memory from now on: the inbox file is deleted
    const ckpt = await sb.checkpoint();
    const atCheckpoint = JSON.parse(fs.readFileSync(layerPath(ls, ckpt, '/tmp/state.json'), 'utf8')) as {
      ticks: number;
      notes: string[];
    };
    t.deepEqual(atCheckpoint.notes, ['alpha']);
    await tellPy(ls, sb.id, 'beta');
    const before = await waitPy(ls, sb.id, (s) => s.ticks >= atCheckpoint.ticks + 20);
    t.deepEqual(before.notes, ['alpha', 'beta']);

    await sb.rollback(ckpt.id);
    const after = await waitPy(ls, sb.id, (s) => s.ticks > atCheckpoint.ticks);
    t.deepEqual(
      after.notes,
      ['alpha'],
      'what it learnt after the checkpoint is forgotten, what it knew before is kept',
    );
    t.true(after.ticks < before.ticks, `ticks ${after.ticks} continue from ${atCheckpoint.ticks}, not ${before.ticks}`);
    t.is(after.sum, expectedPySum(after.ticks), 'the list behind the sum holds exactly one entry per tick');
    t.is((await pyState(ls, sb.id)).notes.length, 1);
  });

  const httpServer = `
import http.server, json
hits = {'n': 0}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        hits['n'] += 1
        body = json.dumps({'hits': hits['n'], 'path': self.path}).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('127.0.0.1', 8080), H).serve_forever()
`;

  // Needs CRIU >= 4.2 on Linux >= 6.16 (4.1.1 cannot dump inet sockets there:
  // getsockopt(SO_PASSCRED) is refused on them; criu#2705).
  test.serial('a TCP server in the sandbox answers after rollback, with its memory restored', async (t) => {
    const sb = await sandbox(t, 'dev');
    await sb.files.write('/workspace/srv.py', httpServer);
    await sb.commands.spawn(['python3', '/workspace/srv.py'], { stderrPath: '/tmp/srv.err' });
    const get = async (p: string) => {
      const r = await sb.commands.run([
        'python3',
        '-c',
        `import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080${p}', timeout=5).read().decode())`,
      ]);
      return r.exitCode === 0 ? (JSON.parse(r.stdout) as { hits: number; path: string }) : undefined;
    };
    await eventually(() => get('/warmup'), 10_000, 50);
    t.deepEqual(await get('/before'), { hits: 2, path: '/before' });
    const ckpt = await sb.checkpoint();
    t.deepEqual(await get('/after'), { hits: 3, path: '/after' });
    await sb.rollback(ckpt.id);
    t.deepEqual(await get('/rolled-back'), { hits: 3, path: '/rolled-back' });
  });

  test.serial('a Unix-socket server in the sandbox answers after rollback, with its memory restored', async (t) => {
    const sb = await sandbox(t, 'dev');
    await sb.files.write(
      '/workspace/usrv.py',
      `
import socketserver, json, os
hits = {'n': 0}
class H(socketserver.StreamRequestHandler):
    def handle(self):
        req = self.rfile.readline().decode().strip()
        hits['n'] += 1
        self.wfile.write((json.dumps({'hits': hits['n'], 'req': req}) + '\\n').encode())
socketserver.UnixStreamServer('/tmp/srv.sock', H).serve_forever()
`,
    );
    await sb.commands.spawn(['python3', '/workspace/usrv.py'], { stderrPath: '/tmp/usrv.err' });
    const ask = async (req: string) => {
      const r = await sb.commands.run([
        'python3',
        '-c',
        `import socket; s = socket.socket(socket.AF_UNIX); s.connect('/tmp/srv.sock'); s.sendall(b'${req}\\n'); print(s.makefile().readline().strip())`,
      ]);
      return r.exitCode === 0 ? (JSON.parse(r.stdout) as { hits: number; req: string }) : undefined;
    };
    await eventually(() => ask('warmup'), 10_000, 50);
    t.deepEqual(await ask('before'), { hits: 2, req: 'before' });
    const ckpt = await sb.checkpoint();
    t.deepEqual(await ask('after-1'), { hits: 3, req: 'after-1' });
    t.deepEqual(await ask('after-2'), { hits: 4, req: 'after-2' });
    await sb.rollback(ckpt.id);
    t.deepEqual(await ask('rolled-back'), { hits: 3, req: 'rolled-back' });
  });

  test.serial('rollback reaches any checkpoint: an ancestor, a later one, and one on another branch', async (t) => {
    const sb = await sandbox(t);
    await startCounter(sb, ls);
    await startMemo(sb, ls);
    const values = new Map<string, number>();
    const step = async (name: string): Promise<CheckpointInfo> => {
      await setTag(ls, sb.id, name);
      await sb.files.write('/workspace/step', name);
      await runPast(sb, Math.max(0, ...values.values()));
      const c = await sb.checkpoint({ label: name });
      values.set(c.id, await counterInLayer(ls, c));
      return c;
    };
    /** Files, process memory and head all at `c`; the counter restarted from c's value. */
    const assertAt = async (c: CheckpointInfo, name: string, counterBelow?: number) => {
      const v = await waitCounter(ls, sb.id, (x) => x > values.get(c.id)!);
      if (counterBelow !== undefined)
        t.true(v < counterBelow, `counter ${v} restarted from ${name} (${values.get(c.id)})`);
      t.is((await sb.files.read('/workspace/step')).content.toString(), name, `files of ${name}`);
      t.is(await tagInMemory(ls, sb.id), name, `process memory of ${name}`);
      t.is(sb.info().headCheckpointId, c.id);
    };

    const c1 = await step('one');
    const c2 = await step('two');
    const c3 = await step('three');
    await sb.rollback(c1.id); // an ancestor
    await assertAt(c1, 'one', values.get(c2.id));
    await sb.rollback(c3.id); // "forward": c3 is no longer an ancestor of the head
    await assertAt(c3, 'three');
    await sb.rollback(c1.id);
    const c4 = await step('four'); // a new branch from c1
    t.is(c4.parentId, c1.id);
    await sb.rollback(c3.id); // back to the old branch
    await assertAt(c3, 'three');
    await sb.rollback(c4.id); // and over to the new one
    await assertAt(c4, 'four');
    t.deepEqual(
      sb.checkpoints().map((c) => [c.label, c.parentId]),
      [
        ['one', null],
        ['two', c1.id],
        ['three', c2.id],
        ['four', c1.id],
      ],
    );
  });

  const refusedRollback = test.macro({
    async exec(t, target: (own: { deleted: CheckpointInfo; other: CheckpointInfo }) => string, code: string) {
      const sb = await sandbox(t);
      await startCounter(sb, ls);
      const kept = await sb.checkpoint({ label: 'kept' });
      const deleted = await sb.checkpoint({ label: 'deleted' });
      await sb.deleteCheckpoint(deleted.id);
      const neighbour = await sandbox(t);
      const other = await neighbour.checkpoint({ label: 'neighbour' });
      await sb.files.write('/workspace/marker', 'after the checkpoints');
      const before = sb.info();
      const checkpointsBefore = sb.checkpoints();

      await t.throwsAsync(sb.rollback(target({ deleted, other })), { code });

      const after = sb.info();
      t.is(after.headCheckpointId, kept.id);
      t.is(after.headCheckpointId, before.headCheckpointId);
      t.is(after.branchId, before.branchId, 'no new branch');
      t.is(after.pid, before.pid);
      t.deepEqual(sb.checkpoints(), checkpointsBefore);
      t.is((await sb.files.read('/workspace/marker')).content.toString(), 'after the checkpoints');
      const now = await counterValue(ls, sb.id);
      t.true((await waitCounter(ls, sb.id, (v) => v > now)) > now, 'the counter is still running');
      t.is(neighbour.info().headCheckpointId, other.id, 'the other sandbox is untouched');
    },
    title: (what = '') => `rollback to ${what} fails with a typed error and changes nothing`,
  });
  test.serial('a deleted checkpoint', refusedRollback, ({ deleted }) => deleted.id, 'CHECKPOINT_NOT_FOUND');
  test.serial("another sandbox's checkpoint", refusedRollback, ({ other }) => other.id, 'CHECKPOINT_NOT_FOUND');
  test.serial('a checkpoint id that never existed', refusedRollback, () => 'ckpt_doesnotexist', 'CHECKPOINT_NOT_FOUND');

  test.serial(
    'checkpoint of a sandbox that is not running fails with SANDBOX_NOT_RUNNING and leaves nothing',
    async (t) => {
      const sb = await sandbox(t);
      const pid = sb.info().pid!;
      process.kill(pid, 'SIGKILL'); // its init: the whole pid namespace goes with it
      await eventually(() => !sameProcessAlive(pid, undefined));
      const layers = listDir(ls.engine.paths.layers);
      const images = listDir(ls.engine.paths.processImages);
      await t.throwsAsync(sb.checkpoint({ label: 'never' }), { code: 'SANDBOX_NOT_RUNNING' });
      t.deepEqual(sb.checkpoints(), []);
      t.deepEqual(listDir(ls.engine.paths.layers), layers);
      t.deepEqual(listDir(ls.engine.paths.processImages), images);
    },
  );

  test.serial(
    'the checkpoint tree: parent links, drawing with the head marked, deletion re-parents and frees disk',
    async (t) => {
      const sb = await sandbox(t);
      await startMemo(sb, ls);
      const mk = async (name: string) => {
        await setTag(ls, sb.id, name);
        return sb.checkpoint({ label: name });
      };
      const c1 = await mk('c1');
      const c2 = await mk('c2');
      const c3 = await mk('c3');
      await sb.rollback(c1.id);
      const c4 = await mk('c4');
      const [fork] = await sb.fork(c3.id);
      t.teardown(() => (fork?.ok ? ls.remove(fork.id).catch(() => undefined) : Promise.resolve()));
      t.true(fork!.ok);

      t.deepEqual(
        sb.checkpoints().map((c) => [c.id, c.parentId]),
        [
          [c1.id, null],
          [c2.id, c1.id],
          [c3.id, c2.id],
          [c4.id, c1.id],
        ],
      );
      const drawing = drawTree(ls.engine, ls.engine.catalog.sandbox(sb.id)!);
      for (const c of [c1, c2, c3, c4]) t.true(drawing.includes(c.id), `${c.id} is drawn`);
      const headLines = drawing.split('\n').filter((l) => / \*( |$)/.test(l));
      t.is(headLines.length, 1, drawing);
      t.true(headLines[0]!.includes(c4.id), drawing);
      t.true(drawing.includes(`⑂ fork ${(fork as { id: string }).id}`), drawing);

      const { layers, processImages } = ls.engine.paths;
      t.true(fs.existsSync(`${layers}/${c2.layerId}`) && fs.existsSync(`${processImages}/${c2.id}`));
      await sb.deleteCheckpoint(c2.id);
      t.deepEqual(
        sb.checkpoints().map((c) => [c.id, c.parentId]),
        [
          [c1.id, null],
          [c3.id, c1.id],
          [c4.id, c1.id],
        ],
      );
      t.false(fs.existsSync(`${layers}/${c2.layerId}`), 'layer freed');
      t.false(fs.existsSync(`${processImages}/${c2.id}`), 'process image freed');
      for (const c of [c1, c3, c4])
        t.true(fs.existsSync(`${layers}/${c.layerId}`) && fs.existsSync(`${processImages}/${c.id}`));
      t.false(drawTree(ls.engine, ls.engine.catalog.sandbox(sb.id)!).includes(c2.id));
      await t.throwsAsync(sb.rollback(c2.id), { code: 'CHECKPOINT_NOT_FOUND' });

      // The re-parented child still restores: its layer never depended on its parent's.
      await sb.rollback(c3.id);
      t.is(await tagInMemory(ls, sb.id), 'c3');
      // Deleting the head moves the head to its parent.
      await sb.deleteCheckpoint(c3.id);
      t.is(sb.info().headCheckpointId, c1.id);
      t.is(await tagInMemory(ls, sb.id), 'c3', 'deleting a checkpoint does not touch the running sandbox');
    },
  );

  const lockedAgainstOtherManagers = test.macro({
    async exec(t, path: 'standby' | 'restore') {
      const sb = await sandbox(t);
      const ckpt = await sb.checkpoint();
      await sb.settled();
      if (path === 'restore') await ls.engine.withSandboxLock(sb.id, () => dropStandby(ls.engine, sb.id));
      t.is((await sb.rollback(ckpt.id)).path, path);
      await sb.settled();

      const other = await Lockstep.open({ home: ls.home }); // a second manager (say, the CLI next to a server)
      t.teardown(() => other.close());
      const order: string[] = [];
      let release!: () => void;
      const held = new Promise<void>((r) => (release = r));
      let entered!: () => void;
      const inside = new Promise<void>((r) => (entered = r));
      const a = ls.engine.withSandboxLock(sb.id, async () => {
        order.push('A holds the sandbox');
        entered();
        await held;
        order.push('A releases it');
      });
      await inside;
      const b = other
        .get(sb.id)
        .checkpoint()
        .then(() => order.push('B checkpointed'));
      await sleep(300); // ample time for B to get in if nothing stops it
      release();
      await Promise.all([a, b]);
      await other.get(sb.id).settled(); // B's manager prepares a warm standby in the background: let it finish before closing
      t.deepEqual(order, ['A holds the sandbox', 'A releases it', 'B checkpointed']);
    },
    title: (_p, path) => `after a rollback (${path} path) another manager still waits for the sandbox's lock`,
  });
  test.serial(lockedAgainstOtherManagers, 'restore');
  // The lock lives outside instance folders, so a swap keeps it too.
  test.serial(lockedAgainstOtherManagers, 'standby');

  test.serial('deleting a checkpoint also frees its warm standby', async (t) => {
    const sb = await sandbox(t);
    await startMemo(sb, ls);
    const ckpt = await sb.checkpoint();
    await sb.settled();
    const withStandby = ls.engine.catalog.standby(sb.id)!;
    t.is(withStandby.checkpoint, ckpt.id);

    await sb.deleteCheckpoint(ckpt.id);
    await sb.settled();
    t.is(ls.engine.catalog.standby(sb.id)?.instance ?? null, null);
    t.false(fs.existsSync(ls.engine.paths.upper(withStandby.instance)), 'its writable layer is gone');
    t.false(fs.existsSync(`/proc/${withStandby.pid}`), 'its processes are gone');
  });
});

function createHashHex(b: Buffer): string {
  return createHash('sha256').update(b).digest('hex');
}
