/**
 * docs/http-reference.md's Routes table is rendered from the OpenAPI
 * document (issue 26, item 4: the reference from the table): this checks,
 * against a real server's /openapi.json, that the doc holds what
 * scripts/http-reference.mjs renders from it, byte for byte, and that every
 * operation carries what the rendering needs (an operationId, unique; the
 * reader's notes in `x-lockstep-doc`).
 */
import test from 'ava';
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer } from '../fixtures/http-client.js';

const DOC = fileURLToPath(new URL('../../../docs/http-reference.md', import.meta.url));
const SCRIPT = new URL('../../../scripts/http-reference.mjs', import.meta.url).href;

interface Operation {
  method: string;
  path: string;
  operation: Record<string, any>;
}
/** What the test uses of scripts/http-reference.mjs (plain JavaScript, imported at run time). */
interface Generator {
  END: string;
  operations(doc: unknown): Operation[];
  renderSection(doc: unknown): string;
  generatedSection(markdown: string): string;
}
const generator = () => import(SCRIPT) as Promise<Generator>;

/**
 * Operations whose inputs the document cannot list, with the reason. GET
 * /v1/sandboxes takes any `metadata.KEY` (a patternProperties query), which
 * OpenAPI 3.0 has no parameter form for: the server leaves it out of the
 * document (its summary says it), rather than let @fastify/swagger list the
 * schema's own keywords (`type`, `additionalProperties`) as parameters.
 */
const INPUTS_NOT_LISTED: Record<string, string> = {
  'GET /v1/sandboxes': 'a query of metadata.KEY parameters, a pattern the document cannot list',
};

integration(test, () => {
  // One server for the file's tests: they only read its document.
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

  test('the Routes table of docs/http-reference.md is the one rendered from /openapi.json', async (t) => {
    const gen = await generator();
    const want = gen.renderSection(doc);
    t.true(want.split('\n').length > 50, 'the rendering has a row per operation');
    t.is(
      gen.generatedSection(fs.readFileSync(DOC, 'utf8')),
      want,
      'docs/http-reference.md is out of date with the routes: run `npm run docs:http`',
    );
  });

  test('every operation has an operationId (verb first, camelCase, unique), a summary and its notes', async (t) => {
    const ops = (await generator()).operations(doc);
    t.true(ops.length > 50, `the document lists the API's operations (${ops.length})`);
    const name = (o: Operation) => `${o.method} ${o.path}`;
    t.deepEqual(
      ops.filter((o) => !/^[a-z]+[A-Z][A-Za-z]*$/.test(o.operation.operationId ?? '')).map(name),
      [],
      'operations without a camelCase operationId',
    );
    const ids = ops.map((o) => o.operation.operationId as string);
    t.deepEqual(
      ids.filter((id, i) => ids.indexOf(id) !== i),
      [],
      'operationIds given twice',
    );
    t.deepEqual(ops.filter((o) => !o.operation.summary).map(name), [], 'operations without a summary');
    t.deepEqual(
      ops.filter((o) => typeof o.operation['x-lockstep-doc']?.success !== 'string').map(name),
      [],
      "operations without x-lockstep-doc.success (the table's Success cell)",
    );
    // No parameter named after a JSON Schema keyword (what a patternProperties query became).
    t.deepEqual(
      ops.flatMap((o) =>
        (o.operation.parameters ?? [])
          .filter((p: { name: string }) => ['type', 'additionalProperties', 'patternProperties'].includes(p.name))
          .map((p: { name: string }) => `${name(o)} ?${p.name}`),
      ),
      [],
      'parameters that are schema keywords, not inputs',
    );
    // The status a row leads with is one the operation documents.
    t.deepEqual(
      ops
        .filter((o) => {
          const status = /^(\d{3})\b/.exec(o.operation['x-lockstep-doc']?.success ?? '')?.[1];
          return status !== undefined && !(status in (o.operation.responses ?? {}));
        })
        .map(name),
      [],
      'operations whose Success cell names a status their responses do not have',
    );
  });

  test("a row's Body / query names exactly the inputs its route's schema takes", async (t) => {
    const ops = (await generator()).operations(doc);
    const wrong: string[] = [];
    for (const { method, path, operation } of ops) {
      const op = `${method} ${path}`;
      if (op in INPUTS_NOT_LISTED) continue;
      const input: string = operation['x-lockstep-doc']?.input ?? '';
      const named = [...input.matchAll(/`\{([^`}]*)\}`/g)].flatMap((m) => m[1]!.split(',').map((n) => n.trim()));
      const query = [...input.matchAll(/[?&]([\w.]+)=/g)].map((m) => m[1]!);
      const bodyTakes = Object.keys(operation.requestBody?.content?.['application/json']?.schema?.properties ?? {});
      const queryTakes = (operation.parameters ?? [])
        .filter((p: { in: string }) => p.in === 'query')
        .map((p: { name: string }) => p.name);
      for (const n of named.filter((n) => !bodyTakes.includes(n))) wrong.push(`${op}: names {${n}}, not in its body`);
      for (const n of bodyTakes.filter((n) => !named.includes(n))) wrong.push(`${op}: takes {${n}}, not named`);
      for (const n of query.filter((n) => !queryTakes.includes(n))) wrong.push(`${op}: names ?${n}=, not in its query`);
      for (const n of queryTakes.filter((n: string) => !query.includes(n)))
        wrong.push(`${op}: takes ?${n}=, not named`);
    }
    t.deepEqual(wrong, [], "x-lockstep-doc.input out of step with the route's schema");
  });

  test('the hand-written rows after the generated table are routes the document does not have', async (t) => {
    const gen = await generator();
    const text = fs.readFileSync(DOC, 'utf8');
    const after = text.slice(text.indexOf(gen.END));
    const documented = new Set(gen.operations(doc).map((o) => `${o.method} ${o.path.replace(/\{(\w+)\}/g, ':$1')}`));
    const rows = [...after.matchAll(/^\| ([A-Z, ]+|any) \| `([^`]+)`/gm)].flatMap(([, methods, path]) =>
      methods!.split(', ').map((m) => `${m} ${path}`),
    );
    t.true(rows.length >= 5, `the routes outside the document keep their rows (${rows.length})`);
    t.deepEqual(
      rows.filter((r) => documented.has(r)),
      [],
      'rows written by hand for operations the table already has',
    );
  });
});
