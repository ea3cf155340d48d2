/**
 * `npm run bench:load`: N sandboxes at once, each taking M checkpoints with
 * rollbacks and forks mixed in, all through the HTTP API of an in-process
 * server on loopback (what a platform drives). Every command output is
 * checked against the content the step wrote. Reports operations per
 * second, p50/p99 per operation, the manager's RSS and file descriptors
 * before and after, errors, and what the run left behind (mounts, cgroups,
 * subvolumes, process images, the supervisor's children, catalog rows,
 * journal entries, context snapshots: see footprint.ts), to
 * bench/results/load.json. Exits 1 on any error, mismatch or leftover.
 *
 *   node dist/bench/load.js [--sandboxes N] [--checkpoints M] [--rollback-every K]
 *                           [--fork-every K] [--keep K] [--max-seconds S] [--out FILE]
 *
 * The state directory is fresh (/var/tmp/lockstep-bench-load-XXXXXX) and
 * removed at the end, also on failure. --max-seconds, or a first SIGINT or
 * SIGTERM, stops the run early but whole: every sandbox finishes the step it
 * is in and is removed, and the results (marked stoppedEarly) and the
 * leftover check are written as usual; a second signal exits at once.
 */
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { Lockstep } from '../src/index.js';
import { createServer } from '../src/http/server.js';
import { addTenant, migrateTenants } from '../src/tenants/tenants.js';
import { projectRoot } from '../src/native/binding.js';
import { percentile } from './stats.js';
import { footprint, leftBehind } from './footprint.js';

const USAGE = `usage: node dist/bench/load.js [--sandboxes N] [--checkpoints M] [--rollback-every K] [--fork-every K] [--keep K] [--max-seconds S] [--out FILE]
  --sandboxes N       sandboxes driven at once (default 50)
  --checkpoints M     checkpoints per sandbox (default 100)
  --rollback-every K  after every K-th checkpoint, roll back (alternately to the latest
                      checkpoint, a warm-standby swap, and to an older one, a CRIU restore) (default 5)
  --fork-every K      after every K-th checkpoint, fork it, check the fork, remove it (default 10)
  --keep K            checkpoints kept per sandbox; older ones are deleted (default 10)
  --max-seconds S     stop starting new steps after S seconds, then finish as usual (default: no limit)
  --out FILE          results (default bench/results/load.json)`;

