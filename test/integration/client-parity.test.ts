/**
 * Every operation of the HTTP API has a method in both clients: the
 * TypeScript client (lockstep/client) and the Python SDK, sync and asyncio
 * (issue 26, item 3). The operations come from a real server's
 * /openapi.json; OPERATIONS below names the method of each client that calls
 * each one, and an operation with no entry fails the test, so a new route
 * needs its client methods (or an entry saying why not). Every operationId
 * also has its generated Python functions, sync and asyncio, in
 * clients/python/lockstep/_wire.py (`npm run client:python`), sending the
 * operation's method and path. Then the methods added for issue 26 are
 * called against the server, from both languages.
 */
import test from 'ava';
import fs from 'node:fs';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import * as client from '../../src/client/index.js';
import type { RemoteCreateOptions } from '../../src/client/index.js';
import { integration, openTestLockstep } from '../helpers/harness.js';
import { startServer, tenantToken } from '../fixtures/http-client.js';

const PYTHON_DIR = fileURLToPath(new URL('../../../clients/python', import.meta.url));
const SCRIPT = fileURLToPath(new URL('../../../test/fixtures/client-parity.py', import.meta.url));
/** Debian's interpreter, as in python-sdk.test.ts: the SDK needs nothing else. */
const PYTHON = '/usr/bin/python3';

/**
 * The client method behind each operation. ts: "Class#method" (instance) or
 * "Class.method" (static) of lockstep/client. py and pyAsync: a class's
 * method or a function of the Python SDK; pyAsync null where the SDK has no
 * asyncio twin of that class yet (Snapshots), with the reason in `why`.
 */
