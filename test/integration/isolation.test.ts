/**
 * What a sandbox can see and do of the host: no host processes, no host
 * files, no host network, its own hostname, no view into another sandbox,
 * and a capability set without CAP_SYS_ADMIN.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test, { type ExecutionContext } from 'ava';
import { integration, openTestLockstep } from '../helpers/harness.js';

const fixtures = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures');

/** A host `sleep` with an argument no other process has, killed in teardown. */
function hostSleeper(t: ExecutionContext): { child: ChildProcess; marker: string } {
  const marker = `${4000 + Math.floor(Math.random() * 1000)}.${randomBytes(3).readUIntBE(0, 3)}`;
  const child = spawn('sleep', [marker], { stdio: 'ignore' });
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  return { child, marker };
}

/** A TCP server of our own that counts the connections it accepted. */
async function countingServer(t: ExecutionContext, host: string): Promise<{ port: number; accepted: () => number }> {
  let accepted = 0;
  const server = net.createServer((sock) => {
    accepted++;
    sock.end('hello from the host\n');
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { port: (server.address() as net.AddressInfo).port, accepted: () => accepted };
}

function connectFromHost(port: number, host: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let data = '';
    const sock = net.connect(port, host);
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => (data += d));
    sock.on('end', () => resolve(data));
    sock.on('error', reject);
  });
}

/** Rows of `ps -o pid,args` as [pid, args]. */
function psRows(stdout: string): [number, string][] {
  return stdout
    .trim()
    .split('\n')
    .slice(1)
    .map((line) => {
      const m = /^\s*(\d+)\s+(.*)$/.exec(line)!;
      return [Number(m[1]), m[2]!] as [number, string];
    });
}

