/**
 * `lockstep snapshot …`: named snapshots from the command line, a thin
 * layer over `ls.snapshots` (the operator's view: every tenant's). Bundles
 * go to stdout and come from stdin, so they pipe: `lockstep snapshot export
 * ID > file`, `ssh other lockstep snapshot import < file`.
 */
import { pipeline } from 'node:stream/promises';
import type { SnapshotInfo } from '../snapshots/snapshot-rows.js';
import { EXIT, Progress, UsageError, printJson, table } from './output.js';
import { resolveStoreConfig } from '../config.js';
import { openSnapshotStore } from '../snapshots/open-store.js';
import type { SnapshotStore } from '../snapshots/store.js';
import type { TransferProgress } from '../snapshots/transfer.js';
import { intFlag, need, parse } from './args.js';
import { withLockstep } from './session.js';
import { command, subcommandUsage } from './command-table.js';

type Handler = (argv: string[]) => Promise<number>;

const MiB = 1024 * 1024;

/** A progress line for a transfer, redrawn on a terminal, at most every 2 s to a pipe or log. */
function transferProgress(quiet: boolean): { report: (p: TransferProgress) => void; done: () => void } {
  const progress = new Progress(quiet);
  let last = 0;
  return {
    report(p) {
      const now = Date.now();
      if (now - last < (process.stderr.isTTY ? 100 : 2000)) return;
      last = now;
      const of = p.totalBytes ? ` of ${(p.totalBytes / MiB).toFixed(0)}` : '';
      const chunks =
        p.uploadedChunks !== undefined ? `, ${p.uploadedChunks} chunks sent, ${p.skippedChunks} already stored` : '';
      progress.update(`${p.phase}: ${(p.bytes / MiB).toFixed(0)}${of} MiB${chunks}`);
    },
    done: () => progress.done(),
  };
}

/** The store `--store` names, or undefined for the configured one; closed by the caller. */
async function storeFlag(url: string | undefined): Promise<SnapshotStore | undefined> {
  return url === undefined ? undefined : openSnapshotStore(resolveStoreConfig({ url }));
}

