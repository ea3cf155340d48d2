/**
 * Verb: import a snapshot bundle (export.ts) into this state directory.
 *
 * Everything is checked before it is kept:
 * - the header first, before any part is read: the format, the host
 *   (host-identity.ts: SNAPSHOT_INCOMPATIBLE), the image (IMAGE_NOT_FOUND
 *   naming how to get it; another image under that name is
 *   SNAPSHOT_INCOMPATIBLE), the runtime layer and the name;
 * - every part as it ends, and the whole bundle's digest at its end
 *   (BUNDLE_CORRUPT naming what was wrong);
 * - its signature, after the digest (signing.ts: BUNDLE_UNTRUSTED unless a
 *   trusted host signed it);
 * - the tenant's quotas (maxCheckpointMb, maxDiskMb), on the header's size,
 *   as bytes arrive and when the snapshot is recorded (QUOTA_EXCEEDED). What
 *   has arrived is reserved against them while it spools (StoreReservation),
 *   so concurrent imports (and checkpoints) together cannot pass them; the
 *   reservation goes when the snapshot's row counts instead, or on failure.
 * Meanwhile the layer's send stream is spooled to a scratch file and the
 * image files are written into a new image folder, none of it parsed: only
 * once the signature has verified does `btrfs receive` (chrooted into a
 * scratch folder of the store) read the layer and msgpack decode the
 * context and records; then the layer moves into place and one catalog
 * transaction records the snapshot with its context and records. Any failure removes everything the import
 * made; a crash is covered by the journal (kind `snapshot-import`) and the
 * reaper, which removes the uncommitted layer, image and scratch.
 * Data goes to disk as it arrives (with back-pressure): memory does not
 * grow with the bundle.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { unpack } from 'msgpackr';
import { newId } from '../catalog/catalog.js';
import { HostError, InvalidArgumentError, NotFoundError } from '../errors.js';
import { layerFingerprint, type CheckpointChecksums } from '../checkpoints/integrity.js';
import { shareProcessImageWith } from '../instances/id-shift.js';
import { BundleCorruptError, readBundle } from './bundle-format.js';
import { checkCompatible, SnapshotIncompatibleError } from './host-identity.js';
import { BUNDLE_FORMAT, BUNDLE_VERSION, type BundleHeader, type BundleRecords } from './export.js';
import { SnapshotRows, type SnapshotRow } from './snapshot-rows.js';
import { assertNameFree, validateMetadata, validateSnapshotName } from './snapshots.js';
import { checkSignature, hostSigningKey } from './signing.js';
import { checkStoredQuota, StoreReservation, tenantOf } from '../tenants/quotas.js';
import type { IntegrityDeps } from '../checkpoints/integrity.js';
import type { ExportDeps } from './export.js';
import type { SnapshotsDeps } from './snapshots.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { Catalog } from '../catalog/catalog.js';
import type { FaultHook } from '../faults.js';
import type { LayerPort, NativeBinding } from '../ports.js';
import type { LockstepConfig } from '../config.js';
import type { Logger } from '../log.js';
import type { SandboxRuntime } from '../instances/runtime.js';

/** What import.ts uses of the manager's services (api/engine.ts builds them). */
export interface ImportDeps extends IntegrityDeps, ExportDeps, SnapshotsDeps {
  agent: AgentState;
  catalog: Catalog;
  config: LockstepConfig;
  fault: FaultHook;
  layers: LayerPort;
  log: Logger;
  native: NativeBinding;
  runtime: SandboxRuntime;
}

/** Options of an import. */
export interface ImportOptions {
  /** The tenant (tn_…) the snapshot will belong to. */
  tenant?: string | null | undefined;
  /** A name of its own here (default: the name it had, if any). */
  name?: string | undefined;
  signal?: AbortSignal | undefined;
}

/** Largest context or records part kept in memory (they go into SQLite as one value each). */
const MAX_SMALL_PART = 256 * 1024 * 1024;
const IMAGE_FILE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

