/**
 * Images: read-only root filesystems that sandboxes use as their lower
 * overlay layers, stored under <home>/images/<name>/rootfs. They are built
 * from the recipes in sandbox-images/ (Debian packages only, no registry),
 * or imported from and exported to a Docker engine.
 *
 * A built recipe is cached by the hash of its files under the build cache
 * (the config's cacheDir: LOCKSTEP_CACHE, default /var/cache/lockstep), so a second state directory
 * gets the image by a hard-link copy instead of a rebuild.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { projectRoot, type NativeBinding } from '../native/binding.js';
import {
  AlreadyExistsError,
  HostError,
  InvalidArgumentError,
  InvalidStateError,
  NotFoundError,
  SETUP_COMMAND,
} from '../errors.js';
import type { Catalog, ImageRow } from '../catalog/catalog.js';
import { resolveHome, type StatePaths } from '../paths.js';
import type { DockerPort } from '../host/docker.js';
import { IMAGE_NAME_MAX } from '../limits.js';

const execFileAsync = promisify(execFile);

export const IMAGE_NAME = new RegExp(`^[a-z0-9][a-z0-9._-]{0,${IMAGE_NAME_MAX - 1}}$`);
export const recipesDir = () => path.join(projectRoot, 'sandbox-images');

/** What the store uses of its manager: the build cache (LockstepConfig.cacheDir) and the addon's flock. */
export interface ImageStoreHost {
  cacheDir: string;
  native: Pick<NativeBinding, 'flock'>;
}

/** Rejects names that could escape the images folder or confuse a shell. */
export function validateImageName(name: unknown, field = 'image'): string {
  if (typeof name !== 'string' || !IMAGE_NAME.test(name) || name.includes('..')) {
    throw new InvalidArgumentError(
      field,
      `a name of 1-${IMAGE_NAME_MAX} characters from a-z, 0-9, ".", "_" and "-" (no "/" or "..")`,
      name,
    );
  }
  return name;
}

/** Recipes available in sandbox-images/ (folders with a build.sh). */
export function listRecipes(): string[] {
  try {
    return fs
      .readdirSync(recipesDir(), { withFileTypes: true })
      .filter((d) => d.isDirectory() && fs.existsSync(path.join(recipesDir(), d.name, 'build.sh')))
      .map((d) => d.name)
      .sort();
  } catch {
    return [];
  }
}

/** Content hash of a recipe folder plus the shared lib.sh: the build cache key. */
export function recipeHash(name: string): string {
  const h = createHash('sha256');
  const dir = path.join(recipesDir(), name);
  const files = fs.readdirSync(dir).sort();
  for (const f of files) {
    h.update(f);
    h.update(fs.readFileSync(path.join(dir, f)));
  }
  const lib = path.join(recipesDir(), 'lib.sh');
  if (fs.existsSync(lib)) h.update(fs.readFileSync(lib));
  return h.digest('hex').slice(0, 16);
}

function dirSize(dir: string): number {
  let total = 0;
  const walk = (d: string) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) total += fs.lstatSync(p).size;
    }
  };
  walk(dir);
  return total;
}

/**
 * IMAGE_NOT_FOUND for a name that is neither installed nor a shipped recipe:
 * it says what exists and the commands that make an image.
 */
function unknownImage(name: string, installed: string[] | undefined): NotFoundError {
  const recipes = listRecipes();
  const have =
    installed === undefined
      ? 'it is not a shipped recipe'
      : installed.length
        ? `installed here: ${installed.join(', ')}`
        : 'no image is installed here';
  const build = recipes.length
    ? `build a shipped recipe (${recipes.join(', ')}) with \`lockstep image build NAME\`, `
    : '';
  return new NotFoundError(
    'image',
    name,
    `${have} (\`lockstep image ls\`); ${build}or import one with \`lockstep image import docker:REF --name ${name}\``,
  );
}

export type ProgressFn = (message: string) => void;

/** A build or link of a recipe image in progress in this process, and who wants its progress. */
interface InFlight {
  done: Promise<ImageRow>;
  listeners: Set<ProgressFn>;
}