function metaFlags(values: string[] | undefined): Record<string, string> | undefined {
  if (!values?.length) return undefined;
  const out: Record<string, string> = {};
  for (const kv of values) {
    const i = kv.indexOf('=');
    if (i <= 0) throw new UsageError(`--meta takes KEY=VALUE, got ${JSON.stringify(kv)}`);
    out[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return out;
}

function show(s: SnapshotInfo, json: boolean | undefined): void {
  if (json) printJson(s);
  else process.stdout.write(`${s.id}\n`);
}

export const snapshotCommands: Record<string, Handler> = {
  async snapshot(argv) {
    const [sub, ...rest] = argv;
    switch (sub) {
      case 'create': {
        const { options, usage: u } = command('snapshot create');
        const { values, positionals } = parse(rest, options, u);
        const [ckpt] = need(positionals, 1, u);
        return withLockstep(async (ls) => {
          show(await ls.snapshots.create(ckpt!, { name: values.name, metadata: metaFlags(values.meta) }), values.json);
          return EXIT.ok;
        });
      }
      case 'ls': {
        const { options, usage } = command('snapshot ls');
        const { values } = parse(rest, options, usage);
        return withLockstep(async (ls) => {
          const all = ls.snapshots.list();
          if (values.json) printJson(all);
          else
            process.stdout.write(
              table(
                ['ID', 'NAME', 'IMAGE', 'SIZE', 'CREATED'],
                all.map((s) => [s.id, s.name ?? '', s.image, `${(s.sizeBytes / 1e6).toFixed(1)} MB`, s.createdAt]),
              ) + '\n',
            );
          return EXIT.ok;
        });
      }
      case 'inspect':
      case 'rm': {
        const { options, usage: u } = command(`snapshot ${sub}`);
        const { values, positionals } = parse(rest, options, u);
        const [ref] = need(positionals, 1, u);
        return withLockstep(async (ls) => {
          const s = ls.snapshots.get(ref!);
          if (sub === 'inspect') {
            printJson(s);
            return EXIT.ok;
          }
          await ls.snapshots.delete(s.id);
          if (values.json) printJson({ id: s.id, deleted: true });
          return EXIT.ok;
        });
      }
      case 'start': {
        const { options, usage: u } = command('snapshot start');
        const { values, positionals } = parse(rest, options, u);
        const [ref] = need(positionals, 1, u);
        return withLockstep(async (ls) => {
          const results = await ls.snapshots.start(ref!, { count: intFlag(values.count, 'count') });
          if (values.json) printJson(results);
          else
            for (const r of results)
              process.stdout.write(r.ok ? `${r.id}\n` : `failed: ${r.error.code}: ${r.error.message}\n`);
          return results.every((r) => r.ok) ? EXIT.ok : EXIT.failure;
        });
      }
      case 'export': {
        const { options, usage: u } = command('snapshot export');
        const { positionals } = parse(rest, options, u);
        const [ref] = need(positionals, 1, u);
        if (process.stdout.isTTY) throw new UsageError(`the bundle is binary: redirect stdout to a file\nusage: ${u}`);
        return withLockstep(async (ls) => {
          await pipeline(ls.snapshots.export(ref!), process.stdout);
          return EXIT.ok;
        });
      }
      case 'import': {
        const { options, usage: u } = command('snapshot import');
        const { values, positionals } = parse(rest, options, u);
        need(positionals, 0, u);
        if (process.stdin.isTTY) throw new UsageError(`give the bundle on stdin\nusage: ${u}`);
        return withLockstep(async (ls) => {
          show(await ls.snapshots.import(process.stdin, { name: values.name }), values.json);
          return EXIT.ok;
        });
      }
      case 'push': {
        const { options, usage: u } = command('snapshot push');
        const { values, positionals } = parse(rest, options, u);
        const [ref] = need(positionals, 1, u);
        const store = await storeFlag(values.store);
        try {
          return await withLockstep(async (ls) => {
            const progress = transferProgress(values.json === true);
            const r = await ls.snapshots.push(ref!, { key: values.key, store, onProgress: progress.report });
            progress.done();
            if (values.json) printJson(r);
            else
              process.stdout.write(
                `${r.key} ${r.digest} ${r.bytes} bytes (${r.uploadedChunks} chunks sent, ${r.skippedChunks} already stored)\n`,
              );
            return EXIT.ok;
          });
        } finally {
          store?.close();
        }
      }
      case 'key': {
        const { options, usage: u } = command('snapshot key');
        need(parse(rest, options, u).positionals, 0, u);
        return withLockstep(async (ls) => {
          process.stdout.write(`${ls.snapshots.signingKey()}\n`);
          return EXIT.ok;
        });
      }
      case 'pull': {
        const { options, usage: u } = command('snapshot pull');
        const { values, positionals } = parse(rest, options, u);
        const [ref] = need(positionals, 1, u);
        if (values.from === undefined && values.token === undefined) {
          const store = await storeFlag(values.store);
          try {
            return await withLockstep(async (ls) => {
              const progress = transferProgress(values.json === true);
              const r = await ls.snapshots.pull(ref!, { name: values.name, store, onProgress: progress.report });
              progress.done();
              if (values.json) printJson(r);
              else process.stdout.write(`${r.snapshot.id}\n`);
              return EXIT.ok;
            });
          } finally {
            store?.close();
          }
        }
        if (!values.from || !values.token) throw new UsageError(`--from and --token are needed\nusage: ${u}`);
        if (values.store)
          throw new UsageError(`--store is for a pull from the snapshot store, not --from\nusage: ${u}`);
        return withLockstep(async (ls) => {
          const r = await ls.snapshots.pull({
            from: values.from!,
            token: values.token!,
            snapshot: ref!,
            name: values.name,
          });
          if (values.json) printJson(r);
          else process.stdout.write(`${r.snapshot.id}\n`);
          return EXIT.ok;
        });
      }
      default:
        throw new UsageError(
          `unknown snapshot command ${JSON.stringify(sub ?? '')}\nusage:\n${subcommandUsage('snapshot')}`,
        );
    }
  },
};