function checkHeader(engine: ImportDeps, raw: unknown, opts: ImportOptions): BundleHeader {
  const h = raw as Partial<BundleHeader>;
  if (!h || h.format !== BUNDLE_FORMAT) throw new BundleCorruptError('its header is not a Lockstep snapshot header');
  if (h.version !== BUNDLE_VERSION)
    throw new SnapshotIncompatibleError(
      `the bundle has format version ${String(h.version)}, this Lockstep reads version ${BUNDLE_VERSION}`,
      { field: 'version' },
    );
  if (!h.snapshot || !h.template || !h.image || !h.runtimeLayer || !Array.isArray(h.processImageFiles))
    throw new BundleCorruptError('its header lacks a field');
  for (const f of h.processImageFiles)
    if (typeof f !== 'string' || !IMAGE_FILE.test(f) || f === 'parent')
      throw new BundleCorruptError(`its header names a process image file ${JSON.stringify(f)}`);
  validateMetadata(h.snapshot.metadata);
  checkCompatible(h.host);
  const local = engine.catalog.image(h.image.name);
  if (!local || local.deleted) {
    const how = h.image.source.startsWith('recipe:')
      ? `build it here first: lockstep image build ${h.image.name}`
      : `import the same image here first (lockstep image import), as ${h.image.name}`;
    throw new NotFoundError('image', h.image.name, `the snapshot was taken on it (${h.image.source}); ${how}`);
  }
  if (local.source !== h.image.source)
    throw new SnapshotIncompatibleError(
      `image ${h.image.name} here is ${local.source}, the snapshot was taken on ${h.image.source}`,
      { field: 'image' },
    );
  const runtime = engine.runtime.ensureRuntimeLayer();
  if (runtime !== h.runtimeLayer)
    throw new SnapshotIncompatibleError(
      `its processes ran under lockstep-init ${h.runtimeLayer.slice(0, 12)}, this host has ${runtime.slice(0, 12)} (another Lockstep build)`,
      { field: 'runtimeLayer' },
    );
  const name = validateSnapshotName(opts.name ?? h.snapshot.name);
  assertNameFree(new SnapshotRows(engine.catalog.db), name, opts.tenant ?? null);
  return h as BundleHeader;
}

/**
 * `btrfs receive` into dir, chrooted there (a stream's paths cannot reach
 * outside it), reading the layer's send stream from `input` (an open file).
 */
