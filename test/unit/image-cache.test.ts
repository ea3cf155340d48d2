/** The image store builds recipes into the build cache the manager's config names (cacheDir), not one of its own. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test from 'ava';
import { openFake } from '../fakes/manager.js';
import { recipeHash } from '../../src/images/image-store.js';

test("a recipe image comes from the config's cacheDir", async (t) => {
  const cacheDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-cache-'));
  t.teardown(() => fs.rmSync(cacheDir, { recursive: true, force: true }));
  // A finished build of the dev recipe in that cache: the store copies it instead of building.
  const entry = path.join(cacheDir, 'images', `dev-${recipeHash('dev')}`);
  fs.mkdirSync(path.join(entry, 'rootfs'), { recursive: true });
  fs.writeFileSync(path.join(entry, 'rootfs', 'from-this-cache'), 'yes');
  fs.writeFileSync(path.join(entry, '.complete'), 'done');
  const m = await openFake(t, { open: { config: { cacheDir } } });
  t.is(m.engine.config.cacheDir, cacheDir);
  const image = await m.ls.images.ensure('dev');
  t.is(fs.readFileSync(path.join(image.rootfs, 'from-this-cache'), 'utf8'), 'yes');
  t.is(image.source, `recipe:dev@${recipeHash('dev')}`);
});