interface Options {
  sandboxes: number;
  checkpoints: number;
  rollbackEvery: number;
  forkEvery: number;
  keep: number;
  maxSeconds: number | undefined;
  out: string;
}

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      sandboxes: { type: 'string' },
      checkpoints: { type: 'string' },
      'rollback-every': { type: 'string' },
      'fork-every': { type: 'string' },
      keep: { type: 'string' },
      'max-seconds': { type: 'string' },
      out: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const int = (name: string, v: string | undefined, def: number, min: number) => {
    if (v === undefined) return def;
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer >= ${min}, got ${v}\n${USAGE}`);
    return n;
  };
  return {
    sandboxes: int('sandboxes', values.sandboxes, 50, 1),
    checkpoints: int('checkpoints', values.checkpoints, 100, 1),
    rollbackEvery: int('rollback-every', values['rollback-every'], 5, 1),
    forkEvery: int('fork-every', values['fork-every'], 10, 1),
    keep: int('keep', values.keep, 10, 2),
    maxSeconds: values['max-seconds'] === undefined ? undefined : int('max-seconds', values['max-seconds'], 0, 1),
    out: values.out ?? path.join(projectRoot, 'bench', 'results', 'load.json'),
  };
}

interface Manager {
  rssMiB: number;
  fds: number;
}
const managerNow = (): Manager => ({
  rssMiB: Math.round((process.memoryUsage().rss / 2 ** 20) * 10) / 10,
  fds: fs.readdirSync('/proc/self/fd').length,
});

class Recorder {
  readonly samples = new Map<string, number[]>();
  readonly errors: { op: string; status: number; code: string; message: string }[] = [];
  mismatches: string[] = [];
  status5xx = 0;
  /** Why the run stops early (a signal, --max-seconds); sandboxes then finish their step and are removed. */
  stopReason: string | undefined;
  checkpointsDone = 0;

  async time<T>(op: string, fn: () => Promise<{ status: number; body: T; text: string }>, want: number): Promise<T> {
    const t0 = performance.now();
    let r: { status: number; body: T; text: string };
    try {
      r = await fn();
    } catch (e) {
      // No answer at all (connection reset): an error too, or a sandbox the server made would go unnoticed.
      const err = e as { code?: string; cause?: { code?: string }; message?: string };
      this.errors.push({
        op,
        status: 0,
        code: err.cause?.code ?? err.code ?? 'NO_ANSWER',
        message: String(err.message).slice(0, 300),
      });
      if (this.errors.length <= 20) console.error(`  error: ${op} -> no answer: ${err.message}`);
      throw new OpFailed(op);
    }
    const ms = performance.now() - t0;
    if (r.status >= 500) this.status5xx++;
    if (r.status !== want) {
      const body = r.body as { code?: string; message?: string } | undefined;
      const e = {
        op,
        status: r.status,
        code: body?.code ?? 'HTTP_' + r.status,
        message: (body?.message ?? r.text).slice(0, 300),
      };
      this.errors.push(e);
      // As they happen: a long run's errors are worth reading before it ends.
      if (this.errors.length <= 20) console.error(`  error: ${op} -> ${e.status} ${e.code}: ${e.message}`);
      throw new OpFailed(op);
    }
    this.add(op, ms);
    return r.body;
  }

  add(op: string, ms: number): void {
    const s = this.samples.get(op);
    if (s) s.push(ms);
    else this.samples.set(op, [ms]);
  }
}

class OpFailed extends Error {}

class Api {
  constructor(
    readonly base: string,
    readonly token: string,
  ) {}
  /**
   * node:http rather than fetch: fetch gives up on an answer after 300 s
   * (undici's headersTimeout), and at full size a create or fork can take
   * longer; the sandbox the server then made was never removed.
   */
  async req(method: string, p: string, body?: unknown, headers: Record<string, string> = {}) {
    const data = body === undefined ? undefined : JSON.stringify(body);
    const res = await new Promise<{ status: number; text: string }>((resolve, reject) => {
      const r = http.request(
        this.base + p,
        {
          method,
          headers: {
            authorization: `Bearer ${this.token}`,
            ...(data !== undefined ? { 'content-type': 'application/json' } : {}),
            ...headers,
          },
        },
        (answer) => {
          let text = '';
          answer.setEncoding('utf8');
          answer.on('data', (d: string) => (text += d));
          answer.on('end', () => resolve({ status: answer.statusCode ?? 0, text }));
          answer.on('error', reject);
        },
      );
      r.on('error', reject);
      r.end(data);
    });
    const text = res.text;
    let parsed: any = text;
    try {
      parsed = JSON.parse(text);
    } catch {
      /* not JSON */
    }
    return { status: res.status, body: parsed, text };
  }
}

/** One sandbox's life: M checkpoints, each after a write checked through exec, rollbacks and forks in between. */
async function sandboxLoop(api: Api, rec: Recorder, o: Options, i: number): Promise<void> {
  let id: string;
  try {
    id = (await rec.time<{ id: string }>('create', () => api.req('POST', '/v1/sandboxes', { memoryMb: 64 }), 201)).id;
  } catch {
    return; // recorded as an error; this sandbox's share of the load is not run
  }
  const kept: { id: string; content: string; context: unknown }[] = [];
  let rollbacks = 0;
  const check = async (sandboxId: string, want: string, what: string) => {
    const r = await rec.time<{ stdout: string; exitCode: number }>(
      'exec',
      () => api.req('POST', `/v1/sandboxes/${sandboxId}/commands`, { cmd: 'cat /workspace/step' }),
      200,
    );
    if (r.exitCode !== 0 || r.stdout !== want)
      rec.mismatches.push(
        `sandbox ${i} ${what}: got ${JSON.stringify(r.stdout).slice(0, 120)}, want ${JSON.stringify(want).slice(0, 120)}`,
      );
  };
  try {
    for (let k = 1; k <= o.checkpoints && !rec.stopReason; k++) {
      const content = `sandbox ${i} step ${k} ${'.'.repeat(k % 50)}\n`;
      await rec.time('write', () => api.req('PUT', `/v1/sandboxes/${id}/files?path=/workspace/step`, { content }), 200);
      await check(id, content, `after write ${k}`);
      // With the agent's context, so that context snapshots are made, restored and freed under load too.
      const context = { format: 'openai-chat', messages: [{ role: 'user', content: `sandbox ${i} step ${k}` }] };
      const ck = await rec.time<{ id: string }>(
        'checkpoint',
        () => api.req('POST', `/v1/sandboxes/${id}/checkpoints`, { label: `step ${k}`, context }),
        201,
      );
      kept.push({ id: ck.id, content, context });
      rec.checkpointsDone++;
      if (kept.length > o.keep) {
        const old = kept.shift()!;
        await rec.time('delete-checkpoint', () => api.req('DELETE', `/v1/sandboxes/${id}/checkpoints/${old.id}`), 200);
      }
      if (k % o.rollbackEvery === 0) {
        // Alternately the latest checkpoint (its warm standby is swapped in) and an older one (CRIU restore).
        const target = rollbacks++ % 2 === 0 || kept.length < 2 ? kept.at(-1)! : kept[0]!;
        await rec.time(
          'write',
          () => api.req('PUT', `/v1/sandboxes/${id}/files?path=/workspace/step`, { content: 'not checkpointed\n' }),
          200,
        );
        const r = await rec.time<{ path: string; context: unknown }>(
          'rollback',
          () => api.req('POST', `/v1/sandboxes/${id}/rollback`, { checkpointId: target.id }),
          200,
        );
        rec.add(`rollback (${r.path})`, rec.samples.get('rollback')!.at(-1)!);
        if (JSON.stringify(r.context) !== JSON.stringify(target.context))
          rec.mismatches.push(
            `sandbox ${i} context after rollback to step ${k}: got ${JSON.stringify(r.context).slice(0, 120)}`,
          );
        await check(id, target.content, `after rollback to step ${k}`);
      }
      if (k % o.forkEvery === 0) {
        const f = await rec.time<{ ids: string[] }>(
          'fork',
          () => api.req('POST', `/v1/sandboxes/${id}/fork`, { checkpointId: ck.id }),
          200,
        );
        for (const fid of f.ids) {
          await check(fid, content, `fork of step ${k}`);
          await rec.time('remove', () => api.req('DELETE', `/v1/sandboxes/${fid}`), 200);
        }
      }
    }
  } catch (e) {
    // An operation failed (recorded by time()): this sandbox stops, the others go on.
    if (!(e instanceof OpFailed))
      rec.errors.push({
        op: 'loop',
        status: 0,
        code: (e as { code?: string }).code ?? 'EXCEPTION',
        message: String(e).slice(0, 300),
      });
  } finally {
    await rec.time('remove', () => api.req('DELETE', `/v1/sandboxes/${id}`), 200).catch(() => undefined);
  }
}

async function main(): Promise<void> {
  const o = parseOptions(process.argv.slice(2));
  const home = fs.mkdtempSync('/var/tmp/lockstep-bench-load-');
  let ls: Lockstep | undefined;
  let stopping = false;
  let rec: Recorder | undefined;
  const cleanup = async () => {
    if (ls) await ls.destroyAll({ deleteFiles: true }).catch((e) => console.error('cleanup:', e));
    else fs.rmSync(home, { recursive: true, force: true });
  };
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.on(sig, () => {
      if (stopping) process.exit(130);
      stopping = true;
      if (rec && !rec.stopReason) {
        rec.stopReason = sig;
        console.error(
          `\n${sig}: stopping early; each sandbox finishes its step and is removed (again to exit at once)`,
        );
        return;
      }
      console.error(`\n${sig}: cleaning up (again to exit at once)`);
      void cleanup().finally(() => process.exit(130));
    });
  }
  try {
    ls = await Lockstep.open({ home });
    await ls.images.ensure('base');
    migrateTenants(ls.engine.catalog.db);
    const { token } = addTenant(ls.engine.catalog.db, 'bench');
    const app = createServer({ lockstep: ls, sweepIntervalMs: 0 });
    await app.listen({ port: 0, host: '127.0.0.1' });
    const addr = app.server.address();
    if (typeof addr !== 'object' || !addr) throw new Error('server has no address');
    const api = new Api(`http://127.0.0.1:${addr.port}`, token);

    // Warm up (CRIU service, HTTP, first checkpoint) so "before" is what a manager holds anyway.
    const warm = new Recorder();
    await sandboxLoop(api, warm, { ...o, checkpoints: 2, rollbackEvery: 1, forkEvery: 2 }, -1);
    await ls.engine.drainLocks();
    app.server.closeAllConnections();
    await new Promise((r) => setTimeout(r, 500));
    const before = managerNow();
    const hostBefore = footprint(ls);

    console.error(
      `bench:load: ${o.sandboxes} sandboxes × ${o.checkpoints} checkpoints, rollback every ${o.rollbackEvery}, fork every ${o.forkEvery}, load ${os.loadavg()[0]!.toFixed(1)}`,
    );
    const run = new Recorder();
    rec = run;
    const t0 = performance.now();
    const limit =
      o.maxSeconds === undefined
        ? undefined
        : setTimeout(() => (run.stopReason ??= `--max-seconds ${o.maxSeconds}`), o.maxSeconds * 1000);
    const progress = setInterval(() => {
      const n = [...run.samples.values()].reduce((a, s) => a + s.length, 0);
      console.error(
        `  ${((performance.now() - t0) / 1000).toFixed(0)} s: ${n} operations, ${run.checkpointsDone} checkpoints, ${run.errors.length} errors`,
      );
    }, 30_000);
    await Promise.all(Array.from({ length: o.sandboxes }, (_, i) => sandboxLoop(api, run, o, i)));
    clearInterval(progress);
    clearTimeout(limit);
    const seconds = (performance.now() - t0) / 1000;

    await ls.engine.drainLocks();
    app.server.closeAllConnections();
    await new Promise((r) => setTimeout(r, 500));
    const after = managerNow();
    // The manager's own view first: every exit it saw is in the catalog.
    await ls.engine.inits.settled();
    const left = leftBehind(hostBefore, footprint(ls));
    if (after.fds > before.fds) left.managerFds = [`${before.fds} before, ${after.fds} after`];
    await app.shutdown({ graceMs: 5000, abortWaitMs: 2000 });

    const perOp: Record<string, { n: number; p50: number; p99: number; max: number }> = {};
    for (const [op, s] of [...run.samples].sort()) {
      const sorted = [...s].sort((a, b) => a - b);
      const r1 = (x: number) => Math.round(x * 10) / 10;
      perOp[op] = {
        n: s.length,
        p50: r1(percentile(sorted, 50)),
        p99: r1(percentile(sorted, 99)),
        max: r1(sorted.at(-1)!),
      };
    }
    // "rollback (standby)" and "rollback (restore)" split the rollbacks already counted.
    const total = [...run.samples].filter(([op]) => !op.startsWith('rollback (')).reduce((a, [, s]) => a + s.length, 0);
    const byCode: Record<string, number> = {};
    for (const e of run.errors) byCode[`${e.op}:${e.code}`] = (byCode[`${e.op}:${e.code}`] ?? 0) + 1;
    const results = {
      date: new Date().toISOString(),
      host: {
        cpus: os.cpus().length,
        memGiB: Math.round(os.totalmem() / 2 ** 30),
        kernel: os.release(),
        loadavgEnd: os.loadavg().map((x) => Math.round(x * 10) / 10),
      },
      config: {
        sandboxes: o.sandboxes,
        checkpoints: o.checkpoints,
        rollbackEvery: o.rollbackEvery,
        forkEvery: o.forkEvery,
        keep: o.keep,
        channel: 'http (in-process server on loopback)',
      },
      seconds: Math.round(seconds * 10) / 10,
      // Set when the run stopped before every sandbox took all its checkpoints (a signal, --max-seconds).
      stoppedEarly: run.stopReason ?? null,
      checkpoints: run.checkpointsDone,
      operations: total,
      operationsPerSecond: Math.round((total / seconds) * 10) / 10,
      perOperationMs: perOp,
      manager: { before, after },
      errors: { count: run.errors.length, http5xx: run.status5xx, byCode, samples: run.errors.slice(0, 20) },
      outputMismatches: { count: run.mismatches.length, samples: run.mismatches.slice(0, 20) },
      leftBehind: left,
    };
    fs.mkdirSync(path.dirname(o.out), { recursive: true });
    fs.writeFileSync(o.out, JSON.stringify(results, null, 2) + '\n');
    console.log(JSON.stringify(results, null, 2));
    console.error(`wrote ${o.out}`);
    if (run.errors.length || run.mismatches.length || Object.keys(left).length) process.exitCode = 1;
  } finally {
    await cleanup();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
