/** A Lockstep manager on the fake host (test/fakes/host.ts): no root, no kernel, a real catalog in a temporary folder. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { Lockstep, type OpenOptions } from '../../src/api/lockstep.js';
import { StatePaths } from '../../src/paths.js';
import type { Engine } from '../../src/api/engine.js';
import type { SandboxRow, Standby } from '../../src/catalog/catalog.js';
import { FakeHost } from './host.js';

export interface FakeManager {
  ls: Lockstep;
  host: FakeHost;
  engine: Engine;
  home: string;
  /** The sandbox's catalog row as it is now. */
  row(id: string): SandboxRow;
  /** The sandbox's warm standby as it is now, or undefined. */
  standby(id: string): Standby | undefined;
}

/** A fresh state directory (removed by the caller's teardown). */
export function fakeHome(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-unit-'));
}

/** Opens a manager on a fake host; `base` is an image of the catalog. Closes and removes it all in teardown. */
export async function openFake(
  t: { teardown(fn: () => unknown): void },
  opts: { home?: string; host?: FakeHost; open?: OpenOptions } = {},
): Promise<FakeManager> {
  const home = opts.home ?? fakeHome();
  const host = opts.host ?? new FakeHost(home);
  const ls = await Lockstep.open({
    logger: pino({ level: 'silent' }),
    ...host.openOptions(new StatePaths(home), opts.open),
  });
  const engine = ls.engine;
  if (!engine.catalog.image('base')) {
    const rootfs = engine.paths.imageRootfs('base');
    fs.mkdirSync(rootfs, { recursive: true });
    engine.catalog.putImage({
      name: 'base',
      rootfs,
      source: 'fake',
      size_bytes: 0,
      created_at: host.now,
      deleted: 0,
    } as Parameters<typeof engine.catalog.putImage>[0]);
  }
  t.teardown(async () => {
    await ls.close();
    if (!opts.home) fs.rmSync(home, { recursive: true, force: true });
  });
  return {
    ls,
    host,
    engine,
    home,
    row: (id) => engine.catalog.sandbox(id)!,
    standby: (id) => engine.catalog.standby(id),
  };
}
