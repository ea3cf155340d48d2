/**
 * LockstepSaver against a fake sandbox (no root): the fake keeps a checkpoint
 * tree, a head, a "filesystem" (a Map) and stores contexts in the real
 * ContextStore, so what the saver hands Lockstep must survive the real
 * validation and msgpack round trip. Real LangGraph graphs run on top.
 */
import test from 'ava';
import Database from 'better-sqlite3';
import { EXTENSIONS_TABLE } from '../../src/catalog/schema/extensions.js';
import { HumanMessage, AIMessage } from '@langchain/core/messages';
import {
  Annotation,
  Command,
  MessagesAnnotation,
  START,
  END,
  StateGraph,
  interrupt,
  type LangGraphRunnableConfig,
} from '@langchain/langgraph';
import {
  TASKS,
  emptyCheckpoint,
  uuid6,
  type Checkpoint,
  type CheckpointMetadata,
} from '@langchain/langgraph-checkpoint';
import { ContextStore } from '../../src/context/context-store.js';
import type { AgentContext } from '../../src/context/formats.js';
import { NotFoundError } from '../../src/errors.js';
import { LockstepSaver, type SaverSandbox, type TimeTravelEvent } from '../../src/integrations/langgraph.js';

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

interface FakeCheckpoint {
  id: string;
  parentId: string | null;
  label: string | null;
  contextId: string | null;
  files: Map<string, string>;
}

/** A sandbox whose filesystem is a Map; checkpoints copy it, rollback restores it. */
class FakeSandbox {
  head: string | null = null;
  files = new Map<string, string>();
  readonly ckpts = new Map<string, FakeCheckpoint>();
  rollbacks: string[] = [];
  private n = 0;
  constructor(
    readonly id: string,
    private readonly db: Database.Database,
    private readonly contexts: ContextStore,
  ) {}

  // Slow like the real thing, so a graph that ran nodes before a checkpoint or
  // rollback finished would be caught.
  async checkpoint(opts: { label?: string; context?: unknown } = {}) {
    await sleep(15);
    const id = `ckpt_${this.id}_${++this.n}`;
    const contextId = opts.context === undefined ? null : this.contexts.put(opts.context).contextId;
    this.ckpts.set(id, { id, parentId: this.head, label: opts.label ?? null, contextId, files: new Map(this.files) });
    this.db.prepare('INSERT INTO checkpoints (id) VALUES (?)').run(id);
    this.head = id;
    return { id, parentId: this.ckpts.get(id)!.parentId, label: opts.label ?? null };
  }
  async rollback(id: string) {
    await sleep(15);
    const c = this.ckpts.get(id);
    if (!c) throw new NotFoundError('checkpoint', id);
    this.files = new Map(c.files);
    this.head = id;
    this.rollbacks.push(id);
    return { checkpointId: id, staleObservations: [], effectsAfter: [], warnings: [] };
  }
  checkpoints() {
    return [...this.ckpts.values()].map((c) => ({ id: c.id, parentId: c.parentId, label: c.label }));
  }
  info() {
    return { id: this.id, headCheckpointId: this.head };
  }
  context(id: string): AgentContext | null {
    const c = this.ckpts.get(id);
    if (!c) throw new NotFoundError('checkpoint', id);
    return c.contextId ? this.contexts.get(c.contextId) : null;
  }
  async deleteCheckpoint(id: string) {
    const c = this.ckpts.get(id);
    if (!c) throw new NotFoundError('checkpoint', id);
    for (const k of this.ckpts.values()) if (k.parentId === id) k.parentId = c.parentId;
    if (this.head === id) this.head = c.parentId;
    this.ckpts.delete(id);
    this.db.prepare('DELETE FROM checkpoints WHERE id = ?').run(id);
  }
  get saverView(): SaverSandbox {
    return this as unknown as SaverSandbox;
  }
}

function world() {
  const db = new Database(':memory:');
  db.exec('CREATE TABLE checkpoints (id TEXT PRIMARY KEY)');
  db.exec(EXTENSIONS_TABLE);
  const contexts = new ContextStore(db);
  const sandboxes = new Map<string, FakeSandbox>();
  const make = (id: string) => {
    const sb = new FakeSandbox(id, db, contexts);
    sandboxes.set(id, sb);
    return sb;
  };
  const lockstep = {
    get: (id: string) => {
      const sb = sandboxes.get(id);
      if (!sb) throw new NotFoundError('sandbox', id);
      return sb.saverView;
    },
  };
  return { db, contexts, make, lockstep, sandboxes };
}

