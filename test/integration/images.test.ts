/**
 * Images: build from the recipe's build cache, list, remove (at once when
 * unused; hidden while a sandbox uses it and collected when the last one
 * goes), and a round trip through a real Docker engine (export, import back
 * under another name, run a sandbox from it).
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { createHash, randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import Docker from 'dockerode';
import tar from 'tar-fs';
import { recipeHash } from '../../src/images/image-store.js';
import { buildCacheDir } from '../../src/config.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { listDir } from '../fixtures/host-state.js';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const sha256File = (f: string) => createHash('sha256').update(fs.readFileSync(f)).digest('hex');

/** The engine, started by scripts/start-dockerd.sh when it is not running (idempotent). */
async function dockerEngine(): Promise<Docker> {
  execFileSync('bash', [path.join(repoRoot, 'scripts/start-dockerd.sh')], { stdio: ['ignore', 'ignore', 'pipe'] });
  const docker = new Docker({ socketPath: process.env.DOCKER_SOCKET ?? '/var/run/docker.sock' });
  await docker.ping();
  return docker;
}

async function removeDockerImage(docker: Docker, ref: string): Promise<void> {
  for (const c of await docker.listContainers({ all: true, filters: { ancestor: [ref] } }))
    await docker
      .getContainer(c.Id)
      .remove({ force: true })
      .catch(() => undefined);
  await docker
    .getImage(ref)
    .remove({ force: true })
    .catch(() => undefined);
}

function treeBytes(dir: string): number {
  let total = 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) total += treeBytes(p);
    else if (e.isFile()) total += fs.statSync(p).size;
  }
  return total;
}

