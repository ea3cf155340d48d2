/**
 * LangGraph checkpointer backed by Lockstep: swap a graph's saver for
 * `new LockstepSaver({ sandbox })` and every LangGraph checkpoint becomes an
 * aligned Lockstep checkpoint (files, processes, the graph's state as the
 * agent context, effect-ledger cursor). When LangGraph continues from an
 * earlier checkpoint (replay, fork, updateState on an old config), the
 * sandbox is rolled back to the matching Lockstep checkpoint before the
 * graph's nodes run again. Runs must use `durability: 'sync'` (checked).
 *
 * Imported as `lockstep/langgraph`; `@langchain/langgraph-checkpoint` is an
 * optional peer dependency, so the main entry point never loads it.
 *
 * Where things live (see docs/langgraph.md):
 * - the checkpoint and its metadata: the Lockstep checkpoint's context
 *   (format 'langgraph'), in the JSON form of the saver's serde, so
 *   LangChain messages are `{ lc: 1, type: 'constructor', ... }` dicts that
 *   Lockstep's context store deduplicates and its recovery note understands;
 * - LangGraph id ↔ Lockstep id: the checkpoint label `langgraph:<id>`, and an
 *   index table `langgraph_checkpoints` in the catalog (thread, namespace,
 *   parent), so lookups and listings need no scan of every context;
 * - pending writes: table `langgraph_writes` in the catalog. They arrive
 *   after their checkpoint was taken, and a Lockstep checkpoint's context is
 *   immutable, so they cannot live in it.
 * Both tables are the catalog extension `langgraph` (src/catalog/extensions.ts):
 * made when a saver asks for the database (`extensionDatabase`), versioned
 * in `catalog_extensions`.
 *
 * Channel values follow LangGraph's versioning (what its conformance suite
 * checks): a checkpoint holds the value of a channel named in `newVersions`
 * as given, and any other channel's value only if its parent holds that
 * channel at the same version (the value carried over). A checkpoint older
 * than format v4 gets its parent's pending sends (`TASKS` writes) as the
 * `TASKS` channel when read, as LangGraph's own savers migrate it.
 */
import { isDeepStrictEqual } from 'node:util';
import type BetterSqlite3 from 'better-sqlite3';
import {
  BaseCheckpointSaver,
  TASKS,
  WRITES_IDX_MAP,
  maxChannelVersion,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
} from '@langchain/langgraph-checkpoint';
import type { Lockstep } from '../api/lockstep.js';
import type { Sandbox } from '../api/sandbox.js';
import type { AgentContext, Obj } from '../context/formats.js';
import type { RollbackReport } from '../checkpoints/rollback.js';
import type { RollbackAgentOptions } from '../agent-state/agent-state.js';
import { InvalidArgumentError, InvalidStateError, LockstepError } from '../errors.js';
import { createLogger, type Logger } from '../log.js';
import { migrateExtension, registerExtension, type CatalogExtension } from '../catalog/extensions.js';

/** LangChain's RunnableConfig, taken from the saver's own signature so this file needs no @langchain/core import. */
export type RunnableConfig = Parameters<BaseCheckpointSaver['put']>[0];

/** What the saver uses of a sandbox; a `Sandbox` has all of it (unit tests pass fakes). */
export type SaverSandbox = Pick<
  Sandbox,
  'id' | 'checkpoint' | 'rollback' | 'checkpoints' | 'info' | 'context' | 'deleteCheckpoint'
>;

/** What the saver uses of a Lockstep manager in per-thread mode. */
export interface SaverLockstep {
  get(sandboxId: string): SaverSandbox;
}

/** Reported after the saver rolled the sandbox back because LangGraph continued from an earlier checkpoint. */
export interface TimeTravelEvent {
  threadId: string;
  checkpointNs: string;
  /** The LangGraph checkpoint the graph continues from. */
  checkpointId: string;
  /** The Lockstep checkpoint the sandbox was rolled back to. */
  lockstepCheckpointId: string;
  /** The LangGraph checkpoint (same thread and namespace) the sandbox was at before; undefined if none. */
  previousCheckpointId: string | undefined;
  /** Lockstep's rollback report; undefined only if Lockstep failed to build it after the rollback committed. */
  report: RollbackReport | undefined;
}