const SYNC = { durability: 'sync' } as const;

/** A checkpoint whose every channel is at version 1: put it with `channel_versions` as newVersions to store them all. */
function ckpt(channelValues: Record<string, unknown> = {}): Checkpoint {
  const versions = Object.fromEntries(Object.keys(channelValues).map((k) => [k, 1]));
  return { ...emptyCheckpoint(), id: uuid6(-1), channel_values: channelValues, channel_versions: versions };
}
const md = (step: number, extra: Record<string, unknown> = {}): CheckpointMetadata => ({
  source: 'loop',
  step,
  parents: {},
  ...extra,
});
const cfg = (thread: string, id?: string, ns = '') => ({
  configurable: { thread_id: thread, checkpoint_ns: ns, ...(id ? { checkpoint_id: id } : {}) },
});

test('put stores the checkpoint as a langgraph context and getTuple revives class instances', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const cp = ckpt({
    messages: [new HumanMessage('fix the build'), new AIMessage('on it')],
    seen: new Set(['a', 'b']),
    nothing: undefined,
  });
  const returned = await saver.put({ ...cfg('t1'), ...SYNC }, cp, md(0, { writer: 'me' }), cp.channel_versions);
  t.deepEqual(returned, { configurable: { thread_id: 't1', checkpoint_ns: '', checkpoint_id: cp.id } });

  const [lockstepCkpt] = sb.checkpoints();
  t.is(lockstepCkpt!.label, `langgraph:${cp.id}`);
  t.is(saver.lockstepCheckpointId(returned), lockstepCkpt!.id);
  const ctx = sb.context(lockstepCkpt!.id);
  t.is(ctx?.format, 'langgraph');
  if (ctx?.format !== 'langgraph') return;
  // Plain LangChain-serialized dicts, the shape Lockstep's recovery note writes.
  const stored = (ctx.checkpoint.channel_values as { messages: { lc: number; id: string[] }[] }).messages;
  t.deepEqual(
    stored.map((m) => [m.lc, m.id.at(-1)]),
    [
      [1, 'HumanMessage'],
      [1, 'AIMessage'],
    ],
  );
  t.deepEqual(ctx.metadata, { source: 'loop', step: 0, parents: {}, writer: 'me' });
  t.deepEqual(ctx.config, returned);

  const tuple = await saver.getTuple(returned);
  t.truthy(tuple);
  const values = tuple!.checkpoint.channel_values as { messages: unknown[]; seen: Set<string>; nothing?: unknown };
  t.true(values.messages[0] instanceof HumanMessage);
  t.is((values.messages[1] as AIMessage).content, 'on it');
  t.deepEqual(values.seen, new Set(['a', 'b']));
  t.true('nothing' in values && values.nothing === undefined);
  t.deepEqual(tuple!.metadata, { source: 'loop', step: 0, parents: {}, writer: 'me' });
  t.deepEqual(tuple!.config, returned);
  t.is(tuple!.parentConfig, undefined);
  t.deepEqual(tuple!.pendingWrites, []);
});

test('getTuple: newest of the thread without an id, undefined for unknown ids and threads', async (t) => {
  const w = world();
  const saver = new LockstepSaver({ sandbox: w.make('sb1').saverView, db: w.db });
  const a = ckpt({ n: 1 });
  const b = ckpt({ n: 2 });
  await saver.put({ ...cfg('t1'), ...SYNC }, a, md(0), {});
  await saver.put({ ...cfg('t1', a.id), ...SYNC }, b, md(1), {});
  const latest = await saver.getTuple(cfg('t1'));
  t.is(latest?.checkpoint.id, b.id);
  t.deepEqual(latest?.parentConfig, cfg('t1', a.id));
  t.is((await saver.getTuple(cfg('t1', a.id)))?.checkpoint.id, a.id);
  t.is(await saver.getTuple(cfg('t1', uuid6(-1))), undefined);
  t.is(await saver.getTuple(cfg('nobody')), undefined);
  t.is(await saver.getTuple({ configurable: {} }), undefined);
  t.is(await saver.getTuple(cfg('t1', undefined, 'sub:1')), undefined);
});