/** Image catalog + on-disk rootfs management. */
export class ImageStore {
  private readonly inFlight = new Map<string, InFlight>();

  constructor(
    private readonly paths: StatePaths,
    private readonly catalog: Catalog,
    private readonly docker: () => DockerPort,
    private readonly host: ImageStoreHost,
  ) {}

  list(): ImageRow[] {
    return this.catalog.images();
  }

  get(name: string): ImageRow {
    const row = this.catalog.image(validateImageName(name));
    if (row && !row.deleted) return row;
    // A shipped recipe that was never built into this state directory: that is set-up, not a typo.
    if (listRecipes().includes(name)) {
      const home = this.paths.home === resolveHome() ? '' : ` --home ${this.paths.home}`;
      throw new NotFoundError(
        'image',
        name,
        `it is a shipped recipe not built in ${this.paths.home} yet: ` +
          `run \`${SETUP_COMMAND} --images ${name}${home}\` as root (or \`lockstep image build ${name}\`)`,
      );
    }
    throw unknownImage(
      name,
      this.list().map((i) => i.name),
    );
  }

  has(name: string): boolean {
    const row = this.catalog.image(name);
    return !!row && !row.deleted;
  }

  /** Builds NAME from sandbox-images/NAME (or the build cache). */
  async build(name: string, opts: { progress?: ProgressFn; force?: boolean } = {}): Promise<ImageRow> {
    validateImageName(name);
    if (!listRecipes().includes(name))
      throw unknownImage(
        name,
        this.list().map((i) => i.name),
      );
    const progress = opts.progress ?? (() => undefined);
    return this.withImageLock(name, progress, () => {
      if (this.has(name) && !opts.force) throw new AlreadyExistsError('image', name);
      return this.buildLocked(name, progress);
    });
  }

  /**
   * The image NAME, made on first use when it is missing and a recipe of that
   * name ships in sandbox-images/: built into the build cache, or found
   * there, and linked into this state directory. Callers at the same time,
   * in this process or in others on the same state directory, make it once;
   * each gets the progress of the one build. IMAGE_NOT_FOUND (naming the
   * commands that make an image) for any other name.
   */
  async ensure(name: string, progress?: ProgressFn): Promise<ImageRow> {
    validateImageName(name);
    const ready = this.ready(name, true);
    if (ready) return ready;
    if (!listRecipes().includes(name))
      throw unknownImage(
        name,
        this.list().map((i) => i.name),
      );
    let job = this.inFlight.get(name);
    if (progress) job?.listeners.add(progress);
    if (!job) {
      // The listener goes in first: the build's first lines are told before its first await.
      const listeners = new Set<ProgressFn>(progress ? [progress] : []);
      const tell: ProgressFn = (m) => {
        for (const l of listeners) l(m);
      };
      const done = this.withImageLock(name, tell, () => this.ready(name, true) ?? this.buildLocked(name, tell)).finally(
        () => this.inFlight.delete(name),
      );
      job = { done, listeners };
      this.inFlight.set(name, job);
    }
    try {
      return await job.done;
    } finally {
      if (progress) job.listeners.delete(progress);
    }
  }

  /**
   * The image for a new sandbox, made on first use (ensure) unless it was
   * removed while sandboxes still use it: an operator's `image rm` is not
   * undone by a create; IMAGE_NOT_FOUND says how to take it back.
   */
  async forCreate(name: string, progress?: ProgressFn): Promise<ImageRow> {
    validateImageName(name);
    if (this.catalog.image(name)?.deleted) {
      const home = this.paths.home === resolveHome() ? '' : ` --home ${this.paths.home}`;
      throw new NotFoundError(
        'image',
        name,
        `it was removed (\`lockstep image rm ${name}\`) and waits for its last sandboxes to go; ` +
          `\`${SETUP_COMMAND} --images ${name}${home}\` takes it back`,
      );
    }
    return this.ensure(name, progress);
  }

