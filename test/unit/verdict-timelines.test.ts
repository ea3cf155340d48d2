/**
 * Which verdicts a rollback reports stale, driven through AgentState over a real catalog
 * database (no sandbox: file hashes are passed in, as the core passes them after restoring the
 * layer). The checkpoint tree and timelines are the catalog's own.
 */
import test, { type ExecutionContext } from 'ava';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Catalog, newId, type SandboxRow } from '../../src/catalog/catalog.js';
import { AgentState } from '../../src/agent-state/agent-state.js';

/** Sandboxes' agent side over one catalog, with the core's checkpoint, rollback and fork bookkeeping done by hand. */
function family(t: ExecutionContext) {
  const dir = mkdtempSync(join(tmpdir(), 'lockstep-verdict-timelines-'));
  const catalog = new Catalog(join(dir, 'catalog.db'));
  t.teardown(() => {
    catalog.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const agent = new AgentState(catalog.db, catalog, { owner: true });
  catalog.putImage({
    name: 'base',
    rootfs: '/nonexistent',
    source: 'test',
    size_bytes: 0,
    created_at: Date.now(),
    deleted: 0,
  });

  function handle(id: string) {
    const current = () => catalog.sandbox(id)!;
    return {
      id,
      verdict(path: string, contentHash: string, verdict = 'malware-scan:clean') {
        const r = current();
        return agent.verdicts.record({ sandboxId: r.id, branchId: r.branch_id, path, contentHash, verdict });
      },
      observations() {
        return agent.observations.list(id);
      },
      observe(subject: string) {
        return agent.observe(current(), { kind: 'file-write', subject });
      },
      effect() {
        const b = agent.effects.begin(agent.effectContext(current()), {
          kind: 'payments.charge',
          input: { n: 1 },
          reversibility: 'irreversible',
        });
        agent.effects.commit(b.effectId, { ok: true });
        return b.effectId;
      },
      checkpoint(): string {
        const ckptId = newId('ckpt');
        const layerId = newId('lyr');
        catalog.tx(() => {
          const r = current();
          const extra = agent.onCheckpoint(r, ckptId, undefined);
          catalog.insertLayer(layerId, 'checkpoint', r.id);
          catalog.insertCheckpoint({
            id: ckptId,
            sandbox_id: r.id,
            parent_id: r.head_checkpoint_id,
            layer_id: layerId,
            image: r.image,
            runtime_layer: r.runtime_layer,
            branch_id: r.branch_id,
            label: null,
            ledger_cursor: extra.ledgerCursor,
            context_id: extra.contextId,
            sizes: '{}',
            timings: '{}',
            created_at: Date.now(),
          });
          catalog.updateSandbox(r.id, { head_checkpoint_id: ckptId });
        });
        return ckptId;
      },
      /** Rolls back to a checkpoint whose files hash as `files` (a missing path: the file is gone). */
      rollback(ckptId: string, files: Record<string, string>) {
        const before = current();
        const ckpt = catalog.checkpoint(ckptId)!;
        const rollbackId = newId('op');
        const parts = catalog.tx(() => {
          catalog.updateSandbox(id, { head_checkpoint_id: ckptId, branch_id: newId('br') });
          return agent.onRollback(before, ckpt, rollbackId);
        });
        const hashes = new Map(agent.verdictPaths(id).map((p) => [p, files[p] ?? null] as const));
        return agent.report(current(), ckpt, { ...parts, warnings: [] }, hashes, {});
      },
      /** A fork from one of this sandbox's checkpoints, as forkOne() commits it. */
      fork(ckptId: string) {
        const parent = current();
        const childId = newId('sbx');
        const child: SandboxRow = {
          ...parent,
          id: childId,
          instance: childId,
          branch_id: newId('br'),
          head_checkpoint_id: null,
          forked_from: ckptId,
        };
        catalog.tx(() => {
          catalog.insertSandbox(child);
          agent.onFork(parent, catalog.checkpoint(ckptId)!, child);
        });
        return handle(childId);
      },
    };
  }

  return {
    agent: () => agent,
    sandbox() {
      const id = newId('sbx');
      const row: SandboxRow = {
        id,
        tenant: null,
        image: 'base',
        runtime_layer: 'rt',
        state: 'running',
        init_pid: null,
        init_start: null,
        memory_bytes: null,
        pids_max: null,
        hostname: 'h',
        lineage_id: id,
        branch_id: newId('br'),
        head_checkpoint_id: null,
        forked_from: null,
        env: '{}',
        metadata: '{}',
        created_at: Date.now(),
        expires_at: null,
        instance: id,
        cpu_weight: null,
        cpu_quota_us: null,
        io_weight: null,
        disk_bytes: null,
        id_base: null,
      };
      catalog.insertSandbox(row);
      return handle(id);
    },
  };
}

const timeline = (t: ExecutionContext) => family(t).sandbox();

const stale = (report: { staleVerdicts: { id: string; currentHash: string | null }[] }) =>
  report.staleVerdicts.map((v) => [v.id, v.currentHash]);

// The case randomized runs found (issue 15): a verdict of the restored timeline must be judged
// against the restored bytes even when a verdict on the same path was made on an abandoned one.
test('a verdict of the restored timeline is stale after its file was deleted, whatever the abandoned timeline judged', (t) => {
  const s = timeline(t);
  s.checkpoint(); // step 1
  const step2 = s.verdict('f.txt', 'h_v1'); // step 2: judged clean
  s.checkpoint();
  s.checkpoint(); // step 3: f.txt deleted
  const step4 = s.checkpoint(); // step 4
  const abandoned = s.verdict('f.txt', 'h_v3'); // the abandoned stretch rewrites f.txt and judges it clean again
  s.checkpoint();
  const report = s.rollback(step4, {});
  t.deepEqual(stale(report), [
    [step2.id, null],
    [abandoned.id, null],
  ]);
});

test('a verdict of the restored timeline is stale after its file was rewritten, though the abandoned timeline judged the new bytes', (t) => {
  const s = timeline(t);
  s.checkpoint();
  const step2 = s.verdict('f.txt', 'h_v1');
  s.checkpoint();
  s.checkpoint(); // step 3: f.txt rewritten to h_v2
  const step4 = s.checkpoint();
  s.verdict('f.txt', 'h_v2'); // abandoned stretch: the new bytes judged clean; still true of the restored bytes
  const report = s.rollback(step4, { 'f.txt': 'h_v2' });
  t.deepEqual(stale(report), [[step2.id, 'h_v2']]);
  t.deepEqual(
    report.recoverySummary.structured.staleVerdicts.map((v) => [v.path, v.contentHash, v.currentHash]),
    [['f.txt', 'h_v1', 'h_v2']],
  );
});

// Found by the model-based test: a fork's history runs on into its parent's up to the fork
// point, but rollbacks of the fork judged the inherited records against the fork's own
// checkpoint tree only, so every one of them looked abandoned.
test("a fork's rollback keeps the history it inherited: nothing before the fork point is reported", (t) => {
  const f = family(t);
  const agent = f.agent;
  const s = f.sandbox();
  const seen = s.observe('/w/a');
  const judged = s.verdict('/w/a', 'h1');
  const paid = s.effect();
  const forkPoint = s.checkpoint();

  const child = s.fork(forkPoint);
  const childOwn = child.observe('/w/b');
  const c1 = child.checkpoint();
  const report = child.rollback(c1, { '/w/a': 'h2' });
  t.deepEqual(report.staleObservations, []);
  t.deepEqual(report.effectsAfter, [], 'the payment happened before the fork point');
  t.deepEqual(report.warnings, []);
  t.deepEqual(
    report.staleVerdicts.map((v) => [v.inheritedFrom, v.currentHash]),
    [[judged.id, 'h2']],
    "the parent's verdict is in the fork's restored history and its file changed",
  );

  // A grandchild inherits the whole history through its parent: the grandparent's records too.
  const grandchild = child.fork(c1);
  t.deepEqual(
    grandchild
      .observations()
      .map((o) => o.inheritedFrom)
      .sort(),
    [seen.id, childOwn.id].sort(),
  );
  const g1 = grandchild.checkpoint();
  const g = grandchild.rollback(g1, { '/w/a': 'h3' });
  t.deepEqual(g.staleObservations, []);
  t.deepEqual(g.effectsAfter, []);
  t.deepEqual(
    g.staleVerdicts.map((v) => [v.inheritedFrom, v.currentHash]),
    [[judged.id, 'h3']],
  );
  t.is(paid, agent().effects.get(paid).id);
});
