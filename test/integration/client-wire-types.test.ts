/**
 * src/client/wire.gen.ts and the Python SDK's clients/python/lockstep/_wire.py
 * are generated from the OpenAPI document (issue 26, item 2: clients from
 * the description): this checks, against a real server's /openapi.json, that
 * each file holds what its generator (scripts/client-types.mjs,
 * scripts/python-wire.mjs) makes from it, byte for byte, so that a route
 * whose schema changed without `npm run client:types` and `npm run
 * client:python` fails here (and the client's type checks, src/client/wire.ts,
 * then see the change at the next build).
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

const PYTHON_SCRIPT = new URL('../../../scripts/python-wire.mjs', import.meta.url).href;

/** What the test uses of scripts/python-wire.mjs. */
interface PythonGenerator {
  OUT: string;
  HEADER: string;
  renderPythonWire(doc: unknown): string;
}
const pythonGenerator = () => import(PYTHON_SCRIPT) as Promise<PythonGenerator>;

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

  test('clients/python/lockstep/_wire.py is the one generated from /openapi.json', async (t) => {
    const gen = await pythonGenerator();
    const generated = gen.renderPythonWire(doc);
    t.true(generated.startsWith(gen.HEADER), 'the file starts with the do-not-edit header');
    t.is(fs.readFileSync(gen.OUT, 'utf8'), generated, 'run `npm run client:python`');
  });

  test('the Python functions are generated the same from the same document, in any order of its paths', async (t) => {
    const gen = await pythonGenerator();
    const first = gen.renderPythonWire(doc);
    const reversed = { ...doc, paths: Object.fromEntries(Object.entries(doc.paths).reverse()) };
    t.is(gen.renderPythonWire(JSON.parse(JSON.stringify(reversed))), first);
    t.true(first.includes('\ndef create_sandbox(\n'), 'the operations of the document are in it');
    t.true(first.includes('\nasync def create_sandbox_async(\n'), 'with their asyncio twins');
  });
});
