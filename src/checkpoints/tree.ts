/**
 * The checkpoint tree of a sandbox (parent links, plus the forks started
 * from its checkpoints): deleting a node and drawing the tree for `lockstep log`.
 */
import type { CheckpointRow, SandboxRow, Catalog } from '../catalog/catalog.js';
import { NotFoundError } from '../errors.js';
import { dropStandby } from './standby.js';
import { detachImagesFrom } from './page-store.js';
import { releaseCheckpointFiles } from '../snapshots/holders.js';
import type { StandbyDeps } from './standby.js';
import type { PageStoreDeps } from './page-store.js';
import type { HoldersDeps } from '../snapshots/holders.js';
import type { AgentState } from '../agent-state/agent-state.js';
import type { FaultHook } from '../faults.js';
import type { ImageStore } from '../images/image-store.js';

/** What tree.ts uses of the manager's services (api/engine.ts builds them). */
export interface TreeDeps extends StandbyDeps, PageStoreDeps, HoldersDeps {
  agent: AgentState;
  catalog: Catalog;
  fault: FaultHook;
  images: ImageStore;
}

/**
 * Deletes a checkpoint of this sandbox. Its children move up to its parent; its
 * layer, process image and warm standby are freed.
 */
export async function deleteCheckpoint(engine: TreeDeps, row: SandboxRow, checkpointId: string): Promise<void> {
  const ckpt = engine.catalog.checkpoint(checkpointId);
  if (!ckpt || ckpt.sandbox_id !== row.id) throw new NotFoundError('checkpoint', checkpointId);
  if (engine.catalog.standby(row.id)?.checkpoint === ckpt.id) await dropStandby(engine, row.id);
  const { catalog } = engine;
  // Before the record goes: once it has, the reaper may remove the files.
  await detachImagesFrom(engine, row.id, ckpt.id);
  engine.fault('deleteCheckpoint:flattened');
  catalog.tx(() => {
    catalog.reparentCheckpoints(ckpt.id, ckpt.parent_id);
    if (row.head_checkpoint_id === ckpt.id) catalog.updateSandbox(row.id, { head_checkpoint_id: ckpt.parent_id });
    catalog.deleteCheckpointRow(ckpt.id);
    catalog.deleteLayerRow(ckpt.layer_id);
    engine.agent.onCheckpointDeleted(ckpt);
  });
  // Files go after the commit: a crash in between leaves only orphans, which the reaper removes.
  // ... unless a snapshot still holds them.
  await releaseCheckpointFiles(engine, ckpt.layer_id, ckpt.id);
  engine.images.collectGarbage();
}

export interface TreeNode {
  checkpoint: CheckpointRow;
  children: TreeNode[];
  forks: SandboxRow[];
}

/** Builds the forest of a sandbox's checkpoints. */
export function checkpointForest(engine: TreeDeps, sandboxId: string): TreeNode[] {
  const rows = engine.catalog.checkpointsOf(sandboxId);
  const nodes = new Map(
    rows.map((r) => [r.id, { checkpoint: r, children: [] as TreeNode[], forks: [] as SandboxRow[] }]),
  );
  const forks = engine.catalog.allSandboxes().filter((s) => s.forked_from && nodes.has(s.forked_from));
  for (const f of forks) nodes.get(f.forked_from!)!.forks.push(f);
  const roots: TreeNode[] = [];
  for (const n of nodes.values()) {
    const parent = n.checkpoint.parent_id ? nodes.get(n.checkpoint.parent_id) : undefined;
    if (parent) parent.children.push(n);
    else roots.push(n);
  }
  return roots;
}

/**
 * Text drawing of the tree, like `git log --graph`: a straight run of
 * checkpoints stays in one column and only a fork in the history (two
 * children, or sandboxes forked from a checkpoint) opens a branch. The head
 * is marked with "*", forked sandboxes with "⑂".
 */
export function drawTree(engine: TreeDeps, sandbox: SandboxRow, opts: { color?: boolean } = {}): string {
  const bold = (s: string) => (opts.color ? `\x1b[1m${s}\x1b[0m` : s);
  const dim = (s: string) => (opts.color ? `\x1b[2m${s}\x1b[0m` : s);
  const lines: string[] = [`${bold(sandbox.id)} ${dim(`(image ${sandbox.image}, branch ${sandbox.branch_id})`)}`];
  const label = (c: CheckpointRow) => {
    const head = sandbox.head_checkpoint_id === c.id ? ' *' : '';
    const t = JSON.parse(c.timings) as { totalMs?: number };
    const name = c.label ? ` "${c.label}"` : '';
    const when = new Date(c.created_at).toISOString().replace('T', ' ').slice(0, 19);
    return `● ${bold(c.id)}${name}${head} ${dim(`${when}${t.totalMs ? ` · ${t.totalMs.toFixed(1)} ms` : ''}`)}`;
  };
  const chain = (start: TreeNode, prefix: string, mark: string, rest: string) => {
    let node = start;
    let first = mark;
    for (;;) {
      lines.push(`${prefix}${first}${label(node.checkpoint)}`);
      first = '';
      prefix = rest;
      const kids: (TreeNode | SandboxRow)[] = [...node.children, ...node.forks];
      if (kids.length === 1 && 'checkpoint' in kids[0]!) {
        node = kids[0] as TreeNode;
        continue;
      }
      kids.forEach((k, i) => {
        const last = i === kids.length - 1;
        if ('checkpoint' in k) chain(k, rest, last ? '└─ ' : '├─ ', rest + (last ? '   ' : '│  '));
        else lines.push(`${rest}${last ? '└─ ' : '├─ '}⑂ fork ${bold(k.id)} ${dim(`(${k.state})`)}`);
      });
      return;
    }
  };
  const roots = checkpointForest(engine, sandbox.id);
  roots.forEach((r) => chain(r, '', '', ''));
  if (!roots.length) lines.push(dim('(no checkpoints)'));
  return lines.join('\n');
}
