/**
 * Images made on first use: a create from a shipped recipe on a state
 * directory that has never built it builds the recipe (or links it from the
 * build cache) first, with progress, through the CLI, the SDK and HTTP.
 * Concurrent first uses make the image once.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Lockstep } from '../../src/index.js';
import { recipeHash } from '../../src/images/image-store.js';
import { destroyHome, eventually, freshHome, integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';

const CLI = fileURLToPath(new URL('../../../bin/lockstep.js', import.meta.url));

function cli(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

integration(test, () => {
  test.serial(
    'two `lockstep create --image base` at once on a new state directory and an empty build cache: the recipe is built once, both sandboxes run',
    async (t) => {
      t.timeout(600_000);
      const home = freshHome('first-use-cli');
      const cache = fs.mkdtempSync(path.join(os.tmpdir(), 'lockstep-cache-'));
      t.teardown(async () => {
        await destroyHome(home);
        fs.rmSync(cache, { recursive: true, force: true });
      });
      const env = { LOCKSTEP_HOME: home, LOCKSTEP_CACHE: cache, CI: 'true' };
      const [a, b] = await Promise.all([
        cli(['create', '--image', 'base', '--memory', '64'], env),
        cli(['create', '--image', 'base', '--memory', '64'], env),
      ]);
      t.is(a.code, 0, a.stderr);
      t.is(b.code, 0, b.stderr);
      const ids = [a, b].map((r) => r.stdout.trim());
      for (const id of ids) t.regex(id, /^sbx_[a-z0-9]+$/);
      t.not(ids[0], ids[1]);
      // Progress went to stderr (plain lines off a terminal); stdout is only the id. One build for both.
      const stderr = a.stderr + b.stderr;
      t.is(stderr.match(/building image base from sandbox-images\/base\/build\.sh/g)?.length, 1, stderr);
      t.regex(stderr, /copying base from the build cache/);
      const hash = recipeHash('base');
      t.true(fs.existsSync(path.join(cache, 'images', `base-${hash}`, '.complete')));

      const ls = await Lockstep.open({ home });
      t.teardown(() => ls.close());
      t.deepEqual(
        ls.images.list().map((r) => [r.name, r.source]),
        [['base', `recipe:base@${hash}`]],
      );
      for (const id of ids) t.is((await ls.get(id).commands.run(['busybox', 'echo', id])).stdout, `${id}\n`);
      // A create once the image is there prints no progress.
      const again = await cli(['create', '--image', 'base', '--memory', '64'], env);
      t.is(again.code, 0, again.stderr);
      t.is(again.stderr, '');
    },
  );

  test.serial(
    'SDK: concurrent creates on a new state directory link base from the cache once, each told',
    async (t) => {
      const ls = await openTestLockstep(t, { images: [] });
      t.deepEqual(ls.images.list(), []);
      const seen: string[][] = [[], []];
      const [x, y] = await Promise.all(
        seen.map((lines) => ls.create({ image: 'base', memoryMb: 64, onProgress: (l) => lines.push(l) })),
      );
      for (const lines of seen) t.deepEqual(lines, ['copying base from the build cache']);
      t.is(ls.images.list().length, 1);
      t.is((await x!.commands.run(['busybox', 'echo', 'x'])).stdout, 'x\n');
      t.is((await y!.commands.run(['busybox', 'echo', 'y'])).stdout, 'y\n');
      // Any other missing name is IMAGE_NOT_FOUND, naming the commands that make one.
      const missing = await t.throwsAsync(ls.create({ image: 'no-such-recipe' }), { code: 'IMAGE_NOT_FOUND' });
      t.regex(missing!.message, /lockstep image build NAME/);
      t.regex(missing!.message, /lockstep image import docker:REF --name no-such-recipe/);
      await t.throwsAsync(ls.create({ image: 'base', onProgress: 'loud' as never }), {
        code: 'INVALID_ARGUMENT',
        message: /onProgress/,
      });
    },
  );

  test.serial(
    'HTTP: a create past the wait answers 503 IMAGE_BUILDING with Retry-After while the image is made; the retry gets the sandbox',
    async (t) => {
      const ls = await openTestLockstep(t, { images: [] });
      const { client } = await startServer(t, ls, { imageWaitMs: 1 });
      const api = client.as(tenantToken(ls, 'acme'));
      const first = await api.post('/v1/sandboxes', { image: 'base', memoryMb: 64 });
      t.is(first.status, 503, first.text);
      t.is(first.headers.get('retry-after'), '30');
      t.like(first.body.error, { code: 'IMAGE_BUILDING', field: 'image' });
      t.regex(first.body.error.message, /Image base is being made on first use .*retry the create in 30 s/);
      // The build went on without the request.
      await eventually(
        async () => (await api.get('/v1/images')).body.find((i: any) => i.name === 'base')?.ready,
        60_000,
      );
      const retried = await api.post('/v1/sandboxes', { image: 'base', memoryMb: 64 });
      t.is(retried.status, 201, retried.text);
      t.is(retried.body.image, 'base');
      t.is(ls.images.list().length, 1);

      // Within the wait (the default 60 s), the first create simply answers 201.
      const other = await openTestLockstep(t, { images: [] });
      const { client: c2 } = await startServer(t, other);
      const created = await c2.as(tenantToken(other, 'acme')).post('/v1/sandboxes', { image: 'base', memoryMb: 64 });
      t.is(created.status, 201, created.text);
      t.deepEqual(
        other.images.list().map((r) => r.name),
        ['base'],
      );
    },
  );
});
