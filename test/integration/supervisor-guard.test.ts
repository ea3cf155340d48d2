/**
 * The supervisor socket is root's "run this as my child" service, so it must
 * serve nobody but its own user, and nothing but its own verbs: the helper's
 * create/prepare and the CRIU service. Checked against the real supervisor:
 * a process of another uid (that can even reach the socket, having
 * CAP_DAC_OVERRIDE) is refused and runs nothing; root asking for any other
 * program or verb is refused and runs nothing; every control socket is 0600.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import test from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { helperPath } from '../../src/native/binding.js';
import { criuBinary } from '../../src/host/criu-service.js';

const run = promisify(execFile);

/** One raw supervisor request (NUL-separated tokens, empty token at the end); the answer text. */
function request(socket: string, tokens: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const conn = net.connect(socket);
    let out = '';
    conn.setEncoding('utf8');
    conn.on('connect', () => conn.write(tokens.join('\0') + '\0\0'));
    conn.on('data', (d: string) => (out += d));
    conn.on('end', () => resolve(out));
    conn.on('error', reject);
  });
}

/** The same request from a process running as uid/gid 65534, optionally keeping CAP_DAC_OVERRIDE (so it can reach a 0600 socket). */
async function requestAsNobody(
  socket: string,
  tokens: string[],
  dacOverride: boolean,
): Promise<{ answer?: string; error?: string }> {
  const code = `
    const net = require('node:net');
    const c = net.connect(process.argv[1]);
    let out = '';
    c.setEncoding('utf8');
    c.on('connect', () => c.write(JSON.parse(process.argv[2]).join('\\0') + '\\0\\0'));
    c.on('data', (d) => (out += d));
    c.on('end', () => console.log(JSON.stringify({ answer: out })));
    c.on('error', (e) => console.log(JSON.stringify({ error: e.code })));`;
  const caps = dacOverride ? ['--inh-caps=+dac_override', '--ambient-caps=+dac_override'] : ['--inh-caps=-all'];
  const { stdout } = await run('setpriv', [
    '--reuid=65534',
    '--regid=65534',
    '--clear-groups',
    ...caps,
    process.execPath,
    '-e',
    code,
    socket,
    JSON.stringify(tokens),
  ]);
  return JSON.parse(stdout) as { answer?: string; error?: string };
}

const errorOf = (answer: string) =>
  (JSON.parse(answer.trim().split('\n').pop()!) as { error?: { code: string; message: string } }).error;

