/**
 * `lockstep store`: the snapshot store from a shell, so a bundle made
 * elsewhere can be pushed or fetched with a pipe
 * (`… export … | lockstep store put NAME`, `lockstep store get NAME | … import …`).
 * Like the rest of the CLI it only parses arguments and calls the library
 * (src/snapshots/). Needs no state directory and no root.
 */
import { pipeline } from 'node:stream/promises';
import { resolveStoreConfig } from '../config.js';
import { openSnapshotStore } from '../snapshots/open-store.js';
import type { SnapshotStore } from '../snapshots/store.js';
import { need, parse } from './args.js';
import { EXIT, Progress, UsageError, printJson, table } from './output.js';
import { command, groupHelp } from './command-table.js';

type Handler = (argv: string[]) => Promise<number>;

const MiB = 1024 * 1024;

async function withStore<T>(url: string | undefined, fn: (s: SnapshotStore) => Promise<T>): Promise<T> {
  const store = await openSnapshotStore(resolveStoreConfig({ url }));
  try {
    return await fn(store);
  } finally {
    store.close();
  }
}

export const storeCommands: Record<string, Handler> = {
  async store(argv) {
    const [sub, ...rest] = argv;
    switch (sub) {
      case 'put': {
        const { options, usage } = command('store put');
        const { values, positionals } = parse(rest, options, usage);
        const [name] = need(positionals, 1, usage);
        if (process.stdin.isTTY)
          throw new UsageError(`store put reads the bundle from stdin: pipe it in\nusage: ${usage}`);
        const ac = new AbortController();
        const onSignal = () => ac.abort();
        process.once('SIGINT', onSignal);
        process.once('SIGTERM', onSignal);
        try {
          return await withStore(values.store, async (store) => {
            const progress = new Progress(values.json === true, { ttyOnly: true });
            const r = await store.put(name!, process.stdin, {
              signal: ac.signal,
              onProgress: (p) =>
                progress.update(
                  `${(p.bytes / MiB).toFixed(0)} MiB read, ${p.uploadedChunks} chunks sent, ${p.skippedChunks} already stored`,
                ),
            });
            progress.done();
            if (values.json) printJson({ name, ...r });
            else
              process.stdout.write(
                `${name} ${r.digest} ${r.bytes} bytes, ${r.chunks} chunks (${r.uploadedChunks} sent, ${r.skippedChunks} already stored)\n`,
              );
            return EXIT.ok;
          });
        } finally {
          process.off('SIGINT', onSignal);
          process.off('SIGTERM', onSignal);
        }
      }
      case 'get': {
        const { options, usage } = command('store get');
        const { values, positionals } = parse(rest, options, usage);
        const [name] = need(positionals, 1, usage);
        return withStore(values.store, async (store) => {
          await pipeline(await store.get(name!), process.stdout);
          return EXIT.ok;
        });
      }
      case 'ls': {
        const { options, usage } = command('store ls');
        const { values, positionals } = parse(rest, options, usage);
        if (positionals.length > 1) throw new UsageError(`too many arguments\nusage: ${usage}`);
        return withStore(values.store, async (store) => {
          const all = await store.list(positionals[0]);
          if (values.json) printJson(all);
          else
            process.stdout.write(
              table(
                ['NAME', 'BYTES', 'CHUNKS', 'CREATED', 'DIGEST'],
                all.map((s) => [s.name, String(s.bytes), String(s.chunks), s.createdAt, s.digest]),
              ) + '\n',
            );
          return EXIT.ok;
        });
      }
      case 'rm': {
        const { options, usage } = command('store rm');
        const { values, positionals } = parse(rest, options, usage);
        const [name] = need(positionals, 1, usage);
        return withStore(values.store, async (store) => {
          await store.delete(name!);
          if (values.json) printJson({ name, removed: true });
          return EXIT.ok;
        });
      }
      case 'gc': {
        const { options, usage } = command('store gc');
        const { values, positionals } = parse(rest, options, usage);
        need(positionals, 0, usage);
        const grace = values['grace-ms'];
        if (grace !== undefined && !/^\d+$/.test(grace))
          throw new UsageError(`--grace-ms must be a whole number of ms, got ${JSON.stringify(grace)}`);
        return withStore(values.store, async (store) => {
          const opts = grace === undefined ? {} : { graceMs: Number(grace) };
          const r = await store.collectGarbage(opts);
          // Every tenant's part of the store has chunks of its own (src/snapshots/transfer.ts).
          for (const tenant of await store.tenants()) {
            const part = await store.forTenant(tenant).collectGarbage(opts);
            r.removedChunks += part.removedChunks;
            r.removedBytes += part.removedBytes;
          }
          if (values.json) printJson(r);
          else process.stdout.write(`${r.removedChunks} chunks removed (${r.removedBytes} bytes)\n`);
          return EXIT.ok;
        });
      }
      default:
        throw new UsageError(`unknown store command ${JSON.stringify(sub ?? '')}\nusage:\n${groupHelp('store')}`);
    }
  },
};