interface CommonOptions {
  /**
   * Roll the sandbox back when LangGraph continues from a checkpoint the sandbox
   * is not at (default true). With false the sandbox only moves forward and its
   * files may disagree with a replayed graph's state.
   */
  followTimeTravel?: boolean | undefined;
  /**
   * Passed to `sandbox.rollback` when following: `policy: 'refuse'` makes a put fail
   * rather than leave irreversible effects behind.
   */
  rollback?: Pick<RollbackAgentOptions, 'policy'> | undefined;
  /**
   * Called after every rollback the saver makes, with Lockstep's rollback report
   * (stale observations, effects after the target).
   */
  onTimeTravel?: ((event: TimeTravelEvent) => void | Promise<void>) | undefined;
  /** LangGraph serializer (default: LangGraph's JsonPlusSerializer). */
  serde?: SerializerProtocol | undefined;
  logger?: Logger | undefined;
  /** @internal The catalog database; taken from the sandbox or manager (`extensionDatabase`) when omitted. */
  db?: BetterSqlite3.Database | undefined;
}

/** One sandbox for the whole graph (every thread shares its files). */
export interface SingleSandboxOptions extends CommonOptions {
  sandbox: SaverSandbox;
}

/** One sandbox per thread: `sandboxFor` is asked only for a thread that has no checkpoint yet. */
export interface PerThreadOptions extends CommonOptions {
  lockstep: SaverLockstep;
  sandboxFor: (threadId: string) => SaverSandbox | Promise<SaverSandbox>;
}

export type LockstepSaverOptions = SingleSandboxOptions | PerThreadOptions;

/** Label prefix of the Lockstep checkpoints this saver takes. */
export const LABEL_PREFIX = 'langgraph:';

/** Key of the wrapper used when the serde produces something other than JSON. */
const SERDE_KEY = '__lockstep_serde';

/** The saver's tables as their version 1 made them. */
const TABLES_V1 = `
CREATE TABLE IF NOT EXISTS langgraph_checkpoints (
  thread_id TEXT NOT NULL,
  checkpoint_ns TEXT NOT NULL,
  checkpoint_id TEXT NOT NULL,
  parent_checkpoint_id TEXT,
  sandbox_id TEXT NOT NULL,
  lockstep_checkpoint_id TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);
CREATE INDEX IF NOT EXISTS langgraph_checkpoints_sandbox ON langgraph_checkpoints(sandbox_id, thread_id, checkpoint_ns);
CREATE INDEX IF NOT EXISTS langgraph_checkpoints_lockstep ON langgraph_checkpoints(lockstep_checkpoint_id);
CREATE TABLE IF NOT EXISTS langgraph_writes (
  thread_id TEXT NOT NULL,
  checkpoint_ns TEXT NOT NULL,
  checkpoint_id TEXT NOT NULL,
  task_id TEXT NOT NULL,
  idx INTEGER NOT NULL,
  channel TEXT NOT NULL,
  type TEXT NOT NULL,
  value BLOB NOT NULL,
  task_path TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
`;

/**
 * The saver's tables in the catalog, as a catalog extension. Version 1 is
 * what savers made on every open before extensions were versioned
 * (idempotent: such catalogs already have the tables).
 */
export const LANGGRAPH_EXTENSION: CatalogExtension = {
  name: 'langgraph',
  migrations: [
    {
      version: 1,
      description: 'LangGraph checkpoint index and pending writes (langgraph_checkpoints, langgraph_writes)',
      up: (db) => db.exec(TABLES_V1),
    },
  ],
};
registerExtension(LANGGRAPH_EXTENSION);

interface IndexRow {
  thread_id: string;
  checkpoint_ns: string;
  checkpoint_id: string;
  parent_checkpoint_id: string | null;
  sandbox_id: string;
  lockstep_checkpoint_id: string;
}

type LangGraphContext = Extract<AgentContext, { format: 'langgraph' }>;

/**
 * A LangGraph checkpoint saver whose checkpoints are aligned Lockstep
 * checkpoints. Runs must use `durability: 'sync'`, so that each sandbox
 * checkpoint is taken before the next step's nodes touch the sandbox.
 */
export class LockstepSaver extends BaseCheckpointSaver {
  readonly followTimeTravel: boolean;
  private readonly db: BetterSqlite3.Database;
  private readonly single: SaverSandbox | undefined;
  private readonly lockstep: SaverLockstep | undefined;
  private readonly sandboxFor: ((threadId: string) => SaverSandbox | Promise<SaverSandbox>) | undefined;
  private readonly rollbackOptions: Pick<RollbackAgentOptions, 'policy'>;
  private readonly onTimeTravel: CommonOptions['onTimeTravel'];
  private readonly log: Logger;
  private readonly chains = new Map<string, Promise<unknown>>();

