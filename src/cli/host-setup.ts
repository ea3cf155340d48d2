/**
 * `lockstep setup`: everything a host needs before Lockstep.open() works,
 * in order, each step skipped when already done (a second run takes well
 * under 5 seconds):
 *  1. host packages and CRIU (scripts/provision-host.sh, shipped in the package);
 *  2. the native parts (scripts/install.js --required: the same build npm's
 *     install hook runs, which skips when CRIU or a compiler was missing then);
 *  3. the state directory and its layer store (opening a manager makes both);
 *  4. the images asked for, from the recipes in sandbox-images/.
 * `checkSetup` reports the same steps and changes nothing.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn } from 'node:child_process';
import Database from 'better-sqlite3';
import { assertSupportedPlatform, helperPath, initPath, native, projectRoot, relayPath } from '../native/binding.js';
import { HostError, InvalidArgumentError, SETUP_COMMAND } from '../errors.js';
import { StatePaths, resolveHome } from '../paths.js';
import { SCHEMA_VERSION } from '../catalog/migrations.js';
import { ImageStore, listRecipes, recipeHash, validateImageName } from '../images/image-store.js';
import { buildCacheDir } from '../config.js';
import { FS_MAGIC } from '../native/binding.js';
import { Lockstep } from '../api/lockstep.js';

/** What to set up. */
export interface SetupOptions {
  /** State directory (default: LOCKSTEP_HOME or /var/lib/lockstep). */
  home?: string | undefined;
  /** Images to build (recipes in sandbox-images/; default ["base"]). */
  images?: string[] | undefined;
  /**
   * Build the images into the build cache only, and leave the state directory alone
   * (the test suite's set-up: every test file makes its own).
   */
  cacheOnly?: boolean | undefined;
  /** One line per thing being done. */
  progress?: ((line: string) => void) | undefined;
}

/** One step of the set-up and whether it is done. */
export interface SetupStep {
  name: string;
  ok: boolean;
  detail: string;
  fix?: string;
}

const provisionScript = () => path.join(projectRoot, 'scripts', 'provision-host.sh');
const buildScript = () => path.join(projectRoot, 'scripts', 'install.js');

/** Runs a set-up script; its stderr lines go to progress (and are kept for the error). */
function runScript(
  cmd: string,
  args: string[],
  progress: (line: string) => void,
): Promise<{ code: number; lines: string[] }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: projectRoot, stdio: ['ignore', 'ignore', 'pipe'] });
    const lines: string[] = [];
    let partial = '';
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (d: string) => {
      const parts = (partial + d).split('\n');
      partial = parts.pop() ?? '';
      for (const l of parts) {
        lines.push(l);
        if (l.trim()) progress(l);
      }
    });
    child.on('error', reject);
    child.on('close', (code, signal) => {
      if (partial.trim()) {
        lines.push(partial);
        progress(partial);
      }
      resolve({ code: code ?? (signal ? 128 : 1), lines });
    });
  });
}

function normaliseImages(images: string[] | undefined): string[] {
  const list = (images ?? ['base']).map((s) => s.trim()).filter(Boolean);
  const recipes = listRecipes();
  for (const name of list) {
    validateImageName(name, '--images');
    if (!recipes.includes(name))
      throw new InvalidArgumentError('--images', `shipped recipes (${recipes.join(', ')})`, name);
  }
  return [...new Set(list)];
}

function nativeBuilt(): { ok: boolean; detail: string } {
  const missing = [helperPath, initPath, relayPath].filter((f) => !fs.existsSync(f));
  try {
    native();
  } catch (e) {
    return { ok: false, detail: (e as Error).message };
  }
  if (missing.length) return { ok: false, detail: `missing ${missing.join(', ')}` };
  return { ok: true, detail: `addon, helper and init built in ${path.join(projectRoot, 'build', 'Release')}` };
}

function isBtrfs(p: string): boolean {
  try {
    return native().filesystemType(p) === FS_MAGIC.btrfs;
  } catch {
    return false;
  }
}

/** The catalog's schema version and live images, read without changing the file. */
function readCatalog(file: string): { version: number; images: string[] } {
  const db = new Database(file, { readonly: true, fileMustExist: true });
  try {
    const version = db.pragma('user_version', { simple: true }) as number;
    const images = (db.prepare('SELECT name FROM images WHERE deleted = 0').all() as { name: string }[]).map(
      (r) => r.name,
    );
    return { version, images };
  } finally {
    db.close();
  }
}