function btrfsReceive(dir: string, input: number): { child: ChildProcess; done: Promise<void> } {
  const child = spawn('btrfs', ['receive', '-e', '-C', dir], { stdio: [input, 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (b: Buffer) => (stderr = (stderr + b.toString()).slice(-2000)));
  const done = new Promise<void>((resolve, reject) => {
    child.once('error', (e) =>
      reject(new HostError('BTRFS_UNAVAILABLE', `Cannot run btrfs receive (btrfs-progs): ${e.message}`, { cause: e })),
    );
    child.once('close', (code) => {
      if (code === 0) resolve();
      else reject(new BundleCorruptError(`its layer could not be received (${stderr.trim() || `exit ${code}`})`));
    });
  });
  done.catch(() => undefined);
  return { child, done };
}

function insertRows(
  db: import('better-sqlite3').Database,
  table: string,
  rows: Record<string, unknown>[],
  adjust: (r: Record<string, unknown>) => Record<string, unknown>,
  orIgnore = false,
): void {
  const cols = new Set((db.prepare(`PRAGMA table_info(${table})`).all() as { name: string }[]).map((c) => c.name));
  cols.delete('seq');
  for (const raw of rows) {
    const r = adjust(raw);
    const keys = Object.keys(r).filter((k) => cols.has(k));
    db.prepare(
      `INSERT ${orIgnore ? 'OR IGNORE ' : ''}INTO ${table} (${keys.join(', ')}) VALUES (${keys.map((k) => '@' + k).join(', ')})`,
    ).run(Object.fromEntries(keys.map((k) => [k, r[k] ?? null])));
  }
}

function newRecordId(prefix: string): string {
  return `${prefix}_${randomBytes(10).toString('hex')}`;
}

/** Imports a bundle; returns the new snapshot's row. Nothing is left behind on failure. */
export async function importSnapshot(
  engine: ImportDeps,
  source: AsyncIterable<Buffer | Uint8Array | string>,
  opts: ImportOptions = {},
): Promise<SnapshotRow> {
  if (opts.name !== undefined) validateSnapshotName(opts.name);
  if (source === null || typeof (source as AsyncIterable<Buffer>)[Symbol.asyncIterator] !== 'function')
    throw new InvalidArgumentError('stream', 'a readable stream of a snapshot bundle', typeof source);
  const { catalog, paths } = engine;
  const rows = new SnapshotRows(catalog.db);
  const id = newId('snap');
  const layerId = newId('lyr');
  const opId = newId('op');
  const scratch = path.join(paths.scratch, `import-${id}`);
  const imageDir = paths.processImage(id);
  let header: BundleHeader | null = null;
  let journalled = false;
  let receiver: { child: ChildProcess; done: Promise<void> } | null = null;
  // The layer's send stream waits here until the signature has verified: `btrfs receive`
  // (root) parses only bytes a trusted host signed.
  const spool = path.join(paths.scratch, `import-${id}.layer`);
  let spooled: fs.promises.FileHandle | null = null;
  let file: fs.promises.FileHandle | null = null;
  let layerMoved = false;
  let committed = false;
  const images: CheckpointChecksums['images'] = {};
  let bytes = 0;
  let small: Buffer[] = [];
  let smallLen = 0;
  // Decoded only once the bundle is known to be trusted.
  const smallParts: { context?: Buffer; records?: Buffer } = {};
  let context: unknown = null;
  let records: BundleRecords = { observations: [], verdicts: [], effects: [] };
  let gotLayer = false;
  let digest = '';
  let signature: unknown;
  const tenant = tenantOf(catalog.db, opts.tenant ?? null);
  const reservation = tenant ? new StoreReservation(catalog.db, tenant) : null;
  try {
    for await (const ev of readBundle(source)) {
      opts.signal?.throwIfAborted();
      if (ev.type === 'header') {
        header = checkHeader(engine, ev.header, opts);
        const claimed = header.snapshot.sizeBytes;
        // The header's size, reserved before anything is written (the bytes themselves are checked as they come).
        if (reservation && Number.isSafeInteger(claimed) && claimed > 0) reservation.grow(claimed);
        catalog.beginOperation({
          id: opId,
          kind: 'snapshot-import',
          sandbox_id: id,
          phase: 'receiving',
          payload: JSON.stringify({ snapshotId: id, layerId }),
        });
        journalled = true;
        fs.mkdirSync(scratch, { mode: 0o700 });
        fs.mkdirSync(imageDir, { mode: 0o700 });
      } else if (ev.type === 'part') {
        if (ev.name === 'layer') {
          if (gotLayer || spooled) throw new BundleCorruptError('it has two layers');
          spooled = await fs.promises.open(spool, 'wx', 0o600);
        } else if (ev.name.startsWith('image/')) {
          const name = ev.name.slice('image/'.length);
          if (!header!.processImageFiles.includes(name) || name in images)
            throw new BundleCorruptError(`it has an unexpected part ${ev.name}`);
          file = await fs.promises.open(path.join(imageDir, name), 'wx', 0o600);
        } else if ((ev.name === 'context' || ev.name === 'records') && !(ev.name in smallParts)) {
          small = [];
          smallLen = 0;
        } else throw new BundleCorruptError(`it has an unknown part ${JSON.stringify(ev.name)}`);
      } else if (ev.type === 'data') {
        bytes += ev.chunk.length;
        reservation?.grow(bytes);
        if (ev.name === 'layer') await spooled!.write(ev.chunk);
        else if (file) await file.write(ev.chunk);
        else {
          smallLen += ev.chunk.length;
          if (smallLen > MAX_SMALL_PART) throw new BundleCorruptError(`its ${ev.name} part is larger than 256 MiB`);
          small.push(ev.chunk);
        }
      } else if (ev.type === 'partEnd') {
        if (ev.name === 'layer') {
          await spooled!.close();
          spooled = null;
          gotLayer = true;
        } else if (file) {
          await file.sync();
          await file.close();
          file = null;
          images[ev.name.slice('image/'.length)] = { size: ev.size, sha256: ev.sha256 };
        } else {
          smallParts[ev.name as 'context' | 'records'] = Buffer.concat(small, smallLen);
          small = [];
        }
      } else if (ev.type === 'end') {
        digest = ev.digest;
        signature = ev.signature;
      }
    }
    if (!header || !gotLayer) throw new BundleCorruptError('it has no layer');
    // Whole and intact; now: made by a host this one trusts? Nothing has parsed its layer,
    // images, context or records yet, and nothing will unless it was.
    const trusted = [hostSigningKey(paths.bundleSigningKey).name, ...engine.config.trustedBundleKeys];
    checkSignature(signature, Buffer.from(digest, 'hex'), trusted);
    const missing = header.processImageFiles.filter((f) => !(f in images));
    if (missing.length) throw new BundleCorruptError(`it lacks process image files ${missing.join(', ')}`);
    for (const k of ['context', 'records'] as const) {
      const raw = smallParts[k];
      if (!raw) throw new BundleCorruptError(`it has no ${k} part`);
      let value: unknown;
      try {
        value = unpack(raw);
      } catch {
        throw new BundleCorruptError(`its ${k} part cannot be decoded`);
      }
      if (k === 'context') context = value;
      else records = value as BundleRecords;
    }
    for (const k of ['observations', 'verdicts', 'effects'] as const)
      if (!Array.isArray(records?.[k])) throw new BundleCorruptError(`its records lack ${k}`);
    const input = await fs.promises.open(spool, 'r');
    try {
      receiver = btrfsReceive(scratch, input.fd);
      await receiver.done;
    } finally {
      await input.close();
    }
    fs.rmSync(spool, { force: true });
    const received = fs.readdirSync(scratch);
    if (received.length !== 1) throw new BundleCorruptError(`its layer stream made ${received.length} subvolumes`);
    // A read-only subvolume cannot move to another folder (its '..' would change): a read-only
    // snapshot of it goes into place instead (O(1)), and the received one is deleted with the scratch.
    await engine.native.subvolumeSnapshot(path.join(scratch, received[0]!), paths.layer(layerId), true);
    layerMoved = true;
    await engine.native.subvolumeDelete(path.join(scratch, received[0]!));
    const layer = layerFingerprint(engine.native, paths.layer(layerId));
    shareProcessImageWith(imageDir, header.template.id_base);
    engine.fault('importSnapshot:received');
    const h = header;
    const row: SnapshotRow = {
      id,
      tenant: opts.tenant ?? null,
      name: validateSnapshotName(opts.name ?? h.snapshot.name),
      metadata: JSON.stringify(h.snapshot.metadata),
      size_bytes: bytes,
      layer_id: layerId,
      process_image: id,
      image: h.image.name,
      image_source: h.image.source,
      runtime_layer: h.runtimeLayer,
      checksums: JSON.stringify({ images, layer } satisfies CheckpointChecksums),
      context_id: null,
      lineage_id: h.snapshot.lineageId,
      ledger_cursor: h.snapshot.ledgerCursor,
      source_sandbox: h.snapshot.sourceSandboxId,
      source_checkpoint: h.snapshot.sourceCheckpointId,
      template: JSON.stringify(h.template),
      digest,
      created_at: Date.now(),
    };
    catalog.tx(() => {
      assertNameFree(rows, row.name, row.tenant);
      // Its own reservation is not counted: the row about to go in counts these bytes instead.
      if (tenant) checkStoredQuota(catalog.db, tenant, bytes, reservation ?? undefined);
      if (context !== null && context !== undefined) row.context_id = engine.agent.contexts.put(context).contextId;
      rows.insert(row);
      const db = catalog.db;
      const branch = newId('br');
      insertRows(db, 'agent_observations', records.observations, (r) => ({
        ...r,
        id: newRecordId('obs'),
        sandbox_id: id,
        branch_id: branch,
        inherited_from: r.inherited_from ?? r.id,
      }));
      insertRows(db, 'agent_verdicts', records.verdicts, (r) => ({
        ...r,
        id: newRecordId('vrd'),
        sandbox_id: id,
        branch_id: branch,
        inherited_from: r.inherited_from ?? r.id,
      }));
      // Effects keep their ids (they are the same events of the same lineage); the snapshot views them.
      insertRows(db, 'agent_effects', records.effects, (r) => ({ ...r, runner: null }), true);
      const view = db.prepare('INSERT OR IGNORE INTO agent_effect_views(sandbox_id, effect_id) VALUES (?, ?)');
      for (const e of records.effects) view.run(id, e.id);
      catalog.endOperation(opId);
      reservation?.release();
    });
    committed = true;
    engine.fault('importSnapshot:committed');
    fs.rmSync(scratch, { recursive: true, force: true });
    engine.log.info({ snapshotId: id, digest, bytes }, 'snapshot imported');
    return rows.get(id)!;
  } catch (e) {
    if (!committed) {
      engine.log.warn({ err: e, snapshotId: id }, 'snapshot import failed; removing what it made');
      await file?.close().catch(() => undefined);
      await spooled?.close().catch(() => undefined);
      fs.rmSync(spool, { force: true });
      if (receiver && receiver.child.exitCode === null) receiver.child.kill('SIGKILL');
      await receiver?.done.catch(() => undefined);
      if (fs.existsSync(scratch)) {
        for (const sub of fs.readdirSync(scratch))
          await engine.native.subvolumeDelete(path.join(scratch, sub)).catch(() => false);
        fs.rmSync(scratch, { recursive: true, force: true });
      }
      if (layerMoved) await engine.layers.deleteLayer(layerId).catch(() => false);
      fs.rmSync(imageDir, { recursive: true, force: true });
      if (journalled) catalog.endOperation(opId);
    }
    throw e;
  } finally {
    // After the cleanup above: the spool and image files it reserved room for are gone by now.
    reservation?.release();
  }
}