integration(test, () => {
  test.serial('image build copies base from the build cache; ls lists it; a second build is refused', async (t) => {
    const ls = await openTestLockstep(t, { images: [] });
    t.deepEqual(ls.images.list(), []);

    const cached = path.join(buildCacheDir(), 'images', `base-${recipeHash('base')}`);
    t.true(fs.existsSync(path.join(cached, '.complete')), 'the build cache holds this recipe (setup built it)');
    const progress: string[] = [];
    const row = await ls.images.build('base', { progress: (m) => progress.push(m) });
    t.deepEqual(progress, ['copying base from the build cache']);
    t.is(row.name, 'base');
    t.is(row.source, `recipe:base@${recipeHash('base')}`);
    t.is(row.rootfs, ls.engine.paths.imageRootfs('base'));
    t.is(row.size_bytes, treeBytes(row.rootfs));
    t.true(row.size_bytes > 1_000_000, `${row.size_bytes} bytes`);
    t.is(sha256File(path.join(row.rootfs, 'bin/busybox')), sha256File(path.join(cached, 'rootfs/bin/busybox')));
    t.deepEqual(listDir(row.rootfs), listDir(path.join(cached, 'rootfs')));
    t.deepEqual(listDir(ls.engine.paths.images), ['base'], 'no temporary folder left');

    t.deepEqual(
      ls.images.list().map((r) => [r.name, r.source, r.size_bytes]),
      [['base', row.source, row.size_bytes]],
    );
    await t.throwsAsync(ls.images.build('base'), { code: 'IMAGE_EXISTS' });
    await t.throwsAsync(ls.images.build('no-such-recipe'), { code: 'IMAGE_NOT_FOUND' });
    await t.throwsAsync(ls.images.build('../base'), { code: 'INVALID_ARGUMENT' });
    const forced = await ls.images.build('base', { force: true });
    t.is(forced.size_bytes, row.size_bytes);

    const sb = await ls.create({ image: 'base' });
    t.is((await sb.commands.run(['busybox', 'echo', 'built'])).stdout, 'built\n');
    t.is(sb.info().image, 'base');
  });

  test.serial(
    'image rm: removed at once when unused; hidden while a sandbox uses it, collected when that sandbox goes',
    async (t) => {
      const ls = await openTestLockstep(t);
      const dir = ls.engine.paths.image('base');
      t.deepEqual(ls.images.remove('base'), { removed: true, pending: false });
      t.false(fs.existsSync(dir));
      t.deepEqual(ls.images.list(), []);
      t.throws(() => ls.images.get('base'), { code: 'IMAGE_NOT_FOUND' });
      t.throws(() => ls.images.remove('base'), { code: 'IMAGE_NOT_FOUND' });

      await ls.images.build('base');
      const sb = await ls.create();
      t.deepEqual(ls.images.remove('base'), { removed: false, pending: true });
      // Hidden: not listed, not usable for new sandboxes, not removable twice...
      t.deepEqual(ls.images.list(), []);
      t.throws(() => ls.images.get('base'), { code: 'IMAGE_NOT_FOUND' });
      await t.throwsAsync(ls.create({ image: 'base' }), { code: 'IMAGE_NOT_FOUND' });
      t.throws(() => ls.images.remove('base'), { code: 'IMAGE_NOT_FOUND' });
      // ...but still there for the sandbox that uses it.
      t.true(fs.existsSync(path.join(dir, 'rootfs/bin/busybox')));
      t.deepEqual(
        ls.engine.catalog.allImages().map((r) => [r.name, r.deleted]),
        [['base', 1]],
      );
      t.is((await sb.commands.run(['sh', '-c', 'head -n 1 /etc/passwd'])).stdout, 'root:x:0:0:root:/root:/bin/sh\n');

      await ls.remove(sb.id);
      t.false(fs.existsSync(dir), 'collected with its last sandbox');
      t.deepEqual(ls.engine.catalog.allImages(), []);
      t.deepEqual(listDir(ls.engine.paths.images), []);

      await ls.images.build('base');
      t.deepEqual(
        ls.images.list().map((r) => r.name),
        ['base'],
      );
    },
  );

  test.serial('export to a real Docker engine: the image exists there with the same files', async (t) => {
    const docker = await dockerEngine();
    const ls = await openTestLockstep(t);
    const ref = `lockstep-test-${randomBytes(5).toString('hex')}:v1`;
    t.teardown(() => removeDockerImage(docker, ref));

    await ls.images.exportToDocker('base', ref);
    const info = await docker.getImage(ref).inspect();
    t.true(info.RepoTags.includes(ref), JSON.stringify(info.RepoTags));
    t.is(info.Os, 'linux');
    t.true(info.Size > 1_000_000, `${info.Size} bytes`);

    // Read files back out of the Docker image (a created, never started container).
    const container = await docker.createContainer({
      Image: ref,
      Cmd: ['/bin/true'],
      Labels: { 'dev.lockstep.test': ref },
    });
    const out = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-docker-archive-'));
    t.teardown(async () => {
      await container.remove({ force: true }).catch(() => undefined);
      fs.rmSync(out, { recursive: true, force: true });
    });
    const base = ls.images.get('base');
    for (const f of ['bin/busybox', 'etc/passwd', 'etc/group']) {
      const archive = (await container.getArchive({ path: `/${f}` })) as unknown as NodeJS.ReadableStream;
      await pipeline(archive, tar.extract(path.join(out, path.dirname(f))));
      t.is(sha256File(path.join(out, f)), sha256File(path.join(base.rootfs, f)), f);
    }
    t.is(fs.readlinkSync(path.join(base.rootfs, 'bin/sh')), 'busybox');
    await t.throwsAsync(ls.images.exportToDocker('no-such-image', ref), { code: 'IMAGE_NOT_FOUND' });
  });

  // Every `docker export` holds absolute symlinks (etc/mtab -> /proc/mounts):
  // the import creates them after extraction, below the image root.
  test.serial('import from a real Docker engine under another name, then run a sandbox from it', async (t) => {
    const docker = await dockerEngine();
    const ls = await openTestLockstep(t);
    const suffix = randomBytes(5).toString('hex');
    const ref = `lockstep-test-${suffix}:v1`;
    const imported = `imported-${suffix}`;
    t.teardown(() => removeDockerImage(docker, ref));
    await ls.images.exportToDocker('base', ref);
    const base = ls.images.get('base');

    // Failures leave nothing behind.
    await t.throwsAsync(ls.images.importFromDocker(`lockstep-test-missing-${suffix}:v1`, `missing-${suffix}`), {
      code: 'DOCKER_IMAGE_NOT_FOUND',
    });
    t.deepEqual(listDir(ls.engine.paths.images), ['base']);

    const row = await ls.images.importFromDocker(ref, imported);
    t.is(row.name, imported);
    t.is(row.source, `docker:${ref}`);
    for (const f of ['bin/busybox', 'etc/passwd', 'etc/group'])
      t.is(sha256File(path.join(row.rootfs, f)), sha256File(path.join(base.rootfs, f)), f);
    t.is(fs.readlinkSync(path.join(row.rootfs, 'etc/mtab')), '/proc/mounts', 'absolute symlinks are kept as they are');
    t.deepEqual(
      ls.images
        .list()
        .map((r) => r.name)
        .sort(),
      ['base', imported].sort(),
    );
    // The container used to flatten the image is gone; no half-imported folder is left.
    t.deepEqual(await docker.listContainers({ all: true, filters: { label: [`dev.lockstep.import=${ref}`] } }), []);
    t.deepEqual(listDir(ls.engine.paths.images).sort(), ['base', imported].sort());
    await t.throwsAsync(ls.images.importFromDocker(ref, imported), { code: 'IMAGE_EXISTS' });

    const sb = await ls.create({ image: imported });
    const r = await sb.commands.run(['sh', '-c', 'echo from-docker; head -n 1 /etc/passwd; ls /workspace && echo ok']);
    t.is(r.exitCode, 0, r.stderr);
    t.is(r.stdout, 'from-docker\nroot:x:0:0:root:/root:/bin/sh\nok\n');
    t.is(sb.info().image, imported);

    await ls.remove(sb.id);
    t.deepEqual(ls.images.remove(imported), { removed: true, pending: false });
    t.deepEqual(listDir(ls.engine.paths.images), ['base']);
  });
});
