/**
 * src/client/wire.gen.ts is generated from the OpenAPI document (issue 26,
 * item 2: clients from the description): this checks, against a real
 * server's /openapi.json, that the file holds what scripts/client-types.mjs
 * generates from it, byte for byte, so that a route whose schema changed
 * without `npm run client:types` fails here (and the client's type checks,
 * src/client/wire.ts, then see the change at the next build).
 */
import test from 'ava';
import fs from 'node:fs';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer } from '../fixtures/http-client.js';

const SCRIPT = new URL('../../../scripts/client-types.mjs', import.meta.url).href;

/** What the test uses of scripts/client-types.mjs (plain JavaScript, imported at run time). */
interface Generator {
  OUT: string;
  HEADER: string;
  renderClientTypes(doc: unknown): Promise<string>;
}
const generator = () => import(SCRIPT) as Promise<Generator>;

integration(test, () => {
  const cleanups: (() => Promise<void>)[] = [];
  const owner = { teardown: (fn: () => Promise<void>) => void cleanups.push(fn) };
  let doc: any;
  test.before('start a server and fetch /openapi.json', async () => {
    const ls = await openTestLockstep(owner, { images: [] });
    const { client } = await startServer(owner, ls);
    const res = await client.get('/openapi.json');
    if (res.status !== 200) throw new Error(`GET /openapi.json answered ${res.status}: ${res.text}`);
    doc = res.body;
  });
  test.after.always('stop the server, remove the state directory', async () => {
    for (const fn of cleanups.reverse()) await fn();
  });

  test('src/client/wire.gen.ts is the one generated from /openapi.json', async (t) => {
    const gen = await generator();
    const generated = await gen.renderClientTypes(doc);
    t.true(generated.startsWith(gen.HEADER), 'the file starts with the do-not-edit header');
    t.is(fs.readFileSync(gen.OUT, 'utf8'), generated, 'run `npm run client:types`');
  });

  test('generating twice from the same document gives the same bytes', async (t) => {
    const gen = await generator();
    const first = await gen.renderClientTypes(doc);
    t.is(await gen.renderClientTypes(JSON.parse(JSON.stringify(doc))), first);
    t.true(first.includes("'/v1/sandboxes/{id}': {"), 'the paths of the document are in it');
  });
});