test('putWrites round-trips in writesSortKey order; special writes replace, ordinary ones keep the first', async (t) => {
  const w = world();
  const saver = new LockstepSaver({ sandbox: w.make('sb1').saverView, db: w.db });
  const a = ckpt();
  const config = await saver.put({ ...cfg('t1'), ...SYNC }, a, md(0), {});
  await saver.putWrites(
    config,
    [
      ['log', 'from task b'],
      ['branch:to:x', null],
    ],
    'task-b',
    'path~1',
  );
  await saver.putWrites(config, [['log', { deep: [1, new Set([2])] }]], 'task-a', 'path~1');
  await saver.putWrites(config, [['log', 'input']], 'task-z');
  await saver.putWrites(config, [['log', 'retry must not replace']], 'task-b', 'path~1');
  await saver.putWrites(config, [['__error__', 'first error']], 'task-c', 'path~2');
  await saver.putWrites(config, [['__error__', 'second error']], 'task-c', 'path~2');
  const tuple = await saver.getTuple(config);
  t.deepEqual(tuple!.pendingWrites, [
    ['task-z', 'log', 'input'],
    ['task-a', 'log', { deep: [1, new Set([2])] }],
    ['task-b', 'log', 'from task b'],
    ['task-b', 'branch:to:x', null],
    ['task-c', '__error__', 'second error'],
  ]);
  await t.throwsAsync(saver.putWrites(cfg('t1'), [['x', 1]], 'task'), { code: 'INVALID_ARGUMENT' });
});

test('list: newest first, before, limit, metadata filter, namespaces and threads', async (t) => {
  const w = world();
  const saver = new LockstepSaver({ sandbox: w.make('sb1').saverView, db: w.db });
  const ids: string[] = [];
  let parent: string | undefined;
  for (let i = 0; i < 5; i++) {
    const c = ckpt({ i });
    await saver.put(
      { ...cfg('t1', parent), ...SYNC },
      c,
      md(i, { kind: i % 2 ? 'odd' : 'even', tags: { i: i % 2 } }),
      {},
    );
    ids.push(c.id);
    parent = c.id;
  }
  const sub = ckpt();
  await saver.put({ ...cfg('t1', undefined, 'child:1'), ...SYNC }, sub, md(0), {});
  const other = ckpt();
  await saver.put({ ...cfg('t2'), ...SYNC }, other, md(0), {});

  const collect = async (config: object, opts?: object) => {
    const out: string[] = [];
    for await (const tup of saver.list(config, opts)) out.push(tup.checkpoint.id);
    return out;
  };
  t.deepEqual(await collect(cfg('t1')), [...ids].reverse());
  t.deepEqual(await collect({ configurable: { thread_id: 't1' } }), [sub.id, ...[...ids].reverse()]);
  t.deepEqual(await collect(cfg('t1'), { limit: 2 }), [ids[4], ids[3]]);
  t.deepEqual(await collect(cfg('t1'), { before: cfg('t1', ids[3]) }), [ids[2], ids[1], ids[0]]);
  t.deepEqual(await collect(cfg('t1'), { filter: { kind: 'odd' } }), [ids[3], ids[1]]);
  t.deepEqual(await collect(cfg('t1'), { filter: { kind: 'even' }, limit: 2 }), [ids[4], ids[2]]);
  t.deepEqual(await collect(cfg('t1'), { filter: { tags: { i: 1 } } }), [ids[3], ids[1]]);
  t.deepEqual(await collect(cfg('t1'), { filter: { kind: 'none' } }), []);
  t.deepEqual(await collect(cfg('t1', ids[2])), [ids[2]]);
  t.deepEqual(await collect({ configurable: {} }), [other.id, sub.id, ...[...ids].reverse()]);
  await t.throwsAsync(collect(cfg('t1'), { limit: -1 }), { code: 'INVALID_ARGUMENT' });
});

