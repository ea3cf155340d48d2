/**
 * Cleanup: `remove` leaves nothing behind (mounts, cgroups, processes,
 * layers, process images, catalog rows), and after a manager crash the next
 * manager's reaper finishes or undoes what was in flight and removes orphans,
 * while the sandboxes the crashed manager made keep running.
 */
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test, { type ExecutionContext } from 'ava';
import Database from 'better-sqlite3';
import { Lockstep } from '../../src/index.js';
import { eventually, integration, openTestLockstep } from '../helpers/harness.js';
import {
  cgroupDirsOf,
  hostState,
  listDir,
  mountPointsUnder,
  sameProcessAlive,
  sandboxPids,
  startTicks,
  type HostState,
} from '../fixtures/host-state.js';

const fixtures = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../test/fixtures');
/** A running sandbox's mounts: its root and, with a user namespace, the idmapped views of its two lower layers. */
function sandboxMounts(ls: Lockstep, id: string): string[] {
  const row = ls.engine.catalog.sandbox(id)!;
  const lowers =
    row.id_base === null ? [] : ['0', '1'].map((i) => path.join(ls.engine.paths.sandboxLowers(row.instance), i));
  return [...lowers, ls.engine.paths.sandboxRoot(row.instance)];
}

const EMPTY: HostState = {
  catalogRows: [],
  runFolders: [],
  mounts: [],
  cgroups: [],
  uppers: [],
  layers: [],
  processImages: [],
  scratch: [],
};

