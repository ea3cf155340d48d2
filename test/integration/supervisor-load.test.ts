/**
 * The supervisor under load (issue 9): `create` failed with `write EPIPE`
 * when 50 sandboxes were busy at once. The manager writes its request on the
 * event-loop turn after connect() succeeded; the supervisor read each
 * connection with a blocking 5 s timeout started at accept, so a turn that
 * came later than that found the connection closed, and one slow client held
 * up every other one meanwhile. Checked against the real supervisor: a
 * request written after a 6 s stall of the event loop is answered and run,
 * an idle connection does not stop another request from being served, and
 * a peer that hangs up mid-request costs nothing; a request no supervisor
 * takes fails with a typed error.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { helperPath } from '../../src/native/binding.js';

/** Holds the event loop (as a busy manager's synchronous work does). */
function stallEventLoop(ms: number): void {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    /* spin */
  }
}

function freshDevDir(t: { teardown(fn: () => void): void }, run: string, name: string): string {
  const dir = path.join(run, name);
  fs.mkdirSync(dir, { mode: 0o700 });
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** A raw connection to the supervisor; `closed` turns true when the supervisor hangs up. */
async function rawConnection(socket: string): Promise<{ conn: net.Socket; closed: () => boolean }> {
  const conn = net.connect(socket);
  let closed = false;
  conn.on('close', () => (closed = true));
  conn.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    conn.once('connect', resolve);
    conn.once('error', reject);
  });
  return { conn, closed: () => closed };
}

integration(test, () => {
  test.serial(
    'a request written 6 s after connect (a stalled event loop) is answered and run, not dropped with EPIPE',
    async (t) => {
      const ls = await openTestLockstep(t);
      const { supervisor, paths } = ls.engine;
      await supervisor.ensureRunning();
      const dev = freshDevDir(t, paths.run, 'stall-dev');

      // connect() happens now; the request is written on the next turn, after the stall.
      const answer = supervisor.run([helperPath, 'prepare', '--dev', dev]);
      stallEventLoop(6000);
      t.deepEqual(JSON.parse(await answer), { prepared: true });
      t.true(fs.statSync(path.join(dev, 'null')).isCharacterDevice());
    },
  );

  test.serial('a connection that sends nothing holds up no other request', async (t) => {
    const ls = await openTestLockstep(t);
    const { supervisor, paths } = ls.engine;
    await supervisor.ensureRunning();
    const idle = await rawConnection(paths.supervisorSocket);
    t.teardown(() => idle.conn.destroy());
    const dev = freshDevDir(t, paths.run, 'idle-dev');

    t.deepEqual(JSON.parse(await supervisor.run([helperPath, 'prepare', '--dev', dev])), { prepared: true });
    // Served while the idle connection was still open: nobody waited for it to time out.
    t.false(idle.closed(), 'the supervisor had to drop the idle connection before serving the request');
    t.true(fs.statSync(path.join(dev, 'null')).isCharacterDevice());
  });

  test.serial('a peer that hangs up mid-request runs nothing, and the next request is served', async (t) => {
    const ls = await openTestLockstep(t);
    const { supervisor, paths } = ls.engine;
    await supervisor.ensureRunning();
    const half = freshDevDir(t, paths.run, 'half-dev');
    const partial = await rawConnection(paths.supervisorSocket);
    // The whole argv, but not the empty token that ends a request.
    partial.conn.end(['run', helperPath, 'prepare', '--dev', half].join('\0') + '\0');
    await new Promise<void>((resolve) => partial.conn.once('close', () => resolve()));

    const dev = freshDevDir(t, paths.run, 'after-dev');
    t.deepEqual(JSON.parse(await supervisor.run([helperPath, 'prepare', '--dev', dev])), { prepared: true });
    t.true(fs.statSync(path.join(dev, 'null')).isCharacterDevice());
    t.deepEqual(fs.readdirSync(half), [], 'a request without its end marker was run');
  });

  // A request that finds no supervisor listening (stopped, or killed: see
  // faults-supervisor-killed) starts a new one and is asked again; the failed
  // connect ran nothing, so the request runs exactly once.
  test.serial('a request after the supervisor stopped starts a new one and runs once', async (t) => {
    const ls = await openTestLockstep(t);
    const { supervisor, paths } = ls.engine;
    await supervisor.ensureRunning();
    const before = fs.readFileSync(paths.supervisorPidfile, 'utf8').trim();
    await supervisor.stop();
    const dev = freshDevDir(t, paths.run, 'gone-dev');
    await supervisor.run([helperPath, 'prepare', '--dev', dev]);
    t.not(fs.readFileSync(paths.supervisorPidfile, 'utf8').trim(), before);
    t.true(fs.readdirSync(dev).includes('null'), fs.readdirSync(dev).join(' '));
  });
});