  constructor(options: LockstepSaverOptions) {
    super(validateOptions(options).serde);
    this.followTimeTravel = options.followTimeTravel ?? true;
    this.rollbackOptions = options.rollback ?? {};
    this.onTimeTravel = options.onTimeTravel;
    // A real Sandbox or Lockstep gives the catalog database and the log
    // through its public API; the saver's own types (and unit tests' fakes) need not.
    let owner: Partial<Pick<Sandbox | Lockstep, 'extensionDatabase' | 'logger'>>;
    if ('sandbox' in options) {
      this.single = options.sandbox;
      owner = options.sandbox as Partial<Sandbox>;
    } else {
      this.lockstep = options.lockstep;
      this.sandboxFor = options.sandboxFor;
      owner = options.lockstep as Partial<Lockstep>;
    }
    let db = options.db;
    if (db) migrateExtension(db, LANGGRAPH_EXTENSION.name);
    else db = owner.extensionDatabase?.(LANGGRAPH_EXTENSION.name);
    const log = options.logger ?? owner.logger;
    if (!db)
      throw new InvalidArgumentError(
        'db',
        'a Lockstep Sandbox or Lockstep manager (or, in tests, a catalog database)',
        db,
      );
    this.db = db;
    this.log = (log ?? createLogger()).child({ component: 'langgraph' });
    // Lockstep checkpoints deleted behind the saver's back (sandbox removed,
    // deleteCheckpoint) leave index rows and writes that point nowhere.
    this.db.exec(`DELETE FROM langgraph_checkpoints WHERE lockstep_checkpoint_id NOT IN (SELECT id FROM checkpoints);
      DELETE FROM langgraph_writes WHERE NOT EXISTS (SELECT 1 FROM langgraph_checkpoints lg
        WHERE lg.thread_id = langgraph_writes.thread_id AND lg.checkpoint_ns = langgraph_writes.checkpoint_ns
          AND lg.checkpoint_id = langgraph_writes.checkpoint_id)`);
  }

