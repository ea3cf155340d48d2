/**
 * A real LangGraph graph on a real sandbox with LockstepSaver as its only
 * change: one aligned Lockstep checkpoint per step, and time travel (replay,
 * updateState) rolls the sandbox's files back before the replayed node runs.
 */
import test from 'ava';
import { Annotation, END, START, StateGraph, type LangGraphRunnableConfig } from '@langchain/langgraph';
import { integration, openTestLockstep } from '../helpers/harness.js';
import type { Sandbox } from '../../src/index.js';
import { LockstepSaver, type TimeTravelEvent } from '../../src/integrations/langgraph.js';

const State = Annotation.Root({
  log: Annotation<string[]>({ reducer: (a, b) => a.concat(b), default: () => [] }),
  /** What node b found in /workspace/a.txt before appending to it. */
  seen: Annotation<string[]>({ reducer: (a, b) => a.concat(b), default: () => [] }),
});

function buildGraph(sb: Sandbox, saver: LockstepSaver) {
  return new StateGraph(State)
    .addNode('a', async () => {
      const r = await sb.commands.run('mkdir -p /workspace && echo A > /workspace/a.txt');
      if (r.exitCode !== 0) throw new Error(r.stderr);
      return { log: ['a'] };
    })
    .addNode('b', async () => {
      const before = (await sb.files.read('/workspace/a.txt')).content.toString();
      const r = await sb.commands.run('echo B >> /workspace/a.txt');
      if (r.exitCode !== 0) throw new Error(r.stderr);
      return { log: ['b'], seen: [before] };
    })
    .addEdge(START, 'a')
    .addEdge('a', 'b')
    .addEdge('b', END)
    .compile({ checkpointer: saver })
    .withConfig({ durability: 'sync' });
}

async function fileText(sb: Sandbox, path: string): Promise<string> {
  return (await sb.files.read(path)).content.toString();
}