integration(test, () => {
  test.serial('only the sandbox init and the command itself are visible; a host process is not', async (t) => {
    const ls = await openTestLockstep(t);
    const { child, marker } = hostSleeper(t);
    t.true(fs.readFileSync(`/proc/${child.pid}/cmdline`, 'utf8').includes(marker), 'control: the host sees its sleep');
    const sb = await ls.create();

    const ps = await sb.commands.run(['ps', '-o', 'pid,args']);
    t.is(ps.exitCode, 0, ps.stderr);
    const rows = psRows(ps.stdout);
    t.is(rows.length, 2, ps.stdout);
    t.deepEqual(rows[0], [1, '{init} lockstep-init']);
    t.regex(rows[1]![1], /ps -o pid,args$/);
    t.false(ps.stdout.includes(marker));

    // /proc itself: the numeric entries are the init and this shell (the glob
    // is expanded before the loop forks anything), nothing of the host.
    const proc = await sb.commands.run([
      'sh',
      '-c',
      'for p in /proc/[0-9]*; do echo "${p#/proc/} $(tr "\\0" " " < $p/cmdline)"; done',
    ]);
    t.is(proc.exitCode, 0, proc.stderr);
    const entries = proc.stdout.trim().split('\n');
    t.is(entries.length, 2, proc.stdout);
    t.is(entries[0], '1 lockstep-init ');
    t.regex(entries[1]!, /^\d+ sh -c for p in/);
    t.false(proc.stdout.includes(marker));
    t.false(entries.some((e) => e.startsWith(`${child.pid} `)));
  });

  test.serial(
    'host files outside the sandbox root are not visible, and /proc/1/root is the sandbox root',
    async (t) => {
      const ls = await openTestLockstep(t);
      const name = `lockstep-marker-${randomBytes(6).toString('hex')}`;
      const markers = [path.join('/tmp', name), path.join('/root', name)];
      for (const m of markers) {
        fs.writeFileSync(m, 'host secret\n');
        t.teardown(() => fs.rmSync(m, { force: true }));
      }
      const sb = await ls.create();
      await sb.files.write('/workspace/own-file', 'sandbox data\n');

      for (const m of markers) {
        const r = await sb.commands.run(['cat', m]);
        t.not(r.exitCode, 0, `${m} must not exist inside`);
        t.is(r.stdout, '');
        t.false(await sb.files.exists(m));
      }
      const listing = await sb.commands.run([
        'sh',
        '-c',
        `ls -a /tmp /root; find / -xdev -name '${name}*' 2>/dev/null; echo end`,
      ]);
      t.false(listing.stdout.includes(name));
      t.true(listing.stdout.endsWith('end\n'));

      // The host's state directory and the sandbox's own host path do not exist inside.
      const hostPaths = await sb.commands.run([
        'sh',
        '-c',
        `test -e '${ls.home}' && echo home; test -e '${ls.engine.paths.sandboxRoot(sb.id)}' && echo root; echo done`,
      ]);
      t.is(hostPaths.stdout, 'done\n');

      const root = await sb.commands.run([
        'sh',
        '-c',
        `tr '\\0' ' ' </proc/1/cmdline; echo; cat /proc/1/root/workspace/own-file; test -e /proc/1/root/tmp/${name} || echo no-marker`,
      ]);
      t.is(root.stdout, 'lockstep-init \nsandbox data\nno-marker\n');
    },
  );

  test.serial('no host network: only lo, and a host TCP server is unreachable', async (t) => {
    const ls = await openTestLockstep(t);
    const loopback = await countingServer(t, '127.0.0.1');
    const anyAddr = await countingServer(t, '0.0.0.0');
    t.is(
      await connectFromHost(loopback.port, '127.0.0.1'),
      'hello from the host\n',
      'control: reachable from the host',
    );
    t.is(loopback.accepted(), 1);
    const sb = await ls.create();

    const dev = await sb.commands.run(['cat', '/proc/net/dev']);
    const interfaces = dev.stdout
      .split('\n')
      .slice(2)
      .filter(Boolean)
      .map((l) => l.split(':')[0]!.trim());
    t.deepEqual(interfaces, ['lo']);

    const viaLoopback = await sb.commands.run([
      'sh',
      '-c',
      `nc -w 2 127.0.0.1 ${loopback.port} </dev/null; echo rc=$?`,
    ]);
    t.regex(viaLoopback.stdout, /rc=[1-9]/);
    t.regex(viaLoopback.stderr, /Connection refused/);
    t.is(loopback.accepted(), 1, 'the host server saw no connection from the sandbox');

    const external = Object.values(os.networkInterfaces())
      .flat()
      .filter((a) => a && a.family === 'IPv4' && !a.internal)
      .map((a) => a!.address);
    for (const addr of external) {
      const r = await sb.commands.run(['sh', '-c', `nc -w 2 ${addr} ${anyAddr.port} </dev/null; echo rc=$?`]);
      t.regex(r.stdout, /rc=[1-9]/, addr);
      t.regex(r.stderr, /Network is unreachable|Connection refused/, addr);
    }
    t.is(anyAddr.accepted(), 0);

    // Control: nc works inside, against a server inside the sandbox on the same port.
    const inside = await sb.commands.run([
      'sh',
      '-c',
      // The listener is restarted after each connection: a client whose stdin (/dev/null) ends before the
      // greeting arrives exits with nothing read (busybox nc; seen once in CI), and then tries again.
      `(while :; do echo hello-from-inside | nc -l -p ${loopback.port}; done &); i=0; while [ $i -lt 100 ]; do out=$(nc 127.0.0.1 ${loopback.port} </dev/null 2>/dev/null); [ -n "$out" ] && break; i=$((i+1)); sleep 0.1; done; echo "$out"`,
    ]);
    t.is(inside.stdout, 'hello-from-inside\n');
    t.is(loopback.accepted(), 1);
  });

  test.serial('the hostname is the sandbox’s own', async (t) => {
    const ls = await openTestLockstep(t);
    const hostHostname = os.hostname();
    const byDefault = await ls.create();
    t.is((await byDefault.commands.run(['hostname'])).stdout, `${byDefault.id.replace(/_/g, '-')}\n`);
    const named = await ls.create({ hostname: 'agent-box-7' });
    const r = await named.commands.run(['sh', '-c', 'hostname; cat /proc/sys/kernel/hostname']);
    t.is(r.stdout, 'agent-box-7\nagent-box-7\n');
    t.not(hostHostname, 'agent-box-7');
    t.is(os.hostname(), hostHostname, 'the host keeps its name');
  });

  test.serial('two sandboxes see neither each other’s processes nor each other’s files', async (t) => {
    const ls = await openTestLockstep(t);
    const a = await ls.create();
    const b = await ls.create();
    const tag = randomBytes(4).toString('hex');
    const uniq = `3000.${parseInt(tag, 16)}`;
    await a.commands.spawn(['sleep', uniq]);
    await a.files.write('/workspace/secret-a', `a-${tag}\n`);
    t.is((await a.commands.run(['sh', '-c', `echo tmp-${tag} > /tmp/secret-a-tmp`])).exitCode, 0);
    await b.commands.spawn(['sleep', '2000']);

    const psA = await a.commands.run(['ps', '-o', 'pid,args']);
    const psB = await b.commands.run(['ps', '-o', 'pid,args']);
    t.true(psA.stdout.includes(`sleep ${uniq}`), 'A sees its own sleep');
    t.false(psA.stdout.includes('sleep 2000'));
    t.true(psB.stdout.includes('sleep 2000'), 'B sees its own sleep');
    t.false(psB.stdout.includes(uniq));
    t.is(psRows(psB.stdout).length, 3, psB.stdout); // init, sleep, ps

    const cat = await b.commands.run(['cat', '/workspace/secret-a', '/tmp/secret-a-tmp']);
    t.not(cat.exitCode, 0);
    t.is(cat.stdout, '');
    const listing = await b.commands.run(['ls', '-a', '/workspace', '/tmp']);
    t.false(listing.stdout.includes('secret-a'), listing.stdout);
    t.false(await b.files.exists('/workspace/secret-a'));
    t.is((await a.files.read('/workspace/secret-a')).content.toString(), `a-${tag}\n`);
    // And the hosts' view: each root holds only its own file.
    t.true(fs.existsSync(path.join(ls.engine.paths.sandboxRoot(a.id), 'workspace/secret-a')));
    t.false(fs.existsSync(path.join(ls.engine.paths.sandboxRoot(b.id), 'workspace/secret-a')));
  });

  test.serial('capabilities are reduced: no CAP_SYS_ADMIN, mount and mknod fail', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    const status = (await sb.commands.run(['cat', '/proc/self/status'])).stdout;
    const capOf = (field: string) => BigInt('0x' + new RegExp(`^${field}:\\s*([0-9a-f]+)$`, 'm').exec(status)![1]);
    const CAP_SYS_ADMIN = 21n;
    const CAP_MKNOD = 27n;
    const CAP_SYS_MODULE = 16n;
    for (const field of ['CapBnd', 'CapEff', 'CapPrm']) {
      t.is((capOf(field) >> CAP_SYS_ADMIN) & 1n, 0n, `${field} lacks CAP_SYS_ADMIN`);
      t.is((capOf(field) >> CAP_MKNOD) & 1n, 0n, `${field} lacks CAP_MKNOD`);
      t.is((capOf(field) >> CAP_SYS_MODULE) & 1n, 0n, `${field} lacks CAP_SYS_MODULE`);
    }

    const mount = await sb.commands.run([
      'sh',
      '-c',
      'mkdir -p /mnt && mount -t tmpfs none /mnt; echo rc=$?; grep -c " /mnt " /proc/self/mounts',
    ]);
    t.regex(mount.stdout, /^rc=[1-9]\d*\n0\n$/);
    t.regex(mount.stderr, /permission denied|not permitted/i);

    const more = await sb.commands.run([
      'sh',
      '-c',
      'mknod /tmp/mem c 1 1; echo mknod=$?; unshare -m true; echo unshare=$?',
    ]);
    t.regex(more.stdout, /mknod=[1-9]/);
    t.regex(more.stdout, /unshare=[1-9]/);
  });

  // /proc/sys is host-wide for most entries (kernel.core_pattern would run a
  // program as host root): the sandbox sees it read-only, as under runc.
  test.serial('a sandbox cannot change host-wide kernel settings through /proc/sys', async (t) => {
    const ls = await openTestLockstep(t);
    const file = '/proc/sys/kernel/printk_ratelimit'; // harmless, and restored below
    const before = fs.readFileSync(file, 'utf8').trim();
    t.teardown(() => fs.writeFileSync(file, before));
    const sb = await ls.create();
    const changed = String(Number(before) + 1);
    const r = await sb.commands.run(['sh', '-c', `echo ${changed} > ${file}; echo rc=$?`]);
    t.is(fs.readFileSync(file, 'utf8').trim(), before, 'the host value must not change');
    t.regex(r.stdout, /rc=[1-9]/);
  });

  // A descriptor the manager inherited would be a path out of the sandbox
  // (/proc/self/fd/N/...): commands get none.
  test.serial('a command gets no file descriptor the manager inherited', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create();
    const hostDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-hostdir-'));
    t.teardown(() => fs.rmSync(hostDir, { recursive: true, force: true }));
    fs.writeFileSync(path.join(hostDir, 'marker'), 'host secret\n');
    // A second manager whose parent left fd 200 open on a host directory.
    const child = spawn(
      '/bin/bash',
      [
        '-c',
        'exec "$0" "$@" 200<"$DIR"',
        process.execPath,
        path.join(fixtures, 'run-in-sandbox.mjs'),
        ls.home,
        sb.id,
        'sh',
        '-c',
        'ls /proc/self/fd; cat /proc/self/fd/200/marker',
      ],
      {
        env: { ...process.env, DIR: hostDir },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.on('exit', resolve));
    t.is(code, 0);
    const line = out.split('\n').find((l) => l.startsWith('RESULT '));
    t.truthy(line, out);
    const r = JSON.parse(line!.slice('RESULT '.length)) as { stdout: string };
    t.false(r.stdout.includes('host secret'), 'the host file is readable through the inherited descriptor');
    const fds = r.stdout.split('\n').filter((l) => /^\d+$/.test(l));
    t.false(fds.includes('200'), `descriptors inside: ${fds.join(' ')}`);
  });
});