  /**
   * Takes a Lockstep checkpoint labelled `langgraph:<checkpoint.id>` with the
   * graph's checkpoint as its context. If the parent checkpoint is not where
   * the sandbox is (time travel), rolls the sandbox back to it first.
   */
  override async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    const threadId = requireThreadId(config, 'put');
    const ns = namespaceOf(config);
    const parentId = checkpointIdOf(config);
    if (typeof checkpoint?.id !== 'string' || checkpoint.id === '')
      throw new InvalidArgumentError('checkpoint.id', 'a non-empty string', checkpoint?.id);
    if (typeof newVersions !== 'object' || newVersions === null || Array.isArray(newVersions))
      throw new InvalidArgumentError('newVersions', 'an object of channel name to version', newVersions);
    if (isRunConfig(config)) requireSyncDurability(config);
    const returned = { configurable: { thread_id: threadId, checkpoint_ns: ns, checkpoint_id: checkpoint.id } };
    const parent = parentId === undefined ? undefined : this.row(threadId, ns, parentId);
    const parentCheckpoint = parent ? (await this.tuple(parent, { writes: false })).checkpoint : undefined;
    const stored: Checkpoint = {
      ...checkpoint,
      channel_values: channelValuesAt(checkpoint, newVersions, parentCheckpoint),
    };
    const [cp, md] = await Promise.all([this.toPlain(stored), this.toPlain(metadata)]);
    const sandbox = parent ? this.sandboxOf(parent.sandbox_id) : await this.sandboxForThread(threadId);
    return this.serial(sandbox.id, async () => {
      // Usually a no-op: a run already followed in getTuple. updateState and
      // bulkUpdateState (which run no nodes) are followed here.
      if (parent && this.followTimeTravel && ns === '') await this.follow(sandbox, parent);
      const context: LangGraphContext = { format: 'langgraph', checkpoint: cp, metadata: md, config: returned };
      const signal = config.signal instanceof AbortSignal ? config.signal : undefined;
      const info = await sandbox.checkpoint({ label: `${LABEL_PREFIX}${checkpoint.id}`, context, signal });
      this.db
        .prepare(
          `INSERT OR REPLACE INTO langgraph_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
           sandbox_id, lockstep_checkpoint_id, created_at)
           VALUES (?, ?, ?, ?, ?, ?, ?)`,
        )
        .run(threadId, ns, checkpoint.id, parentId ?? null, sandbox.id, info.id, Date.now());
      return returned;
    });
  }

  /** Stores the writes of one task against the checkpoint in config; getTuple returns them as pendingWrites. */
  override async putWrites(
    config: RunnableConfig,
    writes: PendingWrite[],
    taskId: string,
    taskPath?: string,
  ): Promise<void> {
    const threadId = requireThreadId(config, 'putWrites');
    const ns = namespaceOf(config);
    const checkpointId = checkpointIdOf(config);
    if (checkpointId === undefined)
      throw new InvalidArgumentError(
        'config.configurable.checkpoint_id',
        'the id of the checkpoint the writes belong to',
        checkpointId,
      );
    if (typeof taskId !== 'string' || taskId === '')
      throw new InvalidArgumentError('taskId', 'a non-empty string', taskId);
    if (!Array.isArray(writes)) throw new InvalidArgumentError('writes', 'an array of [channel, value] pairs', writes);
    const encoded = await Promise.all(
      writes.map(async ([channel, value]) => [channel, ...(await this.serde.dumpsTyped(value))] as const),
    );
    const store = () => {
      const replace = this.db.prepare(
        `INSERT OR REPLACE INTO langgraph_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, ` +
          `idx, channel, type, value, task_path) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      );
      const ignore = this.db.prepare(
        `INSERT OR IGNORE INTO langgraph_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, ` +
          `idx, channel, type, value, task_path) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      );
      this.db.transaction(() => {
        encoded.forEach(([channel, type, bytes], i) => {
          // Special writes (error, interrupt, resume) have fixed negative slots and
          // replace what was there; a task's ordinary writes are kept from the first attempt.
          const idx = WRITES_IDX_MAP[channel] ?? i;
          (idx < 0 ? replace : ignore).run(
            threadId,
            ns,
            checkpointId,
            taskId,
            idx,
            channel,
            type,
            Buffer.from(bytes),
            taskPath ?? '',
          );
        });
      })();
    };
    const row = this.row(threadId, ns, checkpointId);
    if (!row) return store();
    const sandbox = this.sandboxOf(row.sandbox_id);
    await this.serial(sandbox.id, async () => {
      // A node's writes are about the files it saw; if the sandbox is not at
      // this checkpoint, the node ran against another checkpoint's files.
      if (this.followTimeTravel && ns === '') {
        const at = this.position(sandbox, threadId, ns);
        if (at !== checkpointId) {
          throw new InvalidStateError(
            'LANGGRAPH_SANDBOX_DIVERGED',
            `Writes of task ${taskId} belong to LangGraph checkpoint ${checkpointId}, but sandbox ` +
              `${sandbox.id} is at ${at ?? 'no checkpoint'} of this thread: the task ran against other files`,
            {
              threadId,
              checkpointNs: ns,
              checkpointId,
              sandboxCheckpointId: at,
            },
          );
        }
      }
      store();
    });
  }

  /**
   * The checkpoint named by config.configurable.checkpoint_id, or the thread's
   * newest; undefined if there is none. When a graph run (not getState) starts
   * from a named checkpoint of the root graph that the sandbox is not at, the
   * sandbox is rolled back to it here: LangGraph runs the next nodes without
   * waiting for the checkpoint it puts for a replay.
   */
  override async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const threadId = config.configurable?.thread_id;
    if (typeof threadId !== 'string' || threadId === '') return undefined;
    const run = isRunConfig(config);
    if (run) requireSyncDurability(config);
    const ns = namespaceOf(config);
    const id = checkpointIdOf(config);
    const row = id !== undefined ? this.row(threadId, ns, id) : this.select({ threadId, ns, limit: 1 })[0];
    if (!row) return undefined;
    if (run && id !== undefined && ns === '' && this.followTimeTravel) {
      const sandbox = this.sandboxOf(row.sandbox_id);
      await this.serial(sandbox.id, () => this.follow(sandbox, row));
    }
    return this.tuple(row);
  }

  /**
   * Checkpoints newest first; `before` and `limit` as in every saver, `filter`
   * matches metadata keys by deep equality.
   */
  override async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { before, filter } = options;
    let limit = options.limit;
    if (limit !== undefined && (!Number.isInteger(limit) || limit < 0))
      throw new InvalidArgumentError('options.limit', 'a non-negative integer', limit);
    const threadId = config.configurable?.thread_id;
    const rows = this.select({
      threadId: typeof threadId === 'string' && threadId !== '' ? threadId : undefined,
      ns: typeof config.configurable?.checkpoint_ns === 'string' ? config.configurable.checkpoint_ns : undefined,
      id: checkpointIdOf(config),
      before: before ? checkpointIdOf(before) : undefined,
      limit: filter ? undefined : limit,
    });
    const wanted = filter ? Object.entries(filter) : [];
    for (const row of rows) {
      if (limit !== undefined && limit <= 0) return;
      const tuple = await this.tuple(row);
      const md = (tuple.metadata ?? {}) as Record<string, unknown>;
      if (!wanted.every(([k, v]) => isDeepStrictEqual(md[k], v))) continue;
      if (limit !== undefined) limit--;
      yield tuple;
    }
  }

  /**
   * Deletes the thread's checkpoints (their Lockstep checkpoints too, freeing layers
   * and process images) and writes. The sandbox stays.
   */
  override async deleteThread(threadId: string): Promise<void> {
    if (typeof threadId !== 'string' || threadId === '')
      throw new InvalidArgumentError('threadId', 'a non-empty string', threadId);
    const rows = this.select({ threadId });
    const bySandbox = new Map<string, IndexRow[]>();
    for (const r of rows) bySandbox.set(r.sandbox_id, [...(bySandbox.get(r.sandbox_id) ?? []), r]);
    for (const [sandboxId, own] of bySandbox) {
      const sandbox = this.sandboxOf(sandboxId);
      await this.serial(sandboxId, async () => {
        for (const r of own) {
          await sandbox.deleteCheckpoint(r.lockstep_checkpoint_id).catch((e: unknown) => {
            if (!(e instanceof LockstepError && e.code === 'CHECKPOINT_NOT_FOUND')) throw e;
          });
        }
      });
    }
    const del = this.db.prepare(
      'DELETE FROM langgraph_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?',
    );
    this.db.transaction(() => {
      for (const r of rows) del.run(r.thread_id, r.checkpoint_ns, r.checkpoint_id);
      this.db
        .prepare(
          `DELETE FROM langgraph_writes WHERE thread_id = ? AND NOT EXISTS (SELECT 1 FROM langgraph_checkpoints lg
             WHERE lg.thread_id = langgraph_writes.thread_id AND lg.checkpoint_ns = langgraph_writes.checkpoint_ns
               AND lg.checkpoint_id = langgraph_writes.checkpoint_id)`,
        )
        .run(threadId);
    })();
  }

  /**
   * The Lockstep checkpoint that holds a LangGraph checkpoint (thread_id,
   * checkpoint_ns, checkpoint_id in config), or undefined.
   */
  lockstepCheckpointId(config: RunnableConfig): string | undefined {
    const threadId = config.configurable?.thread_id;
    const id = checkpointIdOf(config);
    if (typeof threadId !== 'string' || id === undefined) return undefined;
    return this.row(threadId, namespaceOf(config), id)?.lockstep_checkpoint_id;
  }

  // -------------------------------------------------------------------------------------------

  /**
   * Rolls the sandbox back to `target` unless its nearest checkpoint of the same
   * thread and namespace already is `target`.
   */
  private async follow(sandbox: SaverSandbox, target: IndexRow): Promise<void> {
    const at = this.position(sandbox, target.thread_id, target.checkpoint_ns);
    if (at === target.checkpoint_id) return;
    const log = this.log.child({ sandboxId: sandbox.id, checkpointId: target.lockstep_checkpoint_id });
    log.info(
      { threadId: target.thread_id, checkpointNs: target.checkpoint_ns, from: at, to: target.checkpoint_id },
      'LangGraph continues from an earlier checkpoint; rolling the sandbox back',
    );
    let report: RollbackReport | undefined;
    try {
      report = await sandbox.rollback(target.lockstep_checkpoint_id, this.rollbackOptions);
    } catch (e) {
      // Lockstep builds its report after the rollback has committed, and fails
      // to when a langgraph context has no channel_values.messages to add a
      // recovery note to (AgentState.report). The sandbox did move, so the
      // graph may go on; only the report is missing. Remove once fixed there.
      if (!(
        e instanceof LockstepError &&
        e.code === 'CONTEXT_FORMAT_UNSUPPORTED' &&
        sandbox.info().headCheckpointId === target.lockstep_checkpoint_id
      ))
        throw e;
      log.warn({ err: e }, 'sandbox rolled back, but Lockstep could not build the rollback report');
    }
    await this.onTimeTravel?.({
      threadId: target.thread_id,
      checkpointNs: target.checkpoint_ns,
      checkpointId: target.checkpoint_id,
      lockstepCheckpointId: target.lockstep_checkpoint_id,
      previousCheckpointId: at,
      report,
    });
  }

  /**
   * The LangGraph checkpoint (of this thread and namespace) the sandbox is at:
   * the nearest one on the path from the sandbox's head up its checkpoint
   * tree. Checkpoints of other threads, of subgraph namespaces or taken by
   * hand in between do not move it.
   */
  private position(sandbox: SaverSandbox, threadId: string, ns: string): string | undefined {
    const ours = new Map(
      (
        this.db
          .prepare(
            'SELECT lockstep_checkpoint_id AS l, checkpoint_id AS c FROM ' +
              'langgraph_checkpoints WHERE sandbox_id = ? AND thread_id = ? AND checkpoint_ns = ?',
          )
          .all(sandbox.id, threadId, ns) as { l: string; c: string }[]
      ).map((r) => [r.l, r.c]),
    );
    if (ours.size === 0) return undefined;
    const parents = new Map(sandbox.checkpoints().map((c) => [c.id, c.parentId]));
    const seen = new Set<string>();
    for (let id = sandbox.info().headCheckpointId; id && !seen.has(id); id = parents.get(id) ?? null) {
      seen.add(id);
      const lg = ours.get(id);
      if (lg !== undefined) return lg;
    }
    return undefined;
  }

  private async tuple(row: IndexRow, opts: { writes?: boolean } = {}): Promise<CheckpointTuple> {
    const ctx = this.sandboxOf(row.sandbox_id).context(row.lockstep_checkpoint_id);
    if (!ctx || ctx.format !== 'langgraph') {
      throw new InvalidStateError(
        'LANGGRAPH_CONTEXT_MISSING',
        `Lockstep checkpoint ${row.lockstep_checkpoint_id} holds no ` +
          `LangGraph context for checkpoint ${row.checkpoint_id}`,
        {
          checkpointId: row.checkpoint_id,
          lockstepCheckpointId: row.lockstep_checkpoint_id,
        },
      );
    }
    const [checkpoint, metadata, pendingWrites] = await Promise.all([
      this.fromPlain(ctx.checkpoint) as Promise<Checkpoint>,
      ctx.metadata === undefined ? undefined : (this.fromPlain(ctx.metadata) as Promise<CheckpointMetadata>),
      opts.writes === false ? [] : this.pendingWrites(row),
    ]);
    if (checkpoint.v < 4 && row.parent_checkpoint_id !== null) await this.migratePendingSends(checkpoint, row);
    const tuple: CheckpointTuple = {
      config: {
        configurable: { thread_id: row.thread_id, checkpoint_ns: row.checkpoint_ns, checkpoint_id: row.checkpoint_id },
      },
      checkpoint,
      pendingWrites,
    };
    if (metadata !== undefined) tuple.metadata = metadata;
    if (row.parent_checkpoint_id !== null) {
      tuple.parentConfig = {
        configurable: {
          thread_id: row.thread_id,
          checkpoint_ns: row.checkpoint_ns,
          checkpoint_id: row.parent_checkpoint_id,
        },
      };
    }
    return tuple;
  }

  /**
   * Before format v4 a Send was not a channel value: it was a `TASKS` write
   * against the parent checkpoint. Such a checkpoint gets its parent's sends
   * (in writes order) as the `TASKS` channel, at the newest version it has,
   * which is what LangGraph's own savers do when reading one.
   */
  private async migratePendingSends(checkpoint: Checkpoint, row: IndexRow): Promise<void> {
    const parent = { ...row, checkpoint_id: row.parent_checkpoint_id! };
    const sends = (await this.pendingWrites(parent)).filter(([, channel]) => channel === TASKS).map(([, , v]) => v);
    checkpoint.channel_values = { ...checkpoint.channel_values, [TASKS]: sends };
    const versions = Object.values(checkpoint.channel_versions ?? {});
    checkpoint.channel_versions = {
      ...checkpoint.channel_versions,
      [TASKS]: versions.length > 0 ? maxChannelVersion(...versions) : this.getNextVersion(undefined),
    };
  }

  /**
   * Writes in LangGraph's writesSortKey order (task path, task id, idx): SQLite's
   * binary collation of UTF-8 is code-point order.
   */
  private async pendingWrites(row: IndexRow): Promise<CheckpointPendingWrite[]> {
    const rows = this.db
      .prepare(
        'SELECT task_id, channel, type, value FROM langgraph_writes WHERE thread_id = ? AND ' +
          'checkpoint_ns = ? AND checkpoint_id = ? ORDER BY task_path, task_id, idx',
      )
      .all(row.thread_id, row.checkpoint_ns, row.checkpoint_id) as {
      task_id: string;
      channel: string;
      type: string;
      value: Buffer;
    }[];
    return Promise.all(
      rows.map(
        async (w) =>
          [
            w.task_id,
            w.channel,
            await this.serde.loadsTyped(w.type, new Uint8Array(w.value)),
          ] as CheckpointPendingWrite,
      ),
    );
  }

  /** Index rows whose Lockstep checkpoint still exists, newest LangGraph id first, within this saver's scope. */
  private select(q: {
    threadId?: string | undefined;
    ns?: string | undefined;
    id?: string | undefined;
    before?: string | undefined;
    limit?: number | undefined;
  }): IndexRow[] {
    const where: string[] = [];
    const params: unknown[] = [];
    const add = (sql: string, v: unknown) => {
      where.push(sql);
      params.push(v);
    };
    if (this.single) add('lg.sandbox_id = ?', this.single.id);
    if (q.threadId !== undefined) add('lg.thread_id = ?', q.threadId);
    if (q.ns !== undefined) add('lg.checkpoint_ns = ?', q.ns);
    if (q.id !== undefined) add('lg.checkpoint_id = ?', q.id);
    if (q.before !== undefined) add('lg.checkpoint_id < ?', q.before);
    const filter = where.length ? `WHERE ${where.join(' AND ')}` : '';
    const limit = q.limit !== undefined ? ` LIMIT ${Number(q.limit)}` : '';
    const sql = `SELECT lg.* FROM langgraph_checkpoints lg JOIN checkpoints c ON c.id = lg.lockstep_checkpoint_id
      ${filter} ORDER BY lg.checkpoint_id DESC${limit}`;
    return this.db.prepare(sql).all(...params) as IndexRow[];
  }

  private row(threadId: string, ns: string, id: string): IndexRow | undefined {
    return this.select({ threadId, ns, id })[0];
  }

  /** A handle on the sandbox that holds a checkpoint. */
  private sandboxOf(sandboxId: string): SaverSandbox {
    if (this.single) return this.single;
    return this.lockstep!.get(sandboxId);
  }

  /** The sandbox a new checkpoint of this thread goes to: where its checkpoints are, else the one sandboxFor gives. */
  private async sandboxForThread(threadId: string): Promise<SaverSandbox> {
    if (this.single) return this.single;
    const newest = this.select({ threadId, limit: 1 })[0];
    if (newest) return this.sandboxOf(newest.sandbox_id);
    const sandbox = await this.sandboxFor!(threadId);
    if (typeof sandbox?.id !== 'string' || typeof sandbox.checkpoint !== 'function')
      throw new InvalidArgumentError('sandboxFor(threadId)', 'a Sandbox', sandbox);
    return sandbox;
  }

  /** Runs fn after every earlier saver operation on the same sandbox: follow-then-checkpoint must not interleave. */
  private async serial<T>(sandboxId: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.chains.get(sandboxId) ?? Promise.resolve();
    const run = prev.catch(() => undefined).then(fn);
    const tail = run.catch(() => undefined);
    this.chains.set(sandboxId, tail);
    try {
      return await run;
    } finally {
      if (this.chains.get(sandboxId) === tail) this.chains.delete(sandboxId);
    }
  }

  /**
   * LangGraph checkpoints hold class instances (messages, Send, Set, ...), which
   * Lockstep's context store refuses: they go through the serde, and its JSON
   * output is stored parsed, as plain data. Any other serde output is kept as
   * opaque bytes.
   */
  private async toPlain(value: unknown): Promise<Obj> {
    const [type, bytes] = await this.serde.dumpsTyped(value);
    if (type === 'json') {
      const parsed: unknown = JSON.parse(Buffer.from(bytes).toString('utf8'));
      if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)) return parsed as Obj;
    }
    return { [SERDE_KEY]: { type, data: new Uint8Array(bytes) } };
  }

  private async fromPlain(plain: Obj): Promise<unknown> {
    const wrapped = plain[SERDE_KEY] as { type?: unknown; data?: unknown } | undefined;
    if (wrapped && typeof wrapped.type === 'string' && wrapped.data instanceof Uint8Array)
      return this.serde.loadsTyped(wrapped.type, wrapped.data);
    return this.serde.loadsTyped('json', JSON.stringify(plain));
  }
}