test('a put from an earlier parent rolls the sandbox back first; other threads, subgraphs and manual checkpoints do not', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const events: TimeTravelEvent[] = [];
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db, onTimeTravel: (e) => void events.push(e) });
  const c1 = ckpt();
  const c2 = ckpt();
  const c3 = ckpt();
  sb.files.set('/a.txt', 'A');
  await saver.put({ ...cfg('t1'), ...SYNC }, c1, md(0), {});
  sb.files.set('/a.txt', 'AB');
  await sb.checkpoint({ label: 'by hand' });
  await saver.put({ ...cfg('t1', c1.id), ...SYNC }, c2, md(1), {});
  // A subgraph and another thread checkpoint in between: still at c2 for (t1, '').
  await saver.put({ ...cfg('t1', undefined, 'node:task'), ...SYNC }, ckpt(), md(0), {});
  await saver.put({ ...cfg('t2'), ...SYNC }, ckpt(), md(0), {});
  sb.files.set('/a.txt', 'ABC');
  await saver.put({ ...cfg('t1', c2.id), ...SYNC }, c3, md(2), {});
  t.deepEqual(sb.rollbacks, []);

  // Replay from c1: LangGraph puts a fork whose parent is c1.
  const fork = ckpt();
  await saver.put({ ...cfg('t1', c1.id), ...SYNC }, fork, md(1, { source: 'fork' }), {});
  const l1 = saver.lockstepCheckpointId(cfg('t1', c1.id))!;
  t.deepEqual(sb.rollbacks, [l1]);
  t.is(sb.files.get('/a.txt'), 'A');
  t.is(sb.ckpts.get(sb.head!)!.parentId, l1, 'the fork checkpoint is a child of c1 in the sandbox tree');
  t.is(events.length, 1);
  t.like(events[0]!, {
    threadId: 't1',
    checkpointNs: '',
    checkpointId: c1.id,
    lockstepCheckpointId: l1,
    previousCheckpointId: c3.id,
  });

  // updateState on c2 (a bare config, no durability needed) moves the sandbox again.
  await saver.put(cfg('t1', c2.id), ckpt(), md(2, { source: 'update' }), {});
  t.is(sb.files.get('/a.txt'), 'AB');
  t.is(sb.rollbacks.length, 2);
});

test('a run that starts from an earlier checkpoint rolls back in getTuple; getState does not', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const c1 = ckpt();
  sb.files.set('/f', '1');
  await saver.put({ ...cfg('t1'), ...SYNC }, c1, md(0), {});
  sb.files.set('/f', '2');
  await saver.put({ ...cfg('t1', c1.id), ...SYNC }, ckpt(), md(1), {});
  t.is((await saver.getTuple(cfg('t1', c1.id)))?.checkpoint.id, c1.id);
  t.deepEqual(sb.rollbacks, [], 'a bare config (getState) only reads');
  await saver.getTuple({ ...cfg('t1'), recursionLimit: 25, ...SYNC });
  t.deepEqual(sb.rollbacks, [], 'a run from the newest checkpoint does not move the sandbox');
  t.is((await saver.getTuple({ ...cfg('t1', c1.id), recursionLimit: 25, ...SYNC }))?.checkpoint.id, c1.id);
  t.is(sb.rollbacks.length, 1);
  t.is(sb.files.get('/f'), '1');
  await saver.getTuple({ ...cfg('t1', c1.id), recursionLimit: 25, ...SYNC });
  t.is(sb.rollbacks.length, 1, 'already there');
  await t.throwsAsync(saver.getTuple({ ...cfg('t1', c1.id), recursionLimit: 25 }), { code: 'INVALID_ARGUMENT' });
});

test('followTimeTravel: false never rolls back', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db, followTimeTravel: false });
  const c1 = ckpt();
  await saver.put({ ...cfg('t1'), ...SYNC }, c1, md(0), {});
  await saver.put({ ...cfg('t1', c1.id), ...SYNC }, ckpt(), md(1), {});
  await saver.put({ ...cfg('t1', c1.id), ...SYNC }, ckpt(), md(1, { source: 'fork' }), {});
  await saver.getTuple({ ...cfg('t1', c1.id), recursionLimit: 25, ...SYNC });
  t.deepEqual(sb.rollbacks, []);
  t.throws(
    () => new LockstepSaver({ sandbox: sb.saverView, db: w.db, followTimeTravel: 'yes' as unknown as boolean }),
    { code: 'INVALID_ARGUMENT' },
  );
});

