/**
 * Verb: export a snapshot as one bundle stream (format: bundle-format.ts).
 * Parts, in order:
 * - `layer`: `btrfs send` of the snapshot's read-only layer subvolume. The
 *   layer is the overlay's upper, so this is the filesystem as a delta
 *   against the image (whiteouts, xattrs, device nodes and owners kept);
 * - `image/<file>`: every file of the CRIU process image, flattened (an
 *   incremental image's pages are copied in from its parents, in a
 *   reflinked scratch copy, so the bundle needs no other image);
 * - `context`: the agent's context at the checkpoint (msgpack);
 * - `records`: the observations, verdicts and effects of its lineage that
 *   the snapshot holds (msgpack), so that a lineage-scoped effect replays
 *   wherever it is imported.
 * The header names the snapshot, its image's identity, the runtime layer
 * and the host facts a restore needs (host-identity.ts).
 *
 * The snapshot is verified (layer identity, every image file's SHA-256)
 * before the first byte goes out, and held (its lock) until the stream ends
 * or is destroyed, so its files cannot be deleted under a reader. Nothing
 * is buffered beyond one frame: memory does not grow with the bundle.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { pack } from 'msgpackr';
import { HostError, LockstepError, NotFoundError } from '../errors.js';
import { verifyCheckpoint } from '../checkpoints/integrity.js';
import { PARENT_LINK, flattenOnto, parentOf } from '../checkpoints/page-delta.js';
import { BundleWriter } from './bundle-format.js';
import { hostIdentity, type HostIdentity } from './host-identity.js';
import { SnapshotRows, asCheckpoint, type SnapshotRow, type SnapshotTemplate } from './snapshot-rows.js';
import { withSnapshotLock } from './snapshots.js';
import { hostSigningKey, signDigest } from './signing.js';
import { VERSION } from '../version.js';
import type { IntegrityDeps } from '../checkpoints/integrity.js';
import type { SnapshotsDeps } from './snapshots.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { Catalog } from '../catalog/catalog.js';
import type { Logger } from '../log.js';
import type { StatePaths } from '../paths.js';

/** What export.ts uses of the manager's services (api/engine.ts builds them). */
export interface ExportDeps extends IntegrityDeps, SnapshotsDeps {
  agent: AgentState;
  catalog: Catalog;
  log: Logger;
  paths: StatePaths;
}

export const BUNDLE_FORMAT = 'lockstep-snapshot-bundle';
export const BUNDLE_VERSION = 1;

/** The bundle's first frame. */
export interface BundleHeader {
  format: typeof BUNDLE_FORMAT;
  version: number;
  lockstepVersion: string;
  snapshot: {
    id: string;
    name: string | null;
    metadata: Record<string, string>;
    lineageId: string;
    ledgerCursor: number;
    sourceSandboxId: string | null;
    sourceCheckpointId: string | null;
    createdAt: number;
    sizeBytes: number;
  };
  template: SnapshotTemplate;
  image: { name: string; source: string };
  runtimeLayer: string;
  host: HostIdentity;
  layer: { format: 'btrfs-send' };
  /** The process image's files, in the order their parts come. */
  processImageFiles: string[];
}

/** The records of its lineage a snapshot holds, as the `records` part carries them. */
export interface BundleRecords {
  observations: Record<string, unknown>[];
  verdicts: Record<string, unknown>[];
  effects: Record<string, unknown>[];
}

export function snapshotRecords(engine: ExportDeps, snapshotId: string): BundleRecords {
  const db = engine.catalog.db;
  return {
    observations: db
      .prepare('SELECT * FROM agent_observations WHERE sandbox_id = ? ORDER BY seq')
      .all(snapshotId) as Record<string, unknown>[],
    verdicts: db.prepare('SELECT * FROM agent_verdicts WHERE sandbox_id = ? ORDER BY seq').all(snapshotId) as Record<
      string,
      unknown
    >[],
    effects: db
      .prepare(
        `SELECT * FROM agent_effects WHERE sandbox_id = ?
         UNION SELECT e.* FROM agent_effects e JOIN agent_effect_views v ON v.effect_id = e.id WHERE v.sandbox_id = ?
         ORDER BY seq`,
      )
      .all(snapshotId, snapshotId) as Record<string, unknown>[],
  };
}

/** A reflinked copy of an image folder with every parent's pages copied in; the caller removes it. */
async function flattenedCopy(engine: ExportDeps, source: string): Promise<string> {
  // A sibling of the images (flattenOnto finds parents next to the folder); the reaper removes leftovers.
  const dest = path.join(engine.paths.processImages, `.export-${randomBytes(6).toString('hex')}`);
  fs.mkdirSync(dest, { mode: 0o700 });
  try {
    for (const name of fs.readdirSync(source)) {
      const from = path.join(source, name);
      if (name === PARENT_LINK) fs.symlinkSync(fs.readlinkSync(from), path.join(dest, name));
      else fs.copyFileSync(from, path.join(dest, name), fs.constants.COPYFILE_FICLONE);
    }
    for (let p = parentOf(dest); p !== null; p = parentOf(dest)) await flattenOnto(dest, p);
    return dest;
  } catch (e) {
    fs.rmSync(dest, { recursive: true, force: true });
    throw e;
  }
}

