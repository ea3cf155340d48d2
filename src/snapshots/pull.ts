/**
 * Verb: pull a snapshot from another Lockstep server over its HTTP API,
 * with a token of the tenant there, and import it here.
 *
 * The download goes to a scratch file of the store (`pull-<key>.bundle`,
 * keyed by source, snapshot and tenant). A transfer cut short (the source
 * restarted, the network dropped) resumes where the file ends: the next
 * attempt asks for `Range: bytes=<have>-`, with `If-Range: <ETag>` once the
 * source has named the bundle's digest, and appends the 206 answer (a 200
 * means the source sent it whole again: the file starts over). The import
 * then reads the file, verifying every part and the digest: should the
 * resumed bytes not fit the first ones (the source's bundle came out
 * differently), the import fails with BUNDLE_CORRUPT, having kept nothing,
 * and the pull starts once more from zero. Nothing is half-imported in any
 * case; the scratch file goes when the pull ends either way (and the reaper
 * empties scratch after a crash).
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import { InvalidArgumentError, LockstepError } from '../errors.js';
import { ConnectionError, errorFromResponse } from '../errors-from-wire.js';
import { importSnapshot } from './import.js';
import type { SnapshotRow } from './snapshot-rows.js';
import type { ImportDeps } from './import.js';
import type { Logger } from '../log.js';
import type { StatePaths } from '../paths.js';

/** What pull.ts uses of the manager's services (api/engine.ts builds them). */
export interface PullDeps extends ImportDeps {
  log: Logger;
  paths: StatePaths;
}

/** What a pull takes. */
export interface PullOptions {
  /** Base URL of the source server (`http://host:port`). */
  from: string;
  /** The snapshot's id (or name) there. */
  snapshot: string;
  /** A token of the tenant the snapshot belongs to there. */
  token: string;
  /** The tenant (tn_…) it will belong to here. */
  tenant?: string | null | undefined;
  /** A name of its own here (default: its name there). */
  name?: string | undefined;
  /** Download attempts, the first included (default 8); each cut short resumes. */
  maxAttempts?: number | undefined;
  signal?: AbortSignal | undefined;
}

/** What a pull did. */
export interface PullReport {
  snapshot: SnapshotRow;
  /** Bytes of the bundle. */
  bundleBytes: number;
  /** Bytes received over the network, all attempts together. */
  receivedBytes: number;
  /** Attempts that resumed a partial download with a Range request. */
  resumed: number;
  /** True if the download had to start over from zero (a resumed file failed verification). */
  restarted: boolean;
  downloadMs: number;
  importMs: number;
}

const SNAPSHOT_REF = /^(snap_[a-z0-9]+|[a-z0-9][a-z0-9._-]{0,63})$/;

export function validatePull(opts: PullOptions): URL {
  let url: URL;
  try {
    url = new URL(opts.from);
  } catch {
    throw new InvalidArgumentError('from', 'the base URL of a Lockstep server (http://host:port)', opts.from);
  }
  if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.username || url.password || url.search)
    throw new InvalidArgumentError('from', 'an http(s) URL without credentials or query', opts.from);
  if (typeof opts.snapshot !== 'string' || !SNAPSHOT_REF.test(opts.snapshot))
    throw new InvalidArgumentError('snapshot', 'a snapshot id (snap_…) or name', opts.snapshot);
  if (typeof opts.token !== 'string' || !/^[\x21-\x7e]{1,512}$/.test(opts.token))
    throw new InvalidArgumentError('token', 'a tenant token of the source server', '(hidden)');
  return new URL(`${url.href.replace(/\/+$/, '')}/v1/snapshots/${encodeURIComponent(opts.snapshot)}/bundle`);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** One download attempt into `file`; returns whether the bundle is complete and what came. */