test('a running graph must checkpoint with durability "sync"', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const err = await t.throwsAsync(saver.put({ ...cfg('t1'), recursionLimit: 25 }, ckpt(), md(0), {}), {
    code: 'INVALID_ARGUMENT',
  });
  t.is((err as unknown as { field: string }).field, 'config.durability');
  await t.throwsAsync(
    saver.put(
      { ...cfg('t1'), recursionLimit: 25, durability: 'async' } as object,
      ckpt(),
      md(0, { source: 'input' }),
      {},
    ),
    { code: 'INVALID_ARGUMENT' },
  );
  t.is(sb.checkpoints().length, 0, 'refused before touching the sandbox');
  await saver.put(
    { ...cfg('t1'), recursionLimit: 25, configurable: { ...cfg('t1').configurable, __pregel_durability: 'sync' } },
    ckpt(),
    md(0),
    {},
  );
  // updateState, or copying checkpoints in from another saver: a bare config, no nodes running.
  await saver.put(cfg('t1'), ckpt(), md(0, { source: 'update' }), {});
  await saver.put(cfg('t2'), ckpt(), md(3), {});
  t.is(sb.checkpoints().length, 3);
  await t.throwsAsync(saver.put({ configurable: {}, ...SYNC }, ckpt(), md(0), {}), { code: 'INVALID_ARGUMENT' });
});

test('writes for a checkpoint the sandbox is not at are refused', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const c1 = ckpt();
  const c1cfg = await saver.put({ ...cfg('t1'), ...SYNC }, c1, md(0), {});
  await saver.put({ ...cfg('t1', c1.id), ...SYNC }, ckpt(), md(1), {});
  await t.throwsAsync(saver.putWrites(c1cfg, [['log', 'x']], 'task'), { code: 'LANGGRAPH_SANDBOX_DIVERGED' });
  t.deepEqual((await saver.getTuple(c1cfg))!.pendingWrites, []);
});

test('deleteThread removes its Lockstep checkpoints and writes and leaves other threads', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const c1 = ckpt();
  const c1cfg = await saver.put({ ...cfg('t1'), ...SYNC }, c1, md(0), {});
  await saver.putWrites(c1cfg, [['log', 'x']], 'task');
  await saver.put({ ...cfg('t1', c1.id), ...SYNC }, ckpt(), md(1), {});
  const keep = await saver.put({ ...cfg('t2'), ...SYNC }, ckpt(), md(0), {});
  t.is(sb.checkpoints().length, 3);
  await saver.deleteThread('t1');
  t.is(await saver.getTuple(cfg('t1')), undefined);
  t.deepEqual(
    sb.checkpoints().map((c) => c.label),
    [`langgraph:${keep.configurable!.checkpoint_id}`],
  );
  t.is((w.db.prepare('SELECT COUNT(*) AS n FROM langgraph_writes').get() as { n: number }).n, 0);
  t.truthy(await saver.getTuple(cfg('t2')));
  await saver.deleteThread('t1');
});

test('a Lockstep checkpoint deleted behind the saver hides its LangGraph checkpoint', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const c1 = ckpt();
  const c1cfg = await saver.put({ ...cfg('t1'), ...SYNC }, c1, md(0), {});
  await sb.deleteCheckpoint(saver.lockstepCheckpointId(c1cfg)!);
  t.is(await saver.getTuple(c1cfg), undefined);
  new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  t.is((w.db.prepare('SELECT COUNT(*) AS n FROM langgraph_checkpoints').get() as { n: number }).n, 0);
});

test('per-thread mode: sandboxFor is asked once per new thread, later puts and reads find the thread', async (t) => {
  const w = world();
  const asked: string[] = [];
  const saver = new LockstepSaver({
    lockstep: w.lockstep,
    db: w.db,
    sandboxFor: async (threadId) => {
      asked.push(threadId);
      return w.make(`sb-${threadId}`).saverView;
    },
  });
  const a1 = ckpt();
  await saver.put({ ...cfg('a'), ...SYNC }, a1, md(0), {});
  await saver.put({ ...cfg('a', a1.id), ...SYNC }, ckpt(), md(1), {});
  await saver.put({ ...cfg('b'), ...SYNC }, ckpt(), md(0), {});
  t.deepEqual(asked, ['a', 'b']);
  t.is(w.sandboxes.get('sb-a')!.checkpoints().length, 2);
  t.is(w.sandboxes.get('sb-b')!.checkpoints().length, 1);
  // A fresh saver (a restarted process) finds thread a's sandbox from the catalog.
  const again = new LockstepSaver({ lockstep: w.lockstep, db: w.db, sandboxFor: () => t.fail('not asked') as never });
  t.is((await again.getTuple(cfg('a')))?.metadata?.step, 1);
  await again.put({ ...cfg('a', a1.id), ...SYNC }, ckpt(), md(1, { source: 'fork' }), {});
  t.is(w.sandboxes.get('sb-a')!.rollbacks.length, 1);
  t.throws(() => new LockstepSaver({ lockstep: w.lockstep, db: w.db } as never), { code: 'INVALID_ARGUMENT' });
});