/** Reports every step without changing anything; all ok means set up. */
export async function checkSetup(opts: SetupOptions = {}): Promise<SetupStep[]> {
  const steps: SetupStep[] = [];
  const fix = `run \`${SETUP_COMMAND}${opts.images ? ` --images ${opts.images.join(',')}` : ''}\` as root`;
  const add = (name: string, ok: boolean, detail: string) =>
    steps.push(ok ? { name, ok, detail } : { name, ok, detail, fix });
  try {
    assertSupportedPlatform();
    add('platform', true, `${process.platform}-${process.arch}, Node ${process.version}`);
  } catch (e) {
    add('platform', false, (e as Error).message);
    return steps;
  }
  const root = process.getuid?.() === 0;
  add(
    'root',
    root,
    root ? 'running as root' : `running as uid ${process.getuid?.()}: the state directory and the set-up need root`,
  );

  const provision = await runScript('bash', [provisionScript(), '--check'], () => undefined);
  add(
    'host packages',
    provision.code === 0,
    provision.code === 0
      ? 'host packages, CRIU 4.x and libcriu in /opt/lockstep'
      : provision.lines.filter(Boolean).join('; '),
  );

  const built = nativeBuilt();
  add('native build', built.ok, built.detail);

  const images = normaliseImages(opts.images);
  if (opts.cacheOnly) {
    for (const name of images) {
      const done = fs.existsSync(path.join(buildCacheDir(), 'images', `${name}-${recipeHash(name)}`, '.complete'));
      add(
        `image ${name}`,
        done,
        done ? `in the build cache ${buildCacheDir()}` : `not in the build cache ${buildCacheDir()}`,
      );
    }
    return steps;
  }

  const paths = new StatePaths(resolveHome(opts.home));
  let catalog: { version: number; images: string[] } | undefined;
  if (!root) add('state directory', false, `${paths.home}: not readable without root`);
  else if (!fs.existsSync(paths.catalog)) add('state directory', false, `${paths.home} has no catalog yet`);
  else {
    try {
      catalog = readCatalog(paths.catalog);
      const ok = catalog.version <= SCHEMA_VERSION;
      add(
        'state directory',
        ok,
        ok
          ? `${paths.home} (catalog schema ${catalog.version}` +
              (catalog.version < SCHEMA_VERSION ? `, migrated to ${SCHEMA_VERSION} on open` : '') +
              ')'
          : `${paths.home}: catalog schema ${catalog.version} is newer than ${SCHEMA_VERSION}: upgrade Lockstep`,
      );
    } catch (e) {
      add('state directory', false, `${paths.catalog}: ${(e as Error).message}`);
    }
    const store = fs.existsSync(paths.storeImage) || isBtrfs(paths.home);
    add(
      'layer store',
      store,
      store
        ? fs.existsSync(paths.storeImage)
          ? `btrfs image ${paths.storeImage}`
          : `${paths.home} is on btrfs`
        : `no ${paths.storeImage} and ${paths.home} is not on btrfs`,
    );
  }
  for (const name of images) {
    const ok = catalog?.images.includes(name) ?? false;
    add(`image ${name}`, ok, ok ? `built in ${paths.home}` : `not built in ${paths.home}`);
  }
  return steps;
}

/** Sets the host up (idempotent); throws a LockstepError naming the step that failed. */
export async function runSetup(opts: SetupOptions = {}): Promise<SetupStep[]> {
  const progress = opts.progress ?? (() => undefined);
  const steps: SetupStep[] = [];
  const timed = async (name: string, fn: () => Promise<string>) => {
    const started = Date.now();
    progress(`${name}...`);
    const detail = await fn();
    steps.push({ name, ok: true, detail });
    progress(`${name}: ${detail} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
  };

  assertSupportedPlatform();
  if (process.getuid?.() !== 0)
    throw new HostError('NOT_ROOT', `${SETUP_COMMAND} installs host packages and manages mounts: run it as root`);
  const images = normaliseImages(opts.images);

  await timed('host packages', async () => {
    const r = await runScript('bash', [provisionScript()], (l) => progress(`  ${l}`));
    if (r.code !== 0)
      throw new HostError(
        'HOST_PROVISIONING_FAILED',
        `scripts/provision-host.sh failed (exit ${r.code}): ${r.lines.filter(Boolean).slice(-5).join('; ')}`,
      );
    return 'host packages, CRIU 4.x and libcriu in /opt/lockstep';
  });

  await timed('native build', async () => {
    const r = await runScript(process.execPath, [buildScript(), '--required'], (l) => progress(`  ${l}`));
    if (r.code !== 0)
      throw new HostError(
        'NATIVE_BUILD_FAILED',
        `Building the native parts failed: ${r.lines.filter(Boolean).slice(-3).join('; ')}`,
      );
    const built = nativeBuilt();
    if (!built.ok)
      throw new HostError('NATIVE_BUILD_FAILED', `The native parts were built but do not load: ${built.detail}`);
    return built.detail;
  });

  if (opts.cacheOnly) {
    for (const name of images)
      await timed(
        `image ${name}`,
        async () =>
          `in the build cache: ${await ImageStore.cacheRecipe(
            name,
            { cacheDir: buildCacheDir(), native: native() },
            (l) => progress(`  ${l}`),
          )}`,
      );
    return steps;
  }

  // Opening a manager creates the state directory, migrates its catalog and
  // mounts the layer store (it also starts the directory's supervisor, as
  // the first use would).
  let ls: Lockstep | undefined;
  await timed('state directory', async () => {
    ls = await Lockstep.open({ home: opts.home });
    const paths = new StatePaths(ls.home);
    return (
      `${ls.home}, layer store ` +
      `${fs.existsSync(paths.storeImage) ? paths.storeImage : "on the directory's own btrfs"}`
    );
  });
  try {
    for (const name of images) {
      await timed(`image ${name}`, async () => {
        const row = await ls!.images.ensure(name, (l: string) => progress(`  ${l}`));
        return `${row.source}, ${(row.size_bytes / 1e6).toFixed(1)} MB`;
      });
    }
  } finally {
    await ls?.close();
  }
  return steps;
}
