/**
 * Two Lockstep hosts on this machine, for real (issue 14, item 4): two state
 * directories, each served by `lockstep serve` inside a network namespace of
 * its own, the two joined by a veth pair whose private addresses exist only
 * inside those namespaces. Host B pulls a snapshot from host A over HTTP
 * with the tenant's token on A:
 * - a Python process holding 64 MiB, its files and the agent's context
 *   arrive intact, and a lineage-scoped effect replays on B;
 * - a transfer cut short (host A's server killed mid-download, started
 *   again) resumes with a Range request instead of starting over;
 * - another tenant's token cannot pull the snapshot (404, like a missing
 *   one), and B pulls only from the origins its operator allowed.
 * The test process stays in the host's namespaces: requests to the servers
 * go through test/fixtures/netns-client.mjs run with `nsenter --net`.
 * Namespaces and servers are removed afterwards, also on failure.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test, { type ExecutionContext } from 'ava';
import { Lockstep } from '../../src/index.js';
import { TEST_ROOT, destroyHome, eventually, freshHome, integration, sleep } from '../helpers/harness.js';
import { addTenant } from '../../src/tenants/tenants.js';
import { hostPath } from '../fixtures/stub-workloads.js';
import { hostSigningKey } from '../../src/snapshots/signing.js';
import { StatePaths } from '../../src/paths.js';

const CLI = fileURLToPath(new URL('../../../bin/lockstep.js', import.meta.url));
const CLIENT = fileURLToPath(new URL('../../../test/fixtures/netns-client.mjs', import.meta.url));
const MiB = 1024 * 1024;

/** Python holding 64 MiB of random bytes only in memory; on /tmp/inbox/check it writes their SHA-256. */
const PY_BALLAST = `
import hashlib, json, os, time
ballast = bytearray(os.urandom(64 << 20))
notes, ticks = [], 0
os.makedirs('/tmp/inbox', exist_ok=True)
with open('/tmp/ballast.sha', 'w') as f:
    f.write(hashlib.sha256(ballast).hexdigest())
while True:
    ticks += 1
    for name in sorted(os.listdir('/tmp/inbox')):
        if name == 'check':
            with open('/tmp/check.tmp', 'w') as f:
                f.write(hashlib.sha256(ballast).hexdigest())
            os.replace('/tmp/check.tmp', '/tmp/check.out')
        else:
            with open('/tmp/inbox/' + name) as f:
                notes.append(f.read().strip())
        os.unlink('/tmp/inbox/' + name)
    with open('/tmp/py.tmp', 'w') as f:
        json.dump({'ticks': ticks, 'notes': notes}, f)
    os.replace('/tmp/py.tmp', '/tmp/py.json')
    time.sleep(0.05)
`;

interface PyState {
  ticks: number;
  notes: string[];
}

function pyState(ls: Lockstep, id: string): PyState {
  return JSON.parse(fs.readFileSync(hostPath(ls, id, '/tmp/py.json'), 'utf8')) as PyState;
}

function drop(ls: Lockstep, id: string, name: string, text: string): void {
  const staging = hostPath(ls, id, `/tmp/.${name}`);
  fs.writeFileSync(staging, text);
  fs.renameSync(staging, hostPath(ls, id, `/tmp/inbox/${name}`));
}

/** A memory check: the process hashes its 64 MiB again. */
async function memoryDigest(ls: Lockstep, id: string): Promise<string> {
  fs.rmSync(hostPath(ls, id, '/tmp/check.out'), { force: true });
  drop(ls, id, 'check', '');
  return eventually(() => fs.readFileSync(hostPath(ls, id, '/tmp/check.out'), 'utf8'), 30_000, 50);
}

interface Reply {
  status: number;
  body?: any;
  error?: string;
}