async function downloadOnce(
  url: URL,
  file: string,
  etagFile: string,
  token: string,
  signal: AbortSignal | undefined,
): Promise<{ complete: boolean; received: number; resumed: boolean }> {
  const have = fs.existsSync(file) ? fs.statSync(file).size : 0;
  const etag = fs.existsSync(etagFile) ? fs.readFileSync(etagFile, 'utf8') : undefined;
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, accept: 'application/octet-stream' };
  if (have > 0) {
    headers.range = `bytes=${have}-`;
    if (etag) headers['if-range'] = etag;
  }
  let res: Response;
  try {
    res = await fetch(url, { headers, ...(signal ? { signal } : {}) });
  } catch (e) {
    if (signal?.aborted) throw e;
    return { complete: false, received: 0, resumed: false };
  }
  if (res.status === 416 && have > 0) {
    // We asked for bytes past its end: our file is whole already, or wrong (the import will tell).
    await res.body?.cancel();
    return { complete: true, received: 0, resumed: true };
  }
  if (res.status !== 200 && res.status !== 206) {
    const err = await errorFromResponse(res);
    // The source answers for its own objects: a missing (or another tenant's) snapshot is this pull's 404 too.
    throw err;
  }
  const resumed = res.status === 206;
  if (resumed && !(res.headers.get('content-range') ?? '').startsWith(`bytes ${have}-`)) {
    await res.body?.cancel();
    fs.rmSync(file, { force: true });
    return { complete: false, received: 0, resumed: false };
  }
  const tag = res.headers.get('etag');
  if (tag) fs.writeFileSync(etagFile, tag, { mode: 0o600 });
  const out = await fs.promises.open(file, resumed ? 'a' : 'w', 0o600);
  let received = 0;
  try {
    // One chunk at a time straight to the file: memory does not grow with the bundle.
    for await (const chunk of res.body! as unknown as AsyncIterable<Uint8Array>) {
      await out.write(chunk);
      received += chunk.length;
    }
    return { complete: true, received, resumed };
  } catch (e) {
    if (signal?.aborted) throw e;
    return { complete: false, received, resumed };
  } finally {
    await out.close();
  }
}

/** Pulls a snapshot from another server and imports it here. */
export async function pullSnapshot(engine: PullDeps, opts: PullOptions): Promise<PullReport> {
  const url = validatePull(opts);
  const maxAttempts = opts.maxAttempts ?? 8;
  if (!Number.isInteger(maxAttempts) || maxAttempts < 1 || maxAttempts > 100)
    throw new InvalidArgumentError('maxAttempts', 'an integer from 1 to 100', maxAttempts);
  const key = createHash('sha256')
    .update(`${url.href}\0${opts.tenant ?? ''}`)
    .digest('hex')
    .slice(0, 20);
  const file = path.join(engine.paths.scratch, `pull-${key}.bundle`);
  const etagFile = `${file}.etag`;
  const report = { receivedBytes: 0, resumed: 0, restarted: false, downloadMs: 0, importMs: 0 };
  try {
    for (let round = 0; ; round++) {
      const t0 = performance.now();
      let complete = false;
      for (let attempt = 1; attempt <= maxAttempts && !complete; attempt++) {
        opts.signal?.throwIfAborted();
        const r = await downloadOnce(url, file, etagFile, opts.token, opts.signal);
        report.receivedBytes += r.received;
        if (r.resumed) report.resumed++;
        complete = r.complete;
        if (!complete && attempt < maxAttempts) await sleep(Math.min(250 * 2 ** (attempt - 1), 4000));
      }
      report.downloadMs += performance.now() - t0;
      if (!complete)
        throw new ConnectionError(
          `Cannot download snapshot ${opts.snapshot} from ${new URL(opts.from).origin}: ${maxAttempts} attempts were cut short`,
        );
      const t1 = performance.now();
      try {
        const snapshot = await importSnapshot(engine, fs.createReadStream(file, { highWaterMark: 1 << 20 }), {
          tenant: opts.tenant,
          name: opts.name,
          signal: opts.signal,
        });
        report.importMs += performance.now() - t1;
        return { snapshot, bundleBytes: fs.statSync(file).size, ...report };
      } catch (e) {
        report.importMs += performance.now() - t1;
        // A resumed file that does not verify: start over once, from zero.
        if (e instanceof LockstepError && e.code === 'BUNDLE_CORRUPT' && report.resumed > 0 && round === 0) {
          engine.log.warn({ err: e }, 'a resumed snapshot download did not verify; downloading it again whole');
          fs.rmSync(file, { force: true });
          fs.rmSync(etagFile, { force: true });
          report.restarted = true;
          continue;
        }
        throw e;
      }
    }
  } finally {
    fs.rmSync(file, { force: true });
    fs.rmSync(etagFile, { force: true });
  }
}