/**
 * The channel values a checkpoint holds under LangGraph's versioning: the
 * value given for each channel in `newVersions` (the channels this step
 * wrote), and for every other versioned channel the parent's value, if the
 * parent holds that channel at the same version. A value with neither is not
 * stored: the checkpoint does not own it.
 */
function channelValuesAt(
  checkpoint: Checkpoint,
  newVersions: ChannelVersions,
  parent: Checkpoint | undefined,
): Record<string, unknown> {
  const given = checkpoint.channel_values ?? {};
  const values: Record<string, unknown> = {};
  for (const channel of Object.keys(newVersions)) if (Object.hasOwn(given, channel)) values[channel] = given[channel];
  if (!parent) return values;
  const inherited = parent.channel_values ?? {};
  for (const [channel, version] of Object.entries(checkpoint.channel_versions ?? {})) {
    if (Object.hasOwn(newVersions, channel) || !Object.hasOwn(inherited, channel)) continue;
    if (parent.channel_versions?.[channel] === version) values[channel] = inherited[channel];
  }
  return values;
}

function validateOptions(o: LockstepSaverOptions): LockstepSaverOptions {
  if (typeof o !== 'object' || o === null)
    throw new InvalidArgumentError('options', '{ sandbox } or { lockstep, sandboxFor }', o);
  const single = 'sandbox' in o && o.sandbox !== undefined;
  const perThread = 'lockstep' in o || 'sandboxFor' in o;
  if (single === perThread)
    throw new InvalidArgumentError('options', 'either { sandbox } or { lockstep, sandboxFor }', o);
  if (single && typeof (o as SingleSandboxOptions).sandbox?.checkpoint !== 'function')
    throw new InvalidArgumentError('options.sandbox', 'a Sandbox', (o as SingleSandboxOptions).sandbox);
  if (perThread) {
    const p = o as PerThreadOptions;
    if (typeof p.lockstep?.get !== 'function')
      throw new InvalidArgumentError('options.lockstep', 'a Lockstep manager', p.lockstep);
    if (typeof p.sandboxFor !== 'function')
      throw new InvalidArgumentError('options.sandboxFor', 'a function (threadId) => Sandbox', p.sandboxFor);
  }
  if (o.followTimeTravel !== undefined && typeof o.followTimeTravel !== 'boolean')
    throw new InvalidArgumentError('options.followTimeTravel', 'a boolean', o.followTimeTravel);
  if (o.onTimeTravel !== undefined && typeof o.onTimeTravel !== 'function')
    throw new InvalidArgumentError('options.onTimeTravel', 'a function', o.onTimeTravel);
  return o;
}