integration(test, () => {
  test.serial('a graph checkpoints the sandbox per step and time travel rolls its files back', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create({ image: 'base' });
    t.teardown(() => sb.kill().catch(() => undefined));
    const events: TimeTravelEvent[] = [];
    const saver = new LockstepSaver({ sandbox: sb, onTimeTravel: (e) => void events.push(e) });
    const graph = buildGraph(sb, saver);
    const thread = { configurable: { thread_id: 'agent-1' } };

    const first = await graph.invoke({ log: ['start'] }, thread);
    t.deepEqual(first, { log: ['start', 'a', 'b'], seen: ['A\n'] });
    t.is(await fileText(sb, '/workspace/a.txt'), 'A\nB\n');

    // One Lockstep checkpoint per LangGraph checkpoint, holding the graph's state as context.
    const history = [];
    for await (const s of graph.getStateHistory(thread)) history.push(s);
    t.is(history.length, 4);
    const lockstepCkpts = sb.checkpoints().filter((c) => c.label?.startsWith('langgraph:'));
    t.is(lockstepCkpts.length, 4);
    for (const snap of history) {
      const lockstepId = saver.lockstepCheckpointId(snap.config);
      t.truthy(lockstepId);
      const ckpt = lockstepCkpts.find((c) => c.id === lockstepId)!;
      t.is(ckpt.label, `langgraph:${snap.config.configurable!.checkpoint_id}`);
      const ctx = sb.context(lockstepId!);
      if (ctx?.format !== 'langgraph') return t.fail(`context of ${lockstepId} is ${ctx?.format}`);
      t.is(ctx.checkpoint.id, snap.config.configurable!.checkpoint_id);
      t.deepEqual((ctx.checkpoint.channel_values as { log?: string[] }).log ?? [], snap.values.log ?? []);
      t.deepEqual(ctx.metadata?.step, snap.metadata?.step);
    }
    t.is(sb.info().headCheckpointId, saver.lockstepCheckpointId(history[0]!.config) ?? null);

    // getTuple / list round trips, pending writes of a real step, unknown ids.
    const afterA = history.find((s) => s.next.length === 1 && s.next[0] === 'b')!;
    t.deepEqual(afterA.values, { log: ['start', 'a'], seen: [] });
    const tuple = await saver.getTuple(afterA.config);
    t.is(tuple?.checkpoint.id, afterA.config.configurable!.checkpoint_id);
    t.deepEqual(
      tuple!
        .pendingWrites!.filter(([, channel]) => channel === 'log' || channel === 'seen')
        .map(([, channel, value]) => [channel, value]),
      [
        ['log', ['b']],
        ['seen', ['A\n']],
      ],
    );
    t.deepEqual((await saver.getTuple(thread))?.checkpoint.id, history[0]!.config.configurable!.checkpoint_id);
    t.is(
      await saver.getTuple({
        configurable: {
          thread_id: 'agent-1',
          checkpoint_ns: '',
          checkpoint_id: '1f000000-0000-6000-8000-000000000000',
        },
      }),
      undefined,
    );
    const listed = [];
    for await (const tup of saver.list(thread, { limit: 2 })) listed.push(tup.checkpoint.id);
    t.deepEqual(
      listed,
      history.slice(0, 2).map((s) => s.config.configurable!.checkpoint_id),
    );

    // Replay from the checkpoint after node a: the sandbox goes back before node b runs again.
    const branchBefore = sb.info().branchId;
    const replayed = await graph.invoke(null, afterA.config);
    t.deepEqual(replayed, { log: ['start', 'a', 'b'], seen: ['A\n'] }, "node b found only node a's line");
    t.is(await fileText(sb, '/workspace/a.txt'), 'A\nB\n');
    t.not(sb.info().branchId, branchBefore, 'the sandbox was rolled back');
    t.is(events.length, 1);
    t.is(events[0]!.checkpointId, afterA.config.configurable!.checkpoint_id);
    t.is(events[0]!.lockstepCheckpointId, saver.lockstepCheckpointId(afterA.config) ?? 'none');

    // updateState on the same old checkpoint, then continue: same story, with the edit in the state.
    const edited = await graph.updateState(afterA.config, { log: ['edit'] });
    t.is(events.length, 2);
    t.is(await fileText(sb, '/workspace/a.txt'), 'A\n', 'updateState moved the sandbox to the checkpoint it edits');
    const resumed = await graph.invoke(null, edited);
    t.deepEqual(resumed, { log: ['start', 'a', 'edit', 'b'], seen: ['A\n'] });
    t.is(await fileText(sb, '/workspace/a.txt'), 'A\nB\n');
    t.is(events.length, 2);

    // A new run on the thread continues from its newest checkpoint: no rollback.
    await graph.invoke({ log: ['again'] }, thread);
    t.is(events.length, 2);
    t.is(await fileText(sb, '/workspace/a.txt'), 'A\nB\n');

    await saver.deleteThread('agent-1');
    t.is(await saver.getTuple(thread), undefined);
    t.deepEqual(
      sb.checkpoints().filter((c) => c.label?.startsWith('langgraph:')),
      [],
    );
    t.is(await fileText(sb, '/workspace/a.txt'), 'A\nB\n', 'the sandbox itself stays');
  });

  test.serial('one sandbox per thread with { lockstep, sandboxFor }', async (t) => {
    const ls = await openTestLockstep(t);
    const byThread = new Map<string, Sandbox>();
    const saver = new LockstepSaver({
      lockstep: ls,
      sandboxFor: async (threadId) => {
        const sb = await ls.create({ image: 'base' });
        byThread.set(threadId, sb);
        return sb;
      },
    });
    const graph = new StateGraph(State)
      .addNode('write', async (_state: typeof State.State, config: LangGraphRunnableConfig) => {
        const threadId = config.configurable!.thread_id as string;
        const r = await byThread.get(threadId)!.commands.run(`echo ${threadId} > /tmp/who`);
        if (r.exitCode !== 0) throw new Error(r.stderr);
        return { log: [threadId] };
      })
      .addEdge(START, 'write')
      .addEdge('write', END)
      .compile({ checkpointer: saver })
      .withConfig({ durability: 'sync' });
    for (const id of ['t-one', 't-two']) await graph.invoke({ log: [] }, { configurable: { thread_id: id } });
    await graph.invoke({ log: [] }, { configurable: { thread_id: 't-one' } });
    t.is(byThread.size, 2);
    for (const [threadId, sb] of byThread) {
      t.is(await fileText(sb, '/tmp/who'), `${threadId}\n`);
      const latest = await saver.getTuple({ configurable: { thread_id: threadId } });
      const own = sb.checkpoints().map((c) => c.id);
      t.true(own.includes(saver.lockstepCheckpointId(latest!.config)!));
      t.is(own.length, threadId === 't-one' ? 6 : 3);
    }
  });

  test.serial('default (async) durability is refused before the sandbox is touched', async (t) => {
    const ls = await openTestLockstep(t);
    const sb = await ls.create({ image: 'base' });
    t.teardown(() => sb.kill().catch(() => undefined));
    const saver = new LockstepSaver({ sandbox: sb });
    const graph = new StateGraph(State)
      .addNode('a', () => ({ log: ['a'] }))
      .addEdge(START, 'a')
      .addEdge('a', END)
      .compile({ checkpointer: saver });
    await t.throwsAsync(graph.invoke({ log: [] }, { configurable: { thread_id: 't' } }), {
      code: 'INVALID_ARGUMENT',
      message: /durability/,
    });
    t.deepEqual(sb.checkpoints(), []);
  });
});