// ---------------------------------------------------------------------------------------------
// Real graphs over the fake sandbox.

const LogState = Annotation.Root({
  log: Annotation<string[]>({ reducer: (a, b) => a.concat(b), default: () => [] }),
  seen: Annotation<string[]>({ reducer: (a, b) => a.concat(b), default: () => [] }),
});

function fileGraph(sb: FakeSandbox, saver: LockstepSaver) {
  return new StateGraph(LogState)
    .addNode('a', () => {
      sb.files.set('/workspace/a.txt', 'A\n');
      return { log: ['a'] };
    })
    .addNode('b', () => {
      const before = sb.files.get('/workspace/a.txt') ?? '';
      sb.files.set('/workspace/a.txt', before + 'B\n');
      return { log: ['b'], seen: [before] };
    })
    .addEdge(START, 'a')
    .addEdge('a', 'b')
    .addEdge('b', END)
    .compile({ checkpointer: saver })
    .withConfig({ durability: 'sync' });
}

test('a real graph: one Lockstep checkpoint per step, replay rolls the files back before node b', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const graph = fileGraph(sb, saver);
  const thread = { configurable: { thread_id: 't1' } };
  t.deepEqual(await graph.invoke({ log: ['start'] }, thread), { log: ['start', 'a', 'b'], seen: ['A\n'] });
  t.is(sb.checkpoints().length, 4);

  const history = [];
  for await (const s of graph.getStateHistory(thread)) history.push(s);
  const afterA = history.find((s) => s.next.length === 1 && s.next[0] === 'b')!;
  t.deepEqual(afterA.values.log, ['start', 'a']);
  t.is(sb.files.get('/workspace/a.txt'), 'A\nB\n');

  const replayed = await graph.invoke(null, afterA.config);
  t.deepEqual(replayed.log, ['start', 'a', 'b']);
  t.deepEqual(replayed.seen, ['A\n'], 'node b saw the file as it was after node a, not with its first append');
  t.is(sb.files.get('/workspace/a.txt'), 'A\nB\n');
  t.is(sb.rollbacks.length, 1);

  const messages = new StateGraph(MessagesAnnotation)
    .addNode('reply', () => ({ messages: [new AIMessage('done')] }))
    .addEdge(START, 'reply')
    .addEdge('reply', END)
    .compile({ checkpointer: saver });
  const out = await messages.invoke(
    { messages: [new HumanMessage('hi')] },
    { configurable: { thread_id: 'chat' }, durability: 'sync' },
  );
  t.deepEqual(
    out.messages.map((m) => m.content),
    ['hi', 'done'],
  );
  const state = await messages.getState({ configurable: { thread_id: 'chat' } });
  t.true(state.values.messages[1] instanceof AIMessage);
});

test('a real graph invoked with the default (async) durability fails with the reason', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const graph = new StateGraph(LogState)
    .addNode('a', () => ({ log: ['a'] }))
    .addEdge(START, 'a')
    .addEdge('a', END)
    .compile({ checkpointer: saver });
  const err = await t.throwsAsync(graph.invoke({ log: [] }, { configurable: { thread_id: 't1' } }), {
    code: 'INVALID_ARGUMENT',
  });
  t.is((err as unknown as { field: string }).field, 'config.durability');
  t.is(sb.checkpoints().length, 0);
});