integration(test, () => {
  test.serial(
    'only its own uid is served; only the helper verbs and the CRIU service run; control sockets are 0600',
    async (t) => {
      const ls = await openTestLockstep(t);
      await ls.engine.criu.ensureRunning();
      const paths = ls.engine.paths;
      const sock = paths.supervisorSocket;

      // Every control socket: a socket, owner root, mode 0600.
      for (const s of [sock, paths.criuSocket]) {
        const st = fs.statSync(s);
        t.true(st.isSocket(), s);
        t.is(st.mode & 0o7777, 0o600, `${s} is ${(st.mode & 0o7777).toString(8)}`);
        t.is(st.uid, 0);
      }

      // Positive control: root asking for an allowed verb gets it run.
      const devOk = path.join(paths.run, 'guard-dev-ok');
      fs.mkdirSync(devOk, { mode: 0o700 });
      t.teardown(() => fs.rmSync(devOk, { recursive: true, force: true }));
      t.deepEqual(JSON.parse(await request(sock, ['run', helperPath, 'prepare', '--dev', devOk])), { prepared: true });
      t.true(fs.statSync(path.join(devOk, 'null')).isCharacterDevice());

      // Another uid, without privileges: cannot even connect (0600 socket in 0700 folders).
      const devNobody = path.join(paths.run, 'guard-dev-nobody');
      fs.mkdirSync(devNobody, { mode: 0o700 });
      t.teardown(() => fs.rmSync(devNobody, { recursive: true, force: true }));
      const plain = await requestAsNobody(sock, ['run', helperPath, 'prepare', '--dev', devNobody], false);
      t.is(plain.error, 'EACCES', JSON.stringify(plain));
      // Another uid that can reach the socket (CAP_DAC_OVERRIDE): SO_PEERCRED says
      // 65534, the request is refused and nothing runs.
      const reached = await requestAsNobody(sock, ['run', helperPath, 'prepare', '--dev', devNobody], true);
      t.truthy(reached.answer, JSON.stringify(reached));
      t.like(errorOf(reached.answer!), { code: 'EACCES' });
      t.deepEqual(fs.readdirSync(devNobody), [], 'the refused request made no device nodes');

      // Root, but not an allowed request: refused with EPERM, nothing runs.
      const marker = path.join(paths.run, 'guard-marker');
      const criuLog = paths.criuLog;
      const refused: [string, string[]][] = [
        ['any program', ['run', '/bin/sh', '-c', `touch ${marker}`]],
        ['a symlink-free path to another program', ['run', '/usr/bin/touch', marker]],
        ['the helper under another name', ['run', '/bin/sh', 'create', '-c', `touch ${marker}`]],
        [
          'the helper supervise verb',
          ['run', helperPath, 'supervise', '--socket', path.join(paths.run, 'second.sock'), '--pidfile', marker],
        ],
        ['the helper enter verb', ['run', helperPath, 'enter', '--pid', '1', '--', '/usr/bin/touch', marker]],
        ['the helper with no verb', ['run', helperPath]],
        ['a daemon that is not CRIU', ['daemon', criuLog, '/bin/sh', '-c', `touch ${marker}`]],
        ['CRIU doing something else than serving', ['daemon', criuLog, criuBinary(), 'check']],
        [
          'CRIU with more arguments',
          ['daemon', criuLog, criuBinary(), 'service', '--address', path.join(paths.run, 'x.sock'), '--exec-cmd'],
        ],
        [
          'a CRIU socket outside the run folder',
          ['daemon-isolated', criuLog, criuBinary(), 'service', '--address', '/tmp/lockstep-guard.sock'],
        ],
        [
          'a CRIU socket in a subfolder',
          ['daemon', criuLog, criuBinary(), 'service', '--address', path.join(paths.run, 'sandboxes', 'x.sock')],
        ],
        [
          'a daemon log outside the run folder',
          [
            'daemon',
            marker.replace(paths.run, '/tmp'),
            criuBinary(),
            'service',
            '--address',
            path.join(paths.run, 'y.sock'),
          ],
        ],
        [
          'a daemon log escaping with ..',
          ['daemon', path.join(paths.run, '..'), criuBinary(), 'service', '--address', path.join(paths.run, 'z.sock')],
        ],
        ['an unknown request kind', ['exec', helperPath, 'prepare', '--dev', devNobody]],
      ];
      for (const [what, tokens] of refused) {
        const answer = await request(sock, tokens);
        const err = errorOf(answer);
        t.truthy(err, `${what}: ${answer}`);
        t.true(err!.code === 'EPERM' || err!.code === 'EINVAL', `${what}: ${answer}`);
      }
      t.false(fs.existsSync(marker), 'no refused request ran');
      t.false(fs.existsSync('/tmp/lockstep-guard.sock'));
      t.deepEqual(fs.readdirSync(devNobody), []);
      for (const s of ['second.sock', 'x.sock', 'y.sock', 'z.sock']) t.false(fs.existsSync(path.join(paths.run, s)), s);

      // The supervisor is still serving its own verbs after all of it.
      fs.rmSync(path.join(devOk, 'null'));
      t.deepEqual(JSON.parse(await request(sock, ['run', helperPath, 'prepare', '--dev', devOk])), { prepared: true });
      t.true(fs.existsSync(path.join(devOk, 'null')));
    },
  );
});
