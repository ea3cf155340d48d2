/**
 * The Docker engine as a port: import a Docker image as a Lockstep image
 * (flattened root filesystem), export a Lockstep image to Docker. The real
 * adapter goes through dockerode and tar-fs; unit tests inject a fake.
 */
import Docker from 'dockerode';
import tar from 'tar-fs';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import fs from 'node:fs';
import path from 'node:path';
import { HostError, LockstepError } from '../errors.js';
import { native } from '../native/binding.js';
import { DEFAULTS, envValue } from '../config.js';

export interface DockerPort {
  ping(): Promise<boolean>;
  /** Writes the flattened root filesystem of image `ref` into `dir` (which exists and is empty). */
  extractImage(ref: string, dir: string): Promise<void>;
  /** Creates or replaces image `ref` from the root filesystem in `dir`. */
  importDirectory(dir: string, ref: string): Promise<void>;
}

/** Splits "repo:tag" (tag defaults to latest), keeping registry ports intact. */
export function splitReference(ref: string): { repo: string; tag: string } {
  const slash = ref.lastIndexOf('/');
  const colon = ref.lastIndexOf(':');
  if (colon > slash) return { repo: ref.slice(0, colon), tag: ref.slice(colon + 1) };
  return { repo: ref, tag: 'latest' };
}

/** Entries a sandbox image must never carry: device nodes, FIFOs and sockets. */
export function isUnsafeEntry(header: { type?: string | null }): boolean {
  return header.type === 'block-device' || header.type === 'character-device' || header.type === 'fifo';
}

/** dockerode-backed implementation. */
export class DockerEngine implements DockerPort {
  private readonly docker: Docker;
  constructor(options: Docker.DockerOptions = { socketPath: envValue('DOCKER_SOCKET') ?? DEFAULTS.dockerSocket }) {
    this.docker = new Docker(options);
  }

  async ping(): Promise<boolean> {
    try {
      await this.docker.ping();
      return true;
    } catch {
      return false;
    }
  }

  async extractImage(ref: string, dir: string): Promise<void> {
    try {
      await this.docker.getImage(ref).inspect();
    } catch (e) {
      throw new HostError('DOCKER_IMAGE_NOT_FOUND', `Docker has no image ${JSON.stringify(ref)}`, { cause: e });
    }
    // A created (never started) container gives the flattened filesystem.
    const container = await this.docker.createContainer({
      Image: ref,
      Cmd: ['/bin/true'],
      Labels: { 'dev.lockstep.import': ref },
    });
    try {
      const stream = (await container.export()) as unknown as Readable;
      // Symlinks are made last, as GNU tar does: while extracting, no path on
      // disk can lead outside `dir` through a link the archive planted
      // (tar-fs's own check rejects every absolute link, e.g. etc/mtab).
      const symlinks: { name: string; target: string }[] = [];
      const ignore = (_name: string, header?: { type?: string | null; name: string; linkname?: string | null }) => {
        if (!header) return false;
        if (header.type === 'symlink') {
          symlinks.push({ name: header.name, target: header.linkname ?? '' });
          return true;
        }
        return isUnsafeEntry(header);
      };
      await pipeline(stream, tar.extract(dir, { ignore: ignore as never }));
      for (const l of symlinks) createSymlinkBeneath(dir, l.name, l.target);
    } catch (e) {
      if (e instanceof LockstepError) throw e;
      throw new HostError('DOCKER_IMPORT_FAILED', `Cannot import docker:${ref}: ${(e as Error).message}`, { cause: e });
    } finally {
      await container.remove({ force: true }).catch(() => undefined);
    }
  }

  async importDirectory(dir: string, ref: string): Promise<void> {
    const { repo, tag } = splitReference(ref);
    const pack = tar.pack(dir);
    const stream = await this.docker.importImage(pack as unknown as NodeJS.ReadableStream, { repo, tag });
    // The engine reports progress as JSON lines; an error arrives in-band.
    await new Promise<void>((resolve, reject) => {
      this.docker.modem.followProgress(
        stream as NodeJS.ReadableStream,
        (err: Error | null, out: { error?: string }[]) => {
          const inband = out?.find((o) => o.error);
          if (err || inband)
            reject(
              new HostError('DOCKER_IMPORT_FAILED', `Docker could not import ${ref}: ${err?.message ?? inband?.error}`),
            );
          else resolve();
        },
      );
    });
  }
}

/**
 * Creates the symlink `name` -> `target` inside `root`, resolving the parent
 * directory with openat2(RESOLVE_BENEATH): a link earlier in the archive can
 * never redirect where a later one is created. Entries whose parent escapes
 * are skipped.
 */
export function createSymlinkBeneath(root: string, name: string, target: string): void {
  const rel = path.posix.normalize(name.replace(/^\.?\/+/, '')).replace(/\/+$/, '');
  if (!rel || rel === '.' || rel.startsWith('../')) return;
  const parent = path.posix.dirname(rel);
  const leaf = path.posix.basename(rel);
  let fd: number;
  try {
    fd = native().openBeneathSync(root, parent === '.' ? '' : parent, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
  } catch {
    return; // the parent is missing or leads outside: nothing to link
  }
  try {
    const at = `/proc/self/fd/${fd}/${leaf}`;
    fs.rmSync(at, { force: true });
    fs.symlinkSync(target, at);
  } finally {
    fs.closeSync(fd);
  }
}