/** Runs `btrfs send` of a read-only subvolume; its stdout is the stream. */
function btrfsSend(subvolume: string): { child: ChildProcess; done: Promise<void> } {
  const child = spawn('btrfs', ['send', '-q', subvolume], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (b: Buffer) => (stderr = (stderr + b.toString()).slice(-2000)));
  const done = new Promise<void>((resolve, reject) => {
    child.once('error', (e) =>
      reject(new HostError('BTRFS_UNAVAILABLE', `Cannot run btrfs send (btrfs-progs): ${e.message}`, { cause: e })),
    );
    child.once('close', (code, signal) => {
      if (code === 0) resolve();
      else
        reject(
          new HostError(
            'LAYER_STORE_FAILED',
            `btrfs send of ${subvolume} failed (${signal ?? code}): ${stderr.trim()}`,
          ),
        );
    });
  });
  done.catch(() => undefined); // awaited after the stream; never unhandled
  return { child, done };
}

/** An export that has been checked and holds its snapshot; `stream` yields the bundle. */
export interface OpenExport {
  snapshot: SnapshotRow;
  stream: Readable;
}

/**
 * Verifies and holds the snapshot, then returns the bundle stream. Errors
 * that can be known first (missing, busy, corrupt) are thrown here, before
 * any byte is sent; a failure later errors the stream.
 */
export async function openExport(engine: ExportDeps, ref: string, tenant?: string | null): Promise<OpenExport> {
  const rows = new SnapshotRows(engine.catalog.db);
  const first = rows.require(ref, tenant);
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  await new Promise<void>((resolve, reject) => {
    withSnapshotLock(engine, first.id, () => {
      resolve();
      return held;
    }).catch(reject);
  });
  let flat: string | null = null;
  let sender: ChildProcess | null = null;
  let closed = false;
  const cleanup = () => {
    if (closed) return;
    closed = true;
    if (sender && sender.exitCode === null) sender.kill('SIGKILL');
    if (flat) fs.rmSync(flat, { recursive: true, force: true });
    release();
  };
  try {
    const snap = rows.get(first.id);
    if (!snap) throw new NotFoundError('snapshot', ref);
    await verifyCheckpoint(engine, asCheckpoint(snap));
    const key = hostSigningKey(engine.paths.bundleSigningKey);
    let imageDir = engine.paths.processImage(snap.process_image);
    if (parentOf(imageDir) !== null) imageDir = flat = await flattenedCopy(engine, imageDir);
    const files = fs
      .readdirSync(imageDir)
      .filter((n) => n !== PARENT_LINK)
      .sort();
    const header: BundleHeader = {
      format: BUNDLE_FORMAT,
      version: BUNDLE_VERSION,
      lockstepVersion: VERSION,
      snapshot: {
        id: snap.id,
        name: snap.name,
        metadata: JSON.parse(snap.metadata) as Record<string, string>,
        lineageId: snap.lineage_id,
        ledgerCursor: snap.ledger_cursor,
        sourceSandboxId: snap.source_sandbox,
        sourceCheckpointId: snap.source_checkpoint,
        createdAt: snap.created_at,
        sizeBytes: snap.size_bytes,
      },
      template: JSON.parse(snap.template) as SnapshotTemplate,
      image: { name: snap.image, source: snap.image_source },
      runtimeLayer: snap.runtime_layer,
      host: hostIdentity(),
      layer: { format: 'btrfs-send' },
      processImageFiles: files,
    };
    const context = snap.context_id ? engine.agent.contexts.get(snap.context_id) : null;
    const records = snapshotRecords(engine, snap.id);
    const dir = imageDir;
    async function* generate(): AsyncGenerator<Buffer> {
      try {
        const w = new BundleWriter();
        yield w.header(header);
        const send = btrfsSend(engine.paths.layer(snap!.layer_id));
        sender = send.child;
        yield* w.part('layer', send.child.stdout! as AsyncIterable<Buffer>);
        await send.done;
        for (const name of files)
          yield* w.part(`image/${name}`, fs.createReadStream(path.join(dir, name), { highWaterMark: 1 << 20 }));
        yield* w.part('context', [pack(context)]);
        yield* w.part('records', [pack(records)]);
        const end = w.end((digest) => signDigest(key, digest));
        rows.setDigest(snap!.id, end.digest, end.bytes);
        yield end.frame;
      } catch (e) {
        engine.log.warn({ err: e, snapshotId: snap!.id }, 'snapshot export failed');
        throw e instanceof LockstepError ? e : new HostError('LAYER_STORE_FAILED', (e as Error).message, { cause: e });
      } finally {
        cleanup();
      }
    }
    const stream = Readable.from(generate(), { objectMode: false, highWaterMark: 1 << 20 });
    stream.once('close', cleanup);
    return { snapshot: snap, stream };
  } catch (e) {
    cleanup();
    throw e;
  }
}

/** The bundle as a stream at once; errors (missing, corrupt, busy) come as the stream's error. */
export function exportSnapshot(engine: ExportDeps, ref: string, tenant?: string | null): Readable {
  let inner: Readable | undefined;
  async function* relay(): AsyncGenerator<Buffer> {
    inner = (await openExport(engine, ref, tenant)).stream;
    for await (const chunk of inner) yield chunk as Buffer;
  }
  const out = Readable.from(relay(), { objectMode: false, highWaterMark: 1 << 20 });
  out.once('close', () => inner?.destroy());
  return out;
}

/**
 * The bundle's digest and length, exporting it once into nothing if they
 * are not known yet (a resumed download needs them to answer a Range
 * request properly: HTTP's Content-Range names the total length).
 */
export async function bundleIdentity(
  engine: ExportDeps,
  ref: string,
  tenant?: string | null,
): Promise<{ digest: string; bytes: number }> {
  const rows = new SnapshotRows(engine.catalog.db);
  let row = rows.require(ref, tenant);
  if (!row.digest || row.bundle_bytes == null) {
    const { stream } = await openExport(engine, ref, tenant);
    for await (const _chunk of stream) {
      /* counted and hashed by the writer */
    }
    row = rows.require(ref, tenant);
  }
  return { digest: row.digest!, bytes: row.bundle_bytes! };
}