  /**
   * The installed image; with takeBack, also one removed while still in use
   * (hidden, not yet collected), made visible again.
   */
  private ready(name: string, takeBack: boolean): ImageRow | undefined {
    const row = this.catalog.image(name);
    if (!row || (row.deleted && !takeBack)) return undefined;
    if (row.deleted) this.catalog.putImage({ ...row, deleted: 0 });
    return { ...row, deleted: 0 };
  }

  private async buildLocked(name: string, progress: ProgressFn): Promise<ImageRow> {
    const hash = recipeHash(name);
    const cached = await buildIntoCache(name, this.host, progress, hash);
    return this.install(name, `recipe:${name}@${hash}`, async (rootfs) => {
      progress(`copying ${name} from the build cache`);
      await copyTree(cached, rootfs);
    });
  }

  /**
   * Runs fn holding <run>/locks/image-NAME (flock), so that two processes on
   * one state directory never install the same image at once: the second
   * waits, then finds the first one's image. (The reaper, which runs only
   * when no other manager has the state directory open, removes the file.)
   */
  private async withImageLock<T>(name: string, progress: ProgressFn, fn: () => Promise<T> | T): Promise<T> {
    fs.mkdirSync(this.paths.locks, { recursive: true, mode: 0o700 });
    const fd = fs.openSync(
      path.join(this.paths.locks, `image-${name}`),
      fs.constants.O_RDWR | fs.constants.O_CREAT,
      0o600,
    );
    try {
      let announced = false;
      while (!this.host.native.flock(fd, true)) {
        if (!announced) progress(`waiting for another process making image ${name}`);
        announced = true;
        await new Promise((r) => setTimeout(r, 200));
      }
      return await fn();
    } finally {
      fs.closeSync(fd);
    }
  }

  /** Builds a recipe into the build cache only (used by setup); no state directory needed. */
  static async cacheRecipe(
    name: string,
    host: ImageStoreHost,
    progress: ProgressFn = () => undefined,
  ): Promise<string> {
    validateImageName(name);
    if (!listRecipes().includes(name)) throw unknownImage(name, undefined);
    return buildIntoCache(name, host, progress);
  }

  /** Imports a Docker image (docker:REF) as NAME. */
  async importFromDocker(ref: string, name: string, progress: ProgressFn = () => undefined): Promise<ImageRow> {
    validateImageName(name);
    if (this.has(name)) throw new AlreadyExistsError('image', name);
    progress(`importing docker:${ref}`);
    return this.install(name, `docker:${ref}`, (rootfs) => this.docker().extractImage(ref, rootfs));
  }

  /** Exports NAME to the Docker engine as REF. */
  async exportToDocker(name: string, ref: string): Promise<void> {
    const row = this.get(name);
    await this.docker().importDirectory(row.rootfs, ref);
  }

  /**
   * Removes an image. If sandboxes or checkpoints still use it, it is hidden
   * and collected when the last of them goes (reference counting).
   */
  remove(name: string): { removed: boolean; pending: boolean } {
    const row = this.get(name);
    if (this.catalog.imageReferences(name) > 0) {
      this.catalog.markImageDeleted(name);
      return { removed: false, pending: true };
    }
    this.catalog.deleteImageRow(name);
    fs.rmSync(path.dirname(row.rootfs), { recursive: true, force: true });
    return { removed: true, pending: false };
  }

  /** Deletes hidden images that nothing references any more. */
  collectGarbage(): string[] {
    const gone: string[] = [];
    for (const row of this.catalog.allImages()) {
      if (row.deleted && this.catalog.imageReferences(row.name) === 0) {
        this.catalog.deleteImageRow(row.name);
        fs.rmSync(path.dirname(row.rootfs), { recursive: true, force: true });
        gone.push(row.name);
      }
    }
    return gone;
  }

