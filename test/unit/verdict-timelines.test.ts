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
import { migrateAgentState } from '../../src/agent-state/schema.js';

/** One sandbox's agent side, with the core's checkpoint and rollback bookkeeping done by hand. */
function timeline(t: ExecutionContext) {
  const dir = mkdtempSync(join(tmpdir(), 'lockstep-verdict-timelines-'));
  const catalog = new Catalog(join(dir, 'catalog.db'), [migrateAgentState]);
  t.teardown(() => {
    catalog.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const agent = new AgentState(catalog.db, catalog, { owner: true });
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
    standby_instance: null,
    standby_checkpoint: null,
    standby_pid: null,
    standby_start: null,
  };
  catalog.putImage({ name: 'base', rootfs: '/nonexistent', source: 'test', size_bytes: 0, created_at: Date.now(), deleted: 0 });
  catalog.insertSandbox(row);
  const current = () => catalog.sandbox(id)!;
  return {
    agent,
    verdict(path: string, contentHash: string, verdict = 'malware-scan:clean') {
      const r = current();
      return agent.verdicts.record({ sandboxId: r.id, branchId: r.branch_id, path, contentHash, verdict });
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
  };
}

const stale = (report: { staleVerdicts: { id: string; currentHash: string | null }[] }) => report.staleVerdicts.map((v) => [v.id, v.currentHash]);

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