interface Entry {
  ts: string;
  py: string;
  pyAsync: string | null;
  why?: string;
}
const NO_ASYNC_SNAPSHOTS = 'the Python SDK has no asyncio Snapshots class';
const OPERATIONS: Record<string, Entry> = {
  'POST /v1/sandboxes': { ts: 'Sandbox.create', py: 'Sandbox.create', pyAsync: 'AsyncSandbox.create' },
  'GET /v1/sandboxes': { ts: 'Sandbox.list', py: 'Sandbox.list', pyAsync: 'AsyncSandbox.list' },
  'GET /v1/sandboxes/{id}': { ts: 'Sandbox#info', py: 'Sandbox.get_info', pyAsync: 'AsyncSandbox.get_info' },
  'DELETE /v1/sandboxes/{id}': { ts: 'Sandbox#kill', py: 'Sandbox.kill', pyAsync: 'AsyncSandbox.kill' },
  'GET /v1/tenant': { ts: 'Tenant.info', py: 'get_tenant', pyAsync: 'get_tenant_async' },
  'GET /v1/images': { ts: 'Images.list', py: 'list_images', pyAsync: 'list_images_async' },

  'POST /v1/sandboxes/{id}/commands': { ts: 'RemoteCommands#run', py: 'Commands.run', pyAsync: 'AsyncCommands.run' },
  'GET /v1/sandboxes/{id}/commands': { ts: 'RemoteCommands#list', py: 'Commands.list', pyAsync: 'AsyncCommands.list' },
  'GET /v1/sandboxes/{id}/commands/{pid}/output': {
    ts: 'RemoteCommandHandle#output',
    py: 'CommandHandle.output',
    pyAsync: 'AsyncCommandHandle.output',
  },
  'POST /v1/sandboxes/{id}/commands/{pid}/wait': {
    ts: 'RemoteCommandHandle#wait',
    py: 'CommandHandle.wait',
    pyAsync: 'AsyncCommandHandle.wait',
  },
  'POST /v1/sandboxes/{id}/commands/{pid}/kill': {
    ts: 'RemoteCommandHandle#kill',
    py: 'CommandHandle.kill',
    pyAsync: 'AsyncCommandHandle.kill',
  },
  'POST /v1/sandboxes/{id}/commands/{pid}/stdin': {
    ts: 'RemoteCommandHandle#sendStdin',
    py: 'CommandHandle.send_stdin',
    pyAsync: 'AsyncCommandHandle.send_stdin',
  },
  'POST /v1/sandboxes/{id}/commands/{pid}/stdin/close': {
    ts: 'RemoteCommandHandle#closeStdin',
    py: 'CommandHandle.close_stdin',
    pyAsync: 'AsyncCommandHandle.close_stdin',
  },

  'POST /v1/sandboxes/{id}/pty': { ts: 'RemotePty#create', py: 'Pty.create', pyAsync: 'AsyncPty.create' },
  'GET /v1/sandboxes/{id}/pty': { ts: 'RemotePty#list', py: 'Pty.list', pyAsync: 'AsyncPty.list' },
  'GET /v1/sandboxes/{id}/pty/{pid}/output': {
    ts: 'RemotePtyHandle#output',
    py: 'PtyHandle.output',
    pyAsync: 'AsyncPtyHandle.output',
  },
  'GET /v1/sandboxes/{id}/pty/{pid}/stream': {
    ts: 'RemotePtyHandle#follow',
    py: 'PtyHandle.follow',
    pyAsync: 'AsyncPtyHandle.follow',
  },
  'POST /v1/sandboxes/{id}/pty/{pid}/input': {
    ts: 'RemotePtyHandle#write',
    py: 'PtyHandle.write',
    pyAsync: 'AsyncPtyHandle.write',
  },
  'POST /v1/sandboxes/{id}/pty/{pid}/resize': {
    ts: 'RemotePtyHandle#resize',
    py: 'PtyHandle.resize',
    pyAsync: 'AsyncPtyHandle.resize',
  },
  'POST /v1/sandboxes/{id}/pty/{pid}/wait': {
    ts: 'RemotePtyHandle#wait',
    py: 'PtyHandle.wait',
    pyAsync: 'AsyncPtyHandle.wait',
  },
  'POST /v1/sandboxes/{id}/pty/{pid}/kill': {
    ts: 'RemotePtyHandle#kill',
    py: 'PtyHandle.kill',
    pyAsync: 'AsyncPtyHandle.kill',
  },

  'GET /v1/sandboxes/{id}/files': { ts: 'RemoteFiles#read', py: 'Files.read', pyAsync: 'AsyncFiles.read' },
  'PUT /v1/sandboxes/{id}/files': { ts: 'RemoteFiles#write', py: 'Files.write', pyAsync: 'AsyncFiles.write' },
  'DELETE /v1/sandboxes/{id}/files': { ts: 'RemoteFiles#remove', py: 'Files.remove', pyAsync: 'AsyncFiles.remove' },
  'GET /v1/sandboxes/{id}/files/list': {
    ts: 'RemoteFiles#listPage',
    py: 'Files.list_page',
    pyAsync: 'AsyncFiles.list_page',
  },
  'GET /v1/sandboxes/{id}/files/exists': {
    ts: 'RemoteFiles#exists',
    py: 'Files.exists',
    pyAsync: 'AsyncFiles.exists',
  },

  'POST /v1/sandboxes/{id}/checkpoints': {
    ts: 'Sandbox#checkpoint',
    py: 'Sandbox.checkpoint',
    pyAsync: 'AsyncSandbox.checkpoint',
  },
  'GET /v1/sandboxes/{id}/checkpoints': {
    ts: 'Sandbox#checkpoints',
    py: 'Sandbox.checkpoints',
    pyAsync: 'AsyncSandbox.checkpoints',
  },
  'GET /v1/sandboxes/{id}/checkpoints/{ckpt}/context': {
    ts: 'Sandbox#context',
    py: 'Sandbox.context',
    pyAsync: 'AsyncSandbox.context',
  },
  'DELETE /v1/sandboxes/{id}/checkpoints/{ckpt}': {
    ts: 'Sandbox#deleteCheckpoint',
    py: 'Sandbox.delete_checkpoint',
    pyAsync: 'AsyncSandbox.delete_checkpoint',
  },
  'POST /v1/sandboxes/{id}/rollback': {
    ts: 'Sandbox#rollback',
    py: 'Sandbox.rollback',
    pyAsync: 'AsyncSandbox.rollback',
  },
  'POST /v1/sandboxes/{id}/fork': { ts: 'Sandbox#fork', py: 'Sandbox.fork', pyAsync: 'AsyncSandbox.fork' },
  'GET /v1/sandboxes/{id}/observations': {
    ts: 'Sandbox#observations',
    py: 'Sandbox.observations',
    pyAsync: 'AsyncSandbox.observations',
  },

  'POST /v1/sandboxes/{id}/effects': { ts: 'RemoteEffects#begin', py: 'Effects.begin', pyAsync: 'AsyncEffects.begin' },
  'GET /v1/sandboxes/{id}/effects': { ts: 'RemoteEffects#list', py: 'Effects.list', pyAsync: 'AsyncEffects.list' },
  'GET /v1/sandboxes/{id}/effects/{effectId}': {
    ts: 'RemoteEffects#get',
    py: 'Effects.get',
    pyAsync: 'AsyncEffects.get',
  },
  'POST /v1/sandboxes/{id}/effects/{effectId}/commit': {
    ts: 'RemoteEffects#commit',
    py: 'Effects.commit',
    pyAsync: 'AsyncEffects.commit',
  },
  'POST /v1/sandboxes/{id}/effects/{effectId}/fail': {
    ts: 'RemoteEffects#fail',
    py: 'Effects.fail',
    pyAsync: 'AsyncEffects.fail',
  },
  'POST /v1/sandboxes/{id}/effects/{effectId}/resolve': {
    ts: 'RemoteEffects#resolveUnknown',
    py: 'Effects.resolve_unknown',
    pyAsync: 'AsyncEffects.resolve_unknown',
  },
  'POST /v1/sandboxes/{id}/verdicts': {
    ts: 'RemoteVerdicts#record',
    py: 'Verdicts.record',
    pyAsync: 'AsyncVerdicts.record',
  },
  // One route, two methods: all verdicts, or (?stale=true) those whose file changed.
  'GET /v1/sandboxes/{id}/verdicts': {
    ts: 'RemoteVerdicts#stale',
    py: 'Verdicts.stale',
    pyAsync: 'AsyncVerdicts.stale',
  },

  'POST /v1/sandboxes/{id}/ports': { ts: 'RemotePorts#expose', py: 'Ports.expose', pyAsync: 'AsyncPorts.expose' },
  'GET /v1/sandboxes/{id}/ports': { ts: 'RemotePorts#list', py: 'Ports.list', pyAsync: 'AsyncPorts.list' },
  'DELETE /v1/sandboxes/{id}/ports/{port}': {
    ts: 'RemotePorts#close',
    py: 'Ports.close',
    pyAsync: 'AsyncPorts.close',
  },

  'POST /v1/snapshots': { ts: 'Snapshots#create', py: 'Snapshots.create', pyAsync: null, why: NO_ASYNC_SNAPSHOTS },
  'GET /v1/snapshots': { ts: 'Snapshots#list', py: 'Snapshots.list', pyAsync: null, why: NO_ASYNC_SNAPSHOTS },
  'GET /v1/snapshots/{snap}': { ts: 'Snapshots#get', py: 'Snapshots.get', pyAsync: null, why: NO_ASYNC_SNAPSHOTS },
  'DELETE /v1/snapshots/{snap}': {
    ts: 'Snapshots#delete',
    py: 'Snapshots.delete',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'GET /v1/snapshots/{snap}/context': {
    ts: 'Snapshots#context',
    py: 'Snapshots.context',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'POST /v1/snapshots/{snap}/sandboxes': {
    ts: 'Snapshots#start',
    py: 'Snapshots.start',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'GET /v1/snapshots/{snap}/bundle': {
    ts: 'Snapshots#export',
    py: 'Snapshots.export',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'POST /v1/snapshots/import': {
    ts: 'Snapshots#import',
    py: 'Snapshots.import_',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'POST /v1/snapshots/pull': { ts: 'Snapshots#pull', py: 'Snapshots.pull', pyAsync: null, why: NO_ASYNC_SNAPSHOTS },
  'POST /v1/snapshots/{snap}/push': {
    ts: 'Snapshots#push',
    py: 'Snapshots.push',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'GET /v1/store/bundles': {
    ts: 'Snapshots#listStored',
    py: 'Snapshots.list_stored',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'POST /v1/store/bundles/{key}/pull': {
    ts: 'Snapshots#pull',
    py: 'Snapshots.pull_stored',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
  'DELETE /v1/store/bundles/{key}': {
    ts: 'Snapshots#deleteStored',
    py: 'Snapshots.delete_stored',
    pyAsync: null,
    why: NO_ASYNC_SNAPSHOTS,
  },
};

/** The same methods as OPERATIONS names, for the second method of a route that has two. */
const ALSO: Entry[] = [{ ts: 'RemoteVerdicts#list', py: 'Verdicts.list', pyAsync: 'AsyncVerdicts.list' }];

/**
 * Create's options in the TypeScript client, as the API names them: typed,
 * so each is checked against RemoteCreateOptions by the compiler. The Python
 * SDK takes them as keyword arguments in snake_case.
 */
const TS_CREATE_OPTIONS: (keyof RemoteCreateOptions)[] = [
  'image',
  'memoryMb',
  'pids',
  'cpuWeight',
  'cpus',
  'ioWeight',
  'diskMb',
  'envs',
  'network',
  'allowOut',
  'bandwidthMbit',
  'timeoutMs',
  'fromSnapshot',
  'metadata',
];
/** Rollback's options in the TypeScript client (checkpointId is its first argument). */
const TS_ROLLBACK_OPTIONS: (keyof NonNullable<Parameters<client.Sandbox['rollback']>[1]>)[] = [
  'policy',
  'failure',
  'lessons',
  'withRecoverySummary',
];

const snake = (s: string) => s.replace(/[A-Z]/g, (c) => '_' + c.toLowerCase());

/** The client function a "Class#method" or "Class.method" names, if lockstep/client has it. */
function tsMethod(name: string): unknown {
  const m = /^(\w+)([#.])(\w+)$/.exec(name);
  if (!m) return undefined;
  const cls = (client as unknown as Record<string, { prototype: Record<string, unknown> } & Record<string, unknown>>)[
    m[1]!
  ];
  if (!cls) return undefined;
  return m[2] === '#' ? cls.prototype[m[3]!] : cls[m[3]!];
}

/** Runs the Python script; resolves with its JSON output (the test fails with its output otherwise). */
function python(args: string[], env: NodeJS.ProcessEnv): Promise<any> {
  return new Promise((resolve, reject) => {
    const child = spawn(PYTHON, [SCRIPT, ...args], {
      env: { PATH: '/usr/bin:/bin', PYTHONPATH: PYTHON_DIR, PYTHONDONTWRITEBYTECODE: '1', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    child.on('error', reject);
    child.on('close', (code) => {
      if (code !== 0) return reject(new Error(`${SCRIPT} ${args[0]} exited with ${code}:\n${err}${out}`));
      try {
        resolve(JSON.parse(out));
      } catch {
        reject(new Error(`${SCRIPT} printed no JSON:\n${out}${err}`));
      }
    });
  });
}

/** A JSON schema's properties, as /openapi.json shows a route's JSON body. */
function bodyProperties(doc: any, method: string, path: string): string[] {
  const schema = doc.paths[path][method].requestBody.content['application/json'].schema;
  return Object.keys(schema.properties);
}

integration(test, () => {
  test.serial('every operation of /openapi.json has a method in the TypeScript and Python clients', async (t) => {
    t.timeout(120_000);
    if (!fs.existsSync(PYTHON)) return t.fail(`${PYTHON} is missing: run npm run setup`);
    const ls = await openTestLockstep(t);
    const { client: api } = await startServer(t, ls);
    const doc = (await api.get('/openapi.json')).body;

    const operations: string[] = [];
    /** Each operation's operationId (http-reference.test.ts checks that there is one, unique). */
    const operationIds: Record<string, string> = {};
    for (const [path, item] of Object.entries(doc.paths as Record<string, Record<string, { operationId?: string }>>))
      for (const [method, operation] of Object.entries(item))
        if (['get', 'put', 'post', 'delete', 'patch'].includes(method)) {
          operations.push(`${method.toUpperCase()} ${path}`);
          operationIds[`${method.toUpperCase()} ${path}`] = operation.operationId ?? '(no operationId)';
        }
    t.true(operations.length > 50, `the document lists the API's operations (${operations.length})`);
    t.deepEqual(
      operations.filter((op) => !OPERATIONS[op]).map((op) => `${op} (${operationIds[op]})`),
      [],
      'operations with no entry in OPERATIONS: give each its client methods',
    );
    t.deepEqual(
      Object.keys(OPERATIONS).filter((op) => !operations.includes(op)),
      [],
      'entries of OPERATIONS the API no longer has',
    );

    const entries = [...Object.values(OPERATIONS), ...ALSO];
    t.deepEqual(
      entries.filter((e) => typeof tsMethod(e.ts) !== 'function').map((e) => e.ts),
      [],
      'methods missing from lockstep/client',
    );
    for (const e of entries) if (e.pyAsync === null) t.truthy(e.why, `${e.py} has no asyncio twin: say why`);
    const names = entries.flatMap((e) => [e.py, ...(e.pyAsync ? [e.pyAsync] : [])]);
    const found: Record<string, boolean> = await python(['methods', ...names], {});
    t.deepEqual(
      names.filter((n) => !found[n]),
      [],
      'methods missing from the Python SDK',
    );

    // Every operation has its generated functions in lockstep._wire, with its method and path.
    const wire: { functions: Record<string, 'sync' | 'async'>; routes: Record<string, [string, string]> } =
      await python(['wire'], {});
    const ids = Object.values(operationIds);
    t.deepEqual(
      ids.filter((id) => wire.functions[snake(id)] !== 'sync' || wire.functions[`${snake(id)}_async`] !== 'async'),
      [],
      'operationIds without a generated sync and async function in lockstep._wire: run `npm run client:python`',
    );
    t.deepEqual(
      Object.keys(wire.functions).filter((f) => !ids.some((id) => f === snake(id) || f === `${snake(id)}_async`)),
      [],
      'functions of lockstep._wire for operations the API no longer has',
    );
    t.deepEqual(
      Object.fromEntries(Object.entries(wire.routes).map(([id, [m, p]]) => [id, `${m} /v1${p}`])),
      Object.fromEntries(Object.entries(operationIds).map(([op, id]) => [id, op])),
      "lockstep._wire.ROUTES: each operation's method and path, as /openapi.json has them",
    );

    // Every option create and rollback accept, in both clients.
    const createProps = bodyProperties(doc, 'post', '/v1/sandboxes');
    const rollbackProps = bodyProperties(doc, 'post', '/v1/sandboxes/{id}/rollback').filter(
      (p) => p !== 'checkpointId',
    );
    t.deepEqual(
      createProps.filter((p) => !(TS_CREATE_OPTIONS as string[]).includes(p)),
      [],
      "create's options missing from the TypeScript client",
    );
    t.deepEqual(
      rollbackProps.filter((p) => !(TS_ROLLBACK_OPTIONS as string[]).includes(p)),
      [],
      "rollback's options missing from the TypeScript client",
    );
    const kw: Record<string, string[]> = await python(['options'], {});
    t.deepEqual(
      createProps.map(snake).filter((p) => !kw.create!.includes(p)),
      [],
      "create's options missing from the Python SDK",
    );
    t.deepEqual(
      rollbackProps.map(snake).filter((p) => !kw.rollback!.includes(p)),
      [],
      "rollback's options missing from the Python SDK",
    );
  });

  test.serial('the methods issue 26 added answer from a real server, in TypeScript', async (t) => {
    t.timeout(180_000);
    const ls = await openTestLockstep(t);
    const { client: api } = await startServer(t, ls);
    const conn = { apiUrl: api.base, apiKey: tenantToken(ls, 'parity-ts') };

    const tenant = await client.Tenant.info(conn);
    t.regex(tenant.id, /^tn_/);
    t.is(tenant.name, 'parity-ts');
    t.is(tenant.usage.sandboxes, 0);

    const sbx = await client.Sandbox.create({ ...conn, memoryMb: 64, pids: 64, cpuWeight: 50, cpus: 0.5 });
    t.teardown(() => sbx.kill().then(() => undefined));
    const info = await sbx.info();
    t.like(info, { pids: 64, cpuWeight: 50, cpus: 0.5 });
    t.is((await client.Tenant.info(conn)).usage.sandboxes, 1);

    const context = { format: 'openai-chat', messages: [{ role: 'user', content: 'from ts' }] };
    await sbx.files.write('notes.txt', 'one\n');
    const ck = await sbx.checkpoint({ label: 'kept', context });
    const extra = await sbx.checkpoint({ label: 'dropped' });
    t.deepEqual(await sbx.context(ck.id), context);
    t.is(await sbx.context(extra.id), null);
    await sbx.deleteCheckpoint(extra.id);
    t.deepEqual(
      (await sbx.checkpoints()).map((c) => c.id),
      [ck.id],
    );
    await t.throwsAsync(sbx.context(extra.id), { code: 'CHECKPOINT_NOT_FOUND' });

    const begun = await sbx.effects.begin({
      kind: 'payment.charge',
      input: { cents: 5 },
      key: 'ts-1',
      reversibility: 'irreversible',
    });
    await sbx.effects.fail(begun.effectId, new Error('no answer'), { definite: false });
    t.is((await sbx.effects.get(begun.effectId)).status, 'unknown');
    const resolved = await sbx.effects.resolveUnknown(begun.effectId, {
      outcome: 'committed',
      output: { chargeId: 'ch_1' },
    });
    t.like(resolved, { id: begun.effectId, status: 'committed', output: { chargeId: 'ch_1' } });
    t.like(await sbx.effects.get(begun.effectId), { status: 'committed', output: { chargeId: 'ch_1' } });

    const verdict = await sbx.verdicts.record({ path: 'notes.txt', verdict: 'reviewed', toolCallId: 'call-ts' });
    t.like(verdict, { verdict: 'reviewed', toolCallId: 'call-ts' });
    t.regex(verdict.path, /notes\.txt$/);
    t.regex(verdict.contentHash, /^[0-9a-f]{64}$/);
    t.deepEqual(
      (await sbx.verdicts.list()).map((v) => v.id),
      [verdict.id],
    );
    t.deepEqual(await sbx.verdicts.stale(), []);
    await sbx.files.write('notes.txt', 'two\n');
    t.deepEqual(
      (await sbx.verdicts.stale()).map((v) => v.id),
      [verdict.id],
    );

    const bare = await sbx.rollback(ck.id, { withRecoverySummary: false });
    t.is(bare.checkpointId, ck.id);
    t.false('recoverySummary' in bare);
    t.false('contextWithRecovery' in bare);
    const full = await sbx.rollback(ck.id, { failure: 'tried' });
    t.true('recoverySummary' in full);
    t.deepEqual(full.context, context);
  });

  test.serial('the methods issue 26 added answer from a real server, in Python (sync and asyncio)', async (t) => {
    t.timeout(300_000);
    if (!fs.existsSync(PYTHON)) return t.fail(`${PYTHON} is missing: run npm run setup`);
    const ls = await openTestLockstep(t);
    const { client: api } = await startServer(t, ls);
    const r = await python(['live'], {
      LOCKSTEP_API_URL: api.base,
      LOCKSTEP_API_KEY: tenantToken(ls, 'parity-py'),
    });

    t.regex(r.tenant.id, /^tn_/);
    t.is(r.tenant.name, 'parity-py');
    t.is(r.tenant.usage.sandboxes, 0);
    t.like(r.info, { pids: 64, cpuWeight: 50, cpus: 0.5 });

    t.deepEqual(r.context, { format: 'openai-chat', messages: [{ role: 'user', content: 'from python' }] });
    t.is(r.extraContext, null);
    t.deepEqual(r.checkpointsAfterDelete, [r.checkpointId]);
    t.is(r.deletedContextError, 'CHECKPOINT_NOT_FOUND');

    t.is(r.effectBefore.status, 'unknown');
    t.like(r.effectResolved, { id: r.effectBefore.id, status: 'committed', output: { chargeId: 'ch_1' } });
    t.like(r.effectAfter, { status: 'committed', output: { chargeId: 'ch_1' } });

    t.like(r.verdict, { verdict: 'reviewed', toolCallId: 'call-py' });
    t.regex(r.verdict.path, /notes\.txt$/);
    t.deepEqual(
      r.verdictsBefore.map((v: { id: string }) => v.id),
      [r.verdict.id],
    );
    t.deepEqual(r.staleBefore, []);
    t.deepEqual(
      r.staleAfter.map((v: { id: string }) => v.id),
      [r.verdict.id],
    );

    t.is(r.rollbackBare.checkpointId, r.checkpointId);
    t.false('recoverySummary' in r.rollbackBare);
    t.true('recoverySummary' in r.rollbackFull);

    const a = r.async;
    t.is(a.tenant.id, r.tenant.id);
    t.deepEqual(a.context, { format: 'openai-chat', messages: [{ role: 'user', content: 'async' }] });
    t.deepEqual(a.checkpoints, [a.checkpointId]);
    t.is(a.effect.status, 'failed');
    t.like(a.verdict, { verdict: 'ok' });
    t.regex(a.verdict.path, /a\.txt$/);
    t.deepEqual(
      a.verdicts.map((v: { id: string }) => v.id),
      [a.verdict.id],
    );
    t.deepEqual(a.stale, []);
    t.false('recoverySummary' in a.rollback);
  });
});