  /** Temp dir + fill + atomic rename + catalog row; nothing half-made survives a failure. */
  private async install(name: string, source: string, fill: (rootfs: string) => Promise<void>): Promise<ImageRow> {
    fs.mkdirSync(this.paths.images, { recursive: true, mode: 0o700 });
    const tmp = fs.mkdtempSync(path.join(this.paths.images, `.tmp-${name}-`));
    const rootfs = path.join(tmp, 'rootfs');
    fs.mkdirSync(rootfs, { mode: 0o755 });
    try {
      await fill(rootfs);
      const final = this.paths.image(name);
      if (fs.existsSync(final)) {
        if (this.catalog.imageReferences(name) > 0)
          throw new InvalidStateError('IMAGE_IN_USE', `Image ${name} is in use and cannot be replaced`);
        fs.rmSync(final, { recursive: true, force: true });
      }
      fs.renameSync(tmp, final);
      const row: ImageRow = {
        name,
        rootfs: this.paths.imageRootfs(name),
        source,
        size_bytes: dirSize(this.paths.imageRootfs(name)),
        created_at: Date.now(),
        deleted: 0,
      };
      this.catalog.putImage(row);
      return row;
    } catch (e) {
      fs.rmSync(tmp, { recursive: true, force: true });
      throw e;
    }
  }

  /** Names of image folders on disk (for the reaper: half-made .tmp-* ones are garbage). */
  onDisk(): string[] {
    try {
      return fs.readdirSync(this.paths.images);
    } catch {
      return [];
    }
  }
}

/** Hard-link copy when on one filesystem (images are never written), else a full copy. */
async function copyTree(from: string, to: string): Promise<void> {
  try {
    await execFileAsync('cp', ['-al', '--', `${from}/.`, to]);
  } catch {
    fs.rmSync(to, { recursive: true, force: true });
    fs.mkdirSync(to, { mode: 0o755 });
    await execFileAsync('cp', ['-a', '--', `${from}/.`, to]);
  }
}

/** Runs a recipe into the build cache keyed by the recipe's hash; a finished entry is reused. */
async function buildIntoCache(
  name: string,
  host: ImageStoreHost,
  progress: ProgressFn,
  hash = recipeHash(name),
): Promise<string> {
  const cacheRoot = path.join(host.cacheDir, 'images');
  const dir = path.join(cacheRoot, `${name}-${hash}`);
  if (fs.existsSync(path.join(dir, '.complete'))) return path.join(dir, 'rootfs');
  fs.mkdirSync(cacheRoot, { recursive: true, mode: 0o700 });
  // One build per recipe at a time, across processes (parallel test files,
  // a demo next to a test run): the others wait and then use its result.
  const lockFd = fs.openSync(path.join(cacheRoot, `.${name}.lock`), fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
  try {
    let announced = false;
    while (!host.native.flock(lockFd, true)) {
      if (!announced) progress(`waiting for another build of image ${name}`);
      announced = true;
      await new Promise((r) => setTimeout(r, 200));
    }
    if (fs.existsSync(path.join(dir, '.complete'))) return path.join(dir, 'rootfs');
    const tmp = fs.mkdtempSync(path.join(cacheRoot, `.build-${name}-`));
    try {
      const rootfs = path.join(tmp, 'rootfs');
      fs.mkdirSync(rootfs, { mode: 0o755 });
      progress(`building image ${name} from sandbox-images/${name}/build.sh (first time only)`);
      const child = execFile('bash', [path.join(recipesDir(), name, 'build.sh'), rootfs], {
        maxBuffer: 64 * 1024 * 1024,
      });
      child.stderr?.on('data', (d: Buffer) => {
        for (const line of String(d).split('\n')) if (line.trim()) progress(line.trim());
      });
      const code: number = await new Promise((resolve) => child.on('close', (c) => resolve(c ?? 1)));
      if (code !== 0) throw new HostError('IMAGE_BUILD_FAILED', `sandbox-images/${name}/build.sh exited with ${code}`);
      fs.writeFileSync(path.join(tmp, '.complete'), new Date().toISOString());
      fs.rmSync(dir, { recursive: true, force: true });
      fs.renameSync(tmp, dir);
      return path.join(dir, 'rootfs');
    } catch (e) {
      fs.rmSync(tmp, { recursive: true, force: true });
      throw e;
    }
  } finally {
    fs.closeSync(lockFd);
  }
}