function requireThreadId(config: RunnableConfig, op: string): string {
  const id: unknown = config?.configurable?.thread_id;
  if (typeof id !== 'string' || id === '') {
    throw new InvalidArgumentError(
      'config.configurable.thread_id',
      `a non-empty string for ${op} (invoke the graph with { configurable: { thread_id } })`,
      id,
    );
  }
  return id;
}

function namespaceOf(config: RunnableConfig): string {
  const ns: unknown = config.configurable?.checkpoint_ns;
  return typeof ns === 'string' ? ns : '';
}

function checkpointIdOf(config: RunnableConfig): string | undefined {
  const id: unknown = config.configurable?.checkpoint_id ?? config.configurable?.thread_ts;
  return typeof id === 'string' && id !== '' ? id : undefined;
}

/**
 * Whether a saver call comes from a running graph (invoke, stream) rather than
 * getState, getStateHistory or updateState. LangGraph gives a run's calls the
 * whole run config, which always has a recursionLimit; the state methods pass
 * the caller's config, usually just `configurable`.
 */
function isRunConfig(config: RunnableConfig): boolean {
  return config.recursionLimit !== undefined;
}

/**
 * LangGraph's default durability ('async') saves a step's checkpoint while the
 * next step's nodes already run, so the sandbox checkpoint would catch their
 * file changes, and a rollback for time travel would race the replayed nodes.
 * A run must therefore use durability 'sync'; it is checked at the run's first
 * getTuple, before any node runs.
 */
function requireSyncDurability(config: RunnableConfig): void {
  const durability: unknown =
    (config as { durability?: unknown }).durability ?? config.configurable?.__pregel_durability;
  if (durability !== 'sync') {
    throw new InvalidArgumentError(
      'config.durability',
      `"sync", so that each sandbox checkpoint is taken before the next step's nodes run: invoke or ` +
        `stream with { durability: 'sync' }, or use graph.withConfig({ durability: 'sync' })`,
      durability,
    );
  }
}