integration(test, () => {
  const tag = `${process.pid % 10000}`;
  const nsA = `lsA-${tag}`;
  const nsB = `lsB-${tag}`;
  // A private /24 picked from the pid, used only inside the two namespaces.
  const net = `10.${200 + (process.pid % 50)}.${process.pid % 250}`;
  const ipA = `${net}.1`;
  const ipB = `${net}.2`;
  const port = 7300;
  const urlA = `http://${ipA}:${port}`;
  const urlB = `http://${ipB}:${port}`;
  const homeA = freshHome('hostA');
  const homeB = freshHome('hostB');
  const servers: { A?: ChildProcess; B?: ChildProcess } = {};
  let tokens: { aliceA: string; malloryA: string; aliceB: string };
  let aliceB: string;
  let snapshotId: string;
  let sandboxA: string;
  let atSnapshot: { ticks: number; digest: string; context: unknown };

  const serverLog = (which: string) => path.join(TEST_ROOT, `two-hosts-${tag}-${which}.log`);
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });

  /** One request from inside a namespace. */
  async function request(ns: string, spec: Record<string, unknown>): Promise<Reply> {
    const child = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, CLIENT, JSON.stringify(spec)], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    await new Promise((r) => child.once('close', r));
    try {
      return JSON.parse(out) as Reply;
    } catch {
      return { status: -1, error: `${out}${err}` };
    }
  }

  /** `lockstep serve` for a state directory inside a namespace; resolves once it answers /healthz. */
  async function startServer(which: 'A' | 'B'): Promise<void> {
    const [ns, home, addr] = which === 'A' ? [nsA, homeA, ipA] : [nsB, homeB, ipB];
    const env = {
      ...process.env,
      LOCKSTEP_LOG_LEVEL: 'info',
      LOCKSTEP_PULL_SOURCES: which === 'B' ? urlA : '',
      // B imports what A signed: A's bundle-signing key is one B trusts.
      LOCKSTEP_TRUSTED_BUNDLE_KEYS: which === 'B' ? hostSigningKey(new StatePaths(homeA).bundleSigningKey).name : '',
    };
    // nsenter joins only the network namespace: the server shares the host's mounts, like a host's daemon.
    const child = spawn(
      'nsenter',
      [
        `--net=/run/netns/${ns}`,
        process.execPath,
        CLI,
        'serve',
        '--home',
        home,
        '--host',
        addr,
        '--port',
        String(port),
      ],
      { env, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    // Each server's log, for the failure message.
    const log = fs.createWriteStream(serverLog(which), { flags: 'a' });
    child.stdout!.pipe(log);
    child.stderr!.pipe(log);
    servers[which] = child;
    await eventually(
      async () =>
        (await request(ns, { url: `http://${addr}:${port}`, path: '/healthz', timeoutMs: 2000 })).status === 200,
      60_000,
      250,
    );
  }

  async function stopServer(which: 'A' | 'B', signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    const child = servers[which];
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise((r) => child.once('close', r));
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
    await gone;
    clearTimeout(timer);
    delete servers[which];
  }

  test.before(async () => {
    // Host A: a Python sandbox of tenant alice, checkpointed and snapshotted.
    const lsA = await Lockstep.open({ home: homeA });
    try {
      await lsA.images.ensure('dev');
      const alice = addTenant(lsA.engine.catalog.db, 'alice');
      const mallory = addTenant(lsA.engine.catalog.db, 'mallory');
      const sb = await lsA.create({ image: 'dev', memoryMb: 384, tenant: alice.tenant.id });
      sandboxA = sb.id;
      await sb.files.write('/workspace/ballast.py', PY_BALLAST);
      await sb.files.write('/workspace/notes.txt', 'notes from host A\n');
      await sb.commands.spawn(['python3', '/workspace/ballast.py'], { stderrPath: '/tmp/ballast.err' });
      await eventually(() => pyState(lsA, sb.id).ticks >= 3, 60_000, 50);
      drop(lsA, sb.id, 'n1', 'remembered on A');
      await eventually(() => pyState(lsA, sb.id).notes.includes('remembered on A'), 30_000, 50);
      await sb.effects.run({ kind: 'payment.charge', input: { cents: 500 }, reversibility: 'irreversible' }, () => ({
        chargeId: 'ch_1',
      }));
      const context = { format: 'openai-chat', messages: [{ role: 'user', content: 'move me to host B' }] };
      const digest = await memoryDigest(lsA, sb.id);
      const ticks = pyState(lsA, sb.id).ticks;
      const ckpt = await sb.checkpoint({ label: 'travel', context });
      const snap = await lsA.snapshots.create(ckpt.id, { tenant: alice.tenant.id, name: 'py' });
      snapshotId = snap.id;
      atSnapshot = { ticks, digest, context };
      tokens = { aliceA: alice.token, malloryA: mallory.token, aliceB: '' };
    } finally {
      await lsA.close();
    }
    const lsB = await Lockstep.open({ home: homeB });
    try {
      await lsB.images.ensure('dev');
      const alice = addTenant(lsB.engine.catalog.db, 'alice');
      tokens.aliceB = alice.token;
      aliceB = alice.tenant.id;
    } finally {
      await lsB.close();
    }
    // Two namespaces joined by a veth pair, addresses only inside them.
    ip('netns', 'add', nsA);
    ip('netns', 'add', nsB);
    ip('link', 'add', `vA${tag}`, 'type', 'veth', 'peer', 'name', `vB${tag}`);
    ip('link', 'set', `vA${tag}`, 'netns', nsA);
    ip('link', 'set', `vB${tag}`, 'netns', nsB);
    for (const [ns, dev, addr] of [
      [nsA, `vA${tag}`, ipA],
      [nsB, `vB${tag}`, ipB],
    ] as const) {
      ip('-n', ns, 'addr', 'add', `${addr}/24`, 'dev', dev);
      ip('-n', ns, 'link', 'set', dev, 'up');
      ip('-n', ns, 'link', 'set', 'lo', 'up');
    }
    await startServer('A');
    await startServer('B');
  });

  let passed = 0;
  test.afterEach.always((t) => {
    if (t.passed) passed++;
  });
  test.after.always(async () => {
    await stopServer('A').catch(() => undefined);
    await stopServer('B').catch(() => undefined);
    for (const ns of [nsA, nsB])
      try {
        ip('netns', 'del', ns);
      } catch {
        /* never made */
      }
    await destroyHome(homeA).catch(() => undefined);
    await destroyHome(homeB).catch(() => undefined);
    // The servers' logs stay only when something failed (they say why).
    if (passed === 3) for (const which of ['A', 'B']) fs.rmSync(serverLog(which), { force: true });
  });

  const pull = (token: string, body: Record<string, unknown>) =>
    request(nsB, { url: urlB, method: 'POST', path: '/v1/snapshots/pull', token, body: { from: urlA, ...body } });

  /** On host B (a second manager beside its server): a sandbox from the pulled snapshot resumes A's state. */
  async function assertArrived(t: ExecutionContext, snapshot: string): Promise<void> {
    const lsB = await Lockstep.open({ home: homeB });
    try {
      const sb = await lsB.create({ fromSnapshot: snapshot, tenant: aliceB });
      try {
        const s = await eventually(() => pyState(lsB, sb.id), 30_000, 50);
        t.true(s.ticks >= atSnapshot.ticks, `the Python counter carries on (${s.ticks} from ${atSnapshot.ticks})`);
        t.true(s.notes.includes('remembered on A'), 'what it held only in memory is there');
        await eventually(() => pyState(lsB, sb.id).ticks > s.ticks, 30_000, 50);
        t.is(await memoryDigest(lsB, sb.id), atSnapshot.digest, 'its 64 MiB arrived intact');
        t.is((await sb.files.read('/workspace/notes.txt')).content.toString(), 'notes from host A\n');
        t.deepEqual(lsB.snapshots.context(snapshot, { tenant: aliceB }), atSnapshot.context);
        let ran = 0;
        const out = await sb.effects.run(
          { kind: 'payment.charge', input: { cents: 500 }, reversibility: 'irreversible' },
          () => {
            ran++;
            return { chargeId: 'ch_2' };
          },
        );
        t.deepEqual(out, { chargeId: 'ch_1' }, 'the payment made on A replays on B');
        t.is(ran, 0, 'and is not made again');
      } finally {
        await lsB.remove(sb.id);
      }
    } finally {
      await lsB.close();
    }
  }

  test.serial('host B pulls a Python sandbox from host A: memory, files and context arrive intact', async (t) => {
    const r = await pull(tokens.aliceB, { snapshot: snapshotId, token: tokens.aliceA });
    t.is(r.status, 201, JSON.stringify(r));
    const { snapshot, bundleBytes, downloadMs, importMs, resumed } = r.body;
    t.like(snapshot, { name: 'py', tenant: aliceB });
    t.is(resumed, 0);
    t.true(bundleBytes > 64 * MiB, `the bundle holds the memory (${bundleBytes} bytes)`);
    t.log(
      `bundle ${(bundleBytes / MiB).toFixed(1)} MiB; transfer ${downloadMs.toFixed(0)} ms; import ${importMs.toFixed(0)} ms; load ${os
        .loadavg()
        .map((l) => l.toFixed(1))
        .join(' ')}`,
    );
    await assertArrived(t, snapshot.id);
    t.true(typeof sandboxA === 'string');
  });

  test.serial("another tenant's token cannot pull the snapshot; B pulls only from allowed origins", async (t) => {
    const r = await pull(tokens.aliceB, { snapshot: snapshotId, token: tokens.malloryA, name: 'stolen' });
    t.is(r.status, 404, JSON.stringify(r));
    t.is(r.body.error.code, 'SNAPSHOT_NOT_FOUND');
    const missing = await pull(tokens.aliceB, { snapshot: 'snap_doesnotexist', token: tokens.aliceA });
    t.is(missing.status, 404);
    t.is(missing.body.error.code, 'SNAPSHOT_NOT_FOUND', 'the same answer as for a snapshot that does not exist');
    const elsewhere = await request(nsB, {
      url: urlB,
      method: 'POST',
      path: '/v1/snapshots/pull',
      token: tokens.aliceB,
      body: { from: `http://${ipB}:${port + 1}`, snapshot: snapshotId, token: tokens.aliceA },
    });
    t.is(elsewhere.status, 403);
    t.is(elsewhere.body.error.code, 'PULL_SOURCE_NOT_ALLOWED');
    const list = await request(nsB, { url: urlB, path: '/v1/snapshots', token: tokens.aliceB });
    t.false(
      (list.body as { name: string }[]).some((s) => s.name === 'stolen'),
      'nothing was imported by the refused pulls',
    );
    t.deepEqual(fs.readdirSync(path.join(homeB, 'store', 'scratch')), []);
  });

  test.serial('a transfer cut short by a restart of host A resumes where it stopped', async (t) => {
    // Slow A's side of the link so that the download is still running when A goes down.
    execFileSync('ip', [
      'netns',
      'exec',
      nsA,
      'tc',
      'qdisc',
      'add',
      'dev',
      `vA${tag}`,
      'root',
      'tbf',
      'rate',
      '120mbit',
      'burst',
      '256kb',
      'latency',
      '200ms',
    ]);
    t.teardown(() => {
      try {
        execFileSync('ip', ['netns', 'exec', nsA, 'tc', 'qdisc', 'del', 'dev', `vA${tag}`, 'root']);
      } catch {
        /* namespace gone */
      }
    });
    const pending = pull(tokens.aliceB, { snapshot: snapshotId, token: tokens.aliceA, name: 'py-resumed' });
    const scratch = path.join(homeB, 'store', 'scratch');
    const partSize = () =>
      fs
        .readdirSync(scratch)
        .filter((f) => f.endsWith('.bundle'))
        .reduce((n, f) => n + fs.statSync(path.join(scratch, f)).size, 0);
    await eventually(() => partSize() > 8 * MiB, 120_000, 20);
    const cutAt = partSize();
    await stopServer('A', 'SIGKILL');
    await sleep(1000);
    await startServer('A');
    const r = await pending;
    t.is(r.status, 201, JSON.stringify(r));
    const { bundleBytes, receivedBytes, resumed, restarted } = r.body;
    t.log(
      `cut at ${(cutAt / MiB).toFixed(1)} MiB of ${(bundleBytes / MiB).toFixed(1)} MiB; received ${(receivedBytes / MiB).toFixed(1)} MiB in all; resumed ${resumed}×; restarted ${restarted}`,
    );
    t.true(resumed >= 1, 'the download resumed with a Range request');
    t.false(restarted, 'the resumed bytes verified (the bundle is the same bytes on every export)');
    t.true(receivedBytes < bundleBytes + cutAt / 2, 'what had arrived was not downloaded again');
    await assertArrived(t, r.body.snapshot.id);
  });
});
