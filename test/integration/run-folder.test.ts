/**
 * The sandboxes' run folder (`run/sandboxes`): a shared tmpfs in a new state
 * directory, where sandboxes and forks get working /dev nodes; a previous
 * boot's leftovers are removed before the tmpfs goes over them (nothing stays
 * hidden beneath); an earlier version's shared bind mount, with a live
 * sandbox below it, is kept and the sandbox still answers after a restart.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { Lockstep } from '../../src/index.js';
import { FS_MAGIC, native } from '../../src/native/binding.js';
import { StatePaths } from '../../src/paths.js';
import { mountPropagation } from '../../src/host/proc.js';
import { destroyHome, freshHome, integration } from '../helpers/harness.js';

integration(test, () => {
  test.serial('a new state directory gets a shared tmpfs; a sandbox and its fork use /dev from it', async (t) => {
    const home = freshHome('run-folder');
    t.teardown(() => destroyHome(home));
    const ls = await Lockstep.open({ home });
    t.teardown(() => ls.close());
    await ls.images.ensure('base');
    const dir = new StatePaths(home).sandboxesRun;
    t.is(native().filesystemType(dir), FS_MAGIC.tmpfs);
    t.is(mountPropagation(dir), 'shared');

    const sb = await ls.create({ image: 'base' });
    const ckpt = await sb.checkpoint();
    const [fork] = await sb.fork(ckpt.id);
    t.true(fork!.ok, JSON.stringify(fork));
    if (!fork!.ok) return;
    const child = ls.get(fork.id);
    for (const s of [sb, child]) {
      const r = await s.commands.run('head -c 5 /dev/zero | wc -c; echo gone > /dev/null && echo ok');
      t.is(r.stdout.replace(/ /g, ''), '5\nok\n', r.stderr);
    }
  });

  test.serial("a previous boot's leftovers are removed before the tmpfs is mounted over them", async (t) => {
    const home = freshHome('run-folder-leftovers');
    t.teardown(() => destroyHome(home));
    const dir = new StatePaths(home).sandboxesRun;
    // What a reboot leaves: an instance folder with a /dev folder and an empty root, nothing mounted.
    fs.mkdirSync(path.join(dir, 'sbx_oldboot', 'root'), { recursive: true, mode: 0o700 });
    fs.mkdirSync(path.join(dir, 'sbx_oldboot', 'dev'));
    fs.writeFileSync(path.join(dir, 'sbx_oldboot', 'dev', 'leftover'), 'x');

    const ls = await Lockstep.open({ home });
    t.is(native().filesystemType(dir), FS_MAGIC.tmpfs);
    t.deepEqual(fs.readdirSync(dir), []);
    await ls.close();
    // Beneath the tmpfs: empty too.
    native().unmount(dir, false);
    t.deepEqual(fs.readdirSync(dir), []);
  });

  test.serial(
    "an earlier version's bind-mounted run folder is kept, and its sandbox answers after a restart",
    async (t) => {
      const home = freshHome('run-folder-bind');
      t.teardown(() => destroyHome(home));
      const dir = new StatePaths(home).sandboxesRun;
      fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
      native().makeSharedMount(dir, true);
      const before = native().filesystemType(dir);
      t.not(before, FS_MAGIC.tmpfs);

      let ls = await Lockstep.open({ home });
      await ls.images.ensure('base');
      const sb = await ls.create({ image: 'base' });
      await sb.files.write('/workspace/kept', 'kept\n');
      await ls.close();

      ls = await Lockstep.open({ home });
      t.teardown(() => ls.close());
      t.is(native().filesystemType(dir), before, 'still the bind mount');
      const r = await ls.get(sb.id).commands.run(['cat', '/workspace/kept']);
      t.is(r.stdout, 'kept\n');
    },
  );
});