test('a real graph with a subgraph and an interrupt resumes without the sandbox moving', async (t) => {
  const w = world();
  const sb = w.make('sb1');
  const saver = new LockstepSaver({ sandbox: sb.saverView, db: w.db });
  const child = new StateGraph(LogState)
    .addNode('c1', () => {
      sb.files.set('/child.txt', 'child');
      return { log: ['c1'] };
    })
    .addNode('c2', () => ({ log: ['c2'] }))
    .addEdge(START, 'c1')
    .addEdge('c1', 'c2')
    .addEdge('c2', END)
    .compile();
  const graph = new StateGraph(LogState)
    .addNode('sub', async (_state: typeof LogState.State, config: LangGraphRunnableConfig) => ({
      log: (await child.invoke({ log: [] }, config)).log,
    }))
    .addNode('ask', () => {
      const answer = interrupt('continue?') as string;
      return { log: [`ask:${answer}`] };
    })
    .addEdge(START, 'sub')
    .addEdge('sub', 'ask')
    .addEdge('ask', END)
    .compile({ checkpointer: saver });
  const thread = { configurable: { thread_id: 't1' }, durability: 'sync' as const };
  await graph.invoke({ log: ['start'] }, thread);
  t.deepEqual((await graph.getState(thread)).next, ['ask']);
  const out = await graph.invoke(new Command({ resume: 'yes' }), thread);
  t.deepEqual(out.log, ['start', 'c1', 'c2', 'ask:yes']);
  t.deepEqual(sb.rollbacks, []);
  t.is(sb.files.get('/child.txt'), 'child');
  const subgraphCheckpoints = w.db
    .prepare("SELECT COUNT(*) AS n FROM langgraph_checkpoints WHERE checkpoint_ns != ''")
    .get() as { n: number };
  t.true(subgraphCheckpoints.n > 0, 'the subgraph checkpointed in its own namespace');
});

test('channel values: a put keeps those named in newVersions, carries the rest from a parent at the same version', async (t) => {
  const w = world();
  const saver = new LockstepSaver({ sandbox: w.make('sb1').saverView, db: w.db });
  const first = { ...ckpt({ messages: ['hi'], step: 1, stray: 'x' }), channel_versions: { messages: 1, step: 1 } };
  // `stray` has no version and is not new: the checkpoint does not own it.
  const c1 = await saver.put({ ...cfg('t1'), ...SYNC }, first, md(0), { messages: 1, step: 1 });
  t.deepEqual((await saver.getTuple(c1))?.checkpoint.channel_values, { messages: ['hi'], step: 1 });
  // The next step writes only `step`; `messages` (still version 1) comes from the parent.
  const second = { ...ckpt({ step: 2 }), channel_versions: { messages: 1, step: 2 } };
  const c2 = await saver.put({ ...cfg('t1', first.id), ...SYNC }, second, md(1), { step: 2 });
  t.deepEqual((await saver.getTuple(c2))?.checkpoint.channel_values, { messages: ['hi'], step: 2 });
  // A version the parent never had is not invented.
  const third = { ...ckpt({ step: 3 }), channel_versions: { messages: 7, step: 3 } };
  const c3 = await saver.put({ ...cfg('t1', second.id), ...SYNC }, third, md(2), { step: 3 });
  t.deepEqual((await saver.getTuple(c3))?.checkpoint.channel_values, { step: 3 });
  await t.throwsAsync(saver.put({ ...cfg('t1'), ...SYNC }, ckpt(), md(0), null as never), {
    code: 'INVALID_ARGUMENT',
  });
});

test("a checkpoint older than format v4 gets its parent's pending sends as the TASKS channel", async (t) => {
  const w = world();
  const saver = new LockstepSaver({ sandbox: w.make('sb1').saverView, db: w.db });
  const old = (): Checkpoint => ({ ...ckpt(), v: 1, channel_versions: { other: 3 } });
  const p = old();
  const pc = await saver.put(cfg('t1'), p, md(0), {});
  await saver.putWrites(
    pc,
    [
      [TASKS, 'send-1'],
      ['other', 'not a send'],
      [TASKS, 'send-2'],
    ],
    'task-1',
  );
  await saver.putWrites(pc, [[TASKS, 'send-3']], 'task-2');
  const child = old();
  const cc = await saver.put(cfg('t1', p.id), child, md(1), {});
  const tuple = await saver.getTuple(cc);
  t.deepEqual(tuple?.checkpoint.channel_values, { [TASKS]: ['send-1', 'send-2', 'send-3'] });
  t.is(tuple?.checkpoint.channel_versions[TASKS], 3);
  // The parent itself has no parent to take sends from; a v4 checkpoint is never migrated.
  t.deepEqual((await saver.getTuple(pc))?.checkpoint.channel_values, {});
});