/** A manager in a child process (test/fixtures/crash-manager.mjs). */
function startManager(
  t: ExecutionContext,
  home: string,
  mode: 'hang' | 'checkpoint' | 'create',
  env: Record<string, string> = {},
) {
  const child = spawn(process.execPath, [path.join(fixtures, 'crash-manager.mjs'), home, mode], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  t.teardown(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  /** The first stdout line starting with `prefix`, or a rejection if the child exits first. */
  const line = (prefix: string): Promise<string> =>
    Promise.race<string>([
      eventually(() => stdout.split('\n').find((l) => l.startsWith(prefix)), 60_000, 10) as Promise<string>,
      exited.then(({ code, signal }) => {
        const found = stdout.split('\n').find((l) => l.startsWith(prefix));
        if (found) return found;
        throw new Error(`manager (${mode}) exited (${code ?? signal}) before printing ${prefix}\n${stdout}\n${stderr}`);
      }),
    ]);
  return { child, exited, line, stdout: () => stdout };
}

const readyId = (line: string) => (JSON.parse(line.slice('READY '.length)) as { id: string }).id;

function counterOf(ls: Lockstep, id: string): number {
  return Number(fs.readFileSync(path.join(ls.engine.paths.sandboxRoot(id), 'workspace/counter'), 'utf8').trim() || 0);
}

integration(test, () => {
  test.serial('remove leaves no mount, cgroup, process, layer, process image or catalog row', async (t) => {
    const ls = await openTestLockstep(t);
    t.deepEqual(hostState(ls), EMPTY);
    const sb = await ls.create();
    const id = sb.id;
    await sb.commands.spawn(['sleep', '1000']);
    const ckpt = await sb.checkpoint({ label: 'before remove' });

    // What it had while it lived.
    const run = ls.engine.paths.sandboxRun(id);
    const pids = sandboxPids(ls, id);
    const procs = pids.map((pid) => [pid, startTicks(pid)] as const);
    t.is(pids.length, 2, 'init and sleep');
    t.true(pids.includes(sb.info().pid!));
    t.deepEqual(mountPointsUnder(run), sandboxMounts(ls, id));
    t.true(cgroupDirsOf(ls, id).every((d) => fs.existsSync(d)));
    t.true(fs.existsSync(ls.engine.paths.upper(id)));
    t.true(fs.existsSync(ls.engine.paths.layer(ckpt.layerId)));
    t.true(fs.existsSync(ls.engine.paths.processImage(ckpt.id)));

    await ls.remove(id);

    t.deepEqual(mountPointsUnder(run), []);
    t.false(fs.existsSync(run));
    for (const dir of cgroupDirsOf(ls, id)) t.false(fs.existsSync(dir), dir);
    for (const [pid, start] of procs) t.false(sameProcessAlive(pid, start), `process ${pid} is gone`);
    t.false(fs.existsSync(ls.engine.paths.upper(id)), 'writable layer subvolume');
    t.false(fs.existsSync(ls.engine.paths.layer(ckpt.layerId)), 'checkpoint layer');
    t.false(fs.existsSync(ls.engine.paths.processImage(ckpt.id)), 'process image');
    t.is(ls.engine.catalog.sandbox(id), undefined);
    t.deepEqual(ls.engine.catalog.checkpointsOf(id), []);
    t.deepEqual(ls.engine.catalog.layerIds('upper'), []);
    t.deepEqual(ls.engine.catalog.layerIds('checkpoint'), []);
    t.throws(() => ls.get(id), { code: 'SANDBOX_NOT_FOUND' });
    t.deepEqual(hostState(ls), EMPTY);
  });

  test.serial(
    'after managers are killed mid-way, the reaper thaws, finishes and cleans up; sandboxes outlive their manager',
    async (t) => {
      const first = await openTestLockstep(t);
      const home = first.home;
      const paths = first.engine.paths;
      const cgroups = first.engine.cgroups;
      const runtime = first.engine.runtime;
      // `first` stays open while the children run: a manager that opens a state
      // directory another manager holds does not reap, so all that the crashed
      // managers leave is still there for the reaper of the manager opened last.

      // A: a manager creates a sandbox with a background process, then is SIGKILLed.
      const mA = startManager(t, home, 'hang');
      const a = readyId(await mA.line('READY '));
      mA.child.kill('SIGKILL');
      t.is((await mA.exited).signal, 'SIGKILL');

      // B: a manager kills itself in the middle of a checkpoint, with the sandbox frozen.
      const mB = startManager(t, home, 'checkpoint', { LOCKSTEP_FAULT: 'checkpoint:frozen' });
      const b = readyId(await mB.line('READY '));
      t.deepEqual(await mB.exited, { code: null, signal: 'SIGKILL' });
      t.false(mB.stdout().includes('CHECKPOINTED'));
      t.true(cgroups.isFrozen(runtime.cgroupName(b)), 'B was left frozen');
      t.is(listDir(paths.processImages).length, 1, 'a half-made process image was left behind');
      const journal = new Database(paths.catalog, { readonly: true });
      const ops = journal.prepare('SELECT kind, sandbox_id AS sandboxId FROM operations').all();
      const states = journal.prepare('SELECT id, state FROM sandboxes ORDER BY created_at').all();
      journal.close();
      t.deepEqual(ops, [{ kind: 'checkpoint', sandboxId: b }]);
      t.deepEqual(states, [
        { id: a, state: 'running' },
        { id: b, state: 'running' },
      ]);

      // C: a manager is killed in the middle of a create. The supervisor is
      // stopped, so the create cannot get past starting the init; once C's root
      // is mounted, the manager is killed there.
      const supervisor = Number(fs.readFileSync(paths.supervisorPidfile, 'utf8').trim());
      process.kill(supervisor, 'SIGSTOP');
      t.teardown(() => {
        try {
          process.kill(supervisor, 'SIGCONT');
        } catch {
          /* gone */
        }
      });
      const mC = startManager(t, home, 'create');
      await mC.line('CREATING');
      const c: string = (await eventually(
        () =>
          listDir(paths.sandboxesRun).find(
            (id) => id !== a && id !== b && mountPointsUnder(paths.sandboxRoot(id)).length > 0,
          ),
        30_000,
      ))!;
      mC.child.kill('SIGKILL');
      t.is((await mC.exited).signal, 'SIGKILL');
      t.true(fs.existsSync(paths.upper(c)));
      t.true(cgroupDirsOf(first, c).every((d) => fs.existsSync(d)));

      // The last manager goes; a new one opens the state directory and reaps.
      await first.close();
      const ls = await Lockstep.open({ home });
      t.teardown(() => ls.close());
      process.kill(supervisor, 'SIGCONT');
      t.deepEqual(ls.reaped, { operations: [`checkpoint:started:${b}`], checkpoints: [], sandboxes: [c], orphans: [] });

      // B is thawed, still runs, and the checkpoint that never committed left nothing.
      t.false(cgroups.isFrozen(runtime.cgroupName(b)));
      const bNow = counterOf(ls, b);
      await eventually(() => counterOf(ls, b) > bNow, 10_000);
      const bExec = await ls.get(b).commands.run(['sh', '-c', 'echo b-answers']);
      t.is(bExec.stdout, 'b-answers\n');
      t.deepEqual(ls.get(b).checkpoints(), []);
      t.deepEqual(listDir(paths.processImages), []);
      t.deepEqual(listDir(paths.layers), []);

      // A outlived its manager: listed, running, its init and background process alive.
      const infoA = ls.get(a).info();
      t.is(infoA.state, 'running');
      t.true(sameProcessAlive(infoA.pid!, ls.engine.catalog.sandbox(a)!.init_start));
      const aNow = counterOf(ls, a);
      await eventually(() => counterOf(ls, a) > aNow, 10_000);
      t.is((await ls.get(a).commands.run(['cat', '/proc/1/cmdline'])).stdout, 'lockstep-init\0');
      t.deepEqual(
        ls
          .list()
          .map((s) => s.id)
          .sort(),
        [a, b].sort(),
      );

      // C is gone entirely.
      t.is(ls.engine.catalog.sandbox(c), undefined);
      t.throws(() => ls.get(c), { code: 'SANDBOX_NOT_FOUND' });
      t.deepEqual(mountPointsUnder(paths.sandboxRun(c)), []);
      t.false(fs.existsSync(paths.sandboxRun(c)));
      t.false(fs.existsSync(paths.upper(c)));
      for (const dir of cgroupDirsOf(ls, c)) t.false(fs.existsSync(dir), dir);

      // Removing the survivors leaves nothing.
      await ls.remove(a);
      await ls.remove(b);
      t.deepEqual(hostState(ls), EMPTY);
    },
  );

  test.serial('orphans planted as a crashed manager would leave them are reaped on open', async (t) => {
    const first = await openTestLockstep(t);
    const home = first.home;
    const { paths, runtime, layers, cgroups } = first.engine;
    const keep = await first.create(); // a healthy sandbox must survive the reaper
    const tag = () => randomBytes(6).toString('hex');

    // A half-made sandbox with no catalog row: run folder, cgroup, writable layer, mounted root.
    const halfMade = `sbx_orphan${tag()}`;
    runtime.prepare(halfMade, { pids: 16 });
    await layers.createUpper(halfMade);
    await runtime.mountRoot({
      id: halfMade,
      imageRootfs: first.images.get('base').rootfs,
      runtimeLayer: runtime.ensureRuntimeLayer(),
      hostname: 'orphan',
    });
    // Pieces on their own.
    const upperOnly = `sbx_upper${tag()}`;
    await layers.createUpper(upperOnly);
    const cgroupOnly = `sbx_cgroup${tag()}`;
    cgroups.create(runtime.cgroupName(cgroupOnly), { pids: 8 });
    const layerId = `lyr_orphan${tag()}`;
    const donor = `sbx_donor${tag()}`;
    await layers.createUpper(donor);
    await layers.snapshotUpper(donor, layerId);
    await layers.deleteUpper(donor);
    const ckptId = `ckpt_orphan${tag()}`;
    fs.mkdirSync(paths.processImage(ckptId));
    fs.writeFileSync(path.join(paths.processImage(ckptId), 'pages-1.img'), randomBytes(4096));
    const tmpImage = '.tmp-x-123';
    fs.mkdirSync(path.join(paths.images, tmpImage, 'rootfs/bin'), { recursive: true });
    fs.writeFileSync(path.join(paths.images, tmpImage, 'rootfs/bin/half-copied'), 'x');
    fs.mkdirSync(path.join(paths.scratch, `op_${tag()}`));
    await first.close();

    const ls = await Lockstep.open({ home });
    t.teardown(() => ls.close());
    t.deepEqual(ls.reaped!.operations, []);
    t.deepEqual(ls.reaped!.sandboxes, []);
    t.deepEqual(
      [...ls.reaped!.orphans].sort(),
      [
        `run:${halfMade}`,
        `upper:${upperOnly}`,
        `cgroup:${cgroupOnly}`,
        `layer:${layerId}`,
        `process-image:${ckptId}`,
        `image-tmp:${tmpImage}`,
      ].sort(),
    );

    // All of it is gone from the host.
    t.deepEqual(mountPointsUnder(paths.sandboxRun(halfMade)), []);
    for (const id of [halfMade, cgroupOnly]) for (const dir of cgroupDirsOf(ls, id)) t.false(fs.existsSync(dir), dir);
    t.deepEqual(hostState(ls), {
      ...EMPTY,
      catalogRows: [`${keep.id}:running`],
      runFolders: [keep.id],
      mounts: sandboxMounts(ls, keep.id),
      cgroups:
        ls.engine.cgroups.version === 2
          ? [`unified:${keep.id}`]
          : ['freezer', 'memory', 'pids'].map((c) => `${c}:${keep.id}`),
      uppers: [keep.id],
    });
    t.deepEqual(listDir(paths.images), ['base']);

    // The healthy sandbox was left alone.
    t.is((await ls.get(keep.id).commands.run(['echo', 'kept'])).stdout, 'kept\n');
  });
});
