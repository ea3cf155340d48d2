/**
 * Tables of the agent-state half of a checkpoint: context snapshots, observations, verdicts
 * and the effect ledger (src/context/, src/provenance/, src/effects/, src/agent-state/). They
 * live in the catalog database next to the core's tables but never reference them with foreign
 * keys: the core writes both in one transaction, and keeping ids as plain TEXT lets either side
 * evolve its schema alone.
 *
 * Until catalog version 12 these tables kept their own version in a table `agent_state_meta`
 * (versions 1 to 3); steps 10 to 12 of src/catalog/migrations.ts are those versions, and step
 * 12 drops that table.
 */
import type Database from 'better-sqlite3';
import { InvalidStateError } from '../../errors.js';
import { addColumn, hasTable } from './columns.js';

/** The agent-state tables as their version 1 made them. */
export const AGENT_STATE_TABLES = `
-- Content-addressed context items (messages, response items, headers), shared by snapshots.
-- A rowid table (not WITHOUT ROWID keyed by hash): rows of 1-2 KB appended in rowid order pack
-- pages nearly full, where random-hash keys split pages and leave them half empty.
CREATE TABLE IF NOT EXISTS agent_context_items (
  hash BLOB NOT NULL UNIQUE,        -- sha256 of data
  data BLOB NOT NULL,               -- msgpack of one item
  refs INTEGER NOT NULL             -- occurrences in snapshot tails + headers
);

-- A snapshot = header item + ordered item list, the list stored as (base snapshot whose list is
-- a prefix) + tail of 32-byte hashes.
CREATE TABLE IF NOT EXISTS agent_context_snapshots (
  id            TEXT PRIMARY KEY,   -- ctx_...
  format        TEXT NOT NULL,
  header_hash   BLOB NOT NULL,
  base_id       TEXT,               -- NULL: tail holds the whole list (a keyframe)
  tail          BLOB NOT NULL,
  item_count    INTEGER NOT NULL,
  depth         INTEGER NOT NULL,   -- base chain length, bounded
  list_digest   BLOB NOT NULL,      -- rolling digest of the whole item hash list
  logical_bytes INTEGER NOT NULL,
  dependents    INTEGER NOT NULL DEFAULT 0,
  deleted       INTEGER NOT NULL DEFAULT 0,
  created_at    INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_context_snapshots_digest ON agent_context_snapshots(list_digest);

CREATE TABLE IF NOT EXISTS agent_observations (
  seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
  id                  TEXT NOT NULL UNIQUE,          -- obs_...
  sandbox_id          TEXT NOT NULL,
  branch_id           TEXT NOT NULL,
  lineage_id          TEXT NOT NULL,
  epoch_checkpoint_id TEXT,
  kind                TEXT NOT NULL CHECK (kind IN ('command','file-read','file-write','file-list','verdict')),
  tool_call_id        TEXT,
  subject             TEXT NOT NULL,
  content_hash        TEXT,
  exit_code           INTEGER,
  summary             TEXT,
  sealed_by           TEXT,
  stale_rollback_id   TEXT,
  stale_at            INTEGER,
  inherited_from      TEXT,                          -- original observation id, for fork copies
  created_at          INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_observations_sandbox ON agent_observations(sandbox_id, seq);
CREATE INDEX IF NOT EXISTS agent_observations_lineage ON agent_observations(lineage_id, seq);

CREATE TABLE IF NOT EXISTS agent_verdicts (
  seq            INTEGER PRIMARY KEY AUTOINCREMENT,
  id             TEXT NOT NULL UNIQUE,               -- vrd_...
  sandbox_id     TEXT NOT NULL,
  branch_id      TEXT NOT NULL,
  path           TEXT NOT NULL,
  content_hash   TEXT NOT NULL,
  verdict        TEXT NOT NULL,
  tool_call_id   TEXT,
  observation_id TEXT,
  inherited_from TEXT,
  created_at     INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS agent_verdicts_sandbox ON agent_verdicts(sandbox_id, path, seq);

CREATE TABLE IF NOT EXISTS agent_effects (
  seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
  id                  TEXT NOT NULL UNIQUE,          -- eff_...
  lineage_id          TEXT NOT NULL,
  sandbox_id          TEXT NOT NULL,
  branch_id           TEXT NOT NULL,
  epoch_checkpoint_id TEXT,
  sealed_by           TEXT,
  abandoned_by        TEXT,                          -- rollback that left it unsealed behind
  kind                TEXT NOT NULL,
  input               TEXT NOT NULL,                 -- canonical JSON
  output              TEXT,                          -- JSON; NULL = no output (undefined)
  reversibility       TEXT NOT NULL CHECK (reversibility IN ('sandbox-local','compensable','irreversible')),
  scope               TEXT NOT NULL CHECK (scope IN ('lineage','branch')),
  idempotency_key     TEXT NOT NULL,
  tool_call_id        TEXT,
  compensation        TEXT,                          -- JSON {kind, input}
  status              TEXT NOT NULL CHECK (status IN ('pending','committed','failed','unknown','compensated')),
  definite            INTEGER,                       -- for failed: 1 = certainly did not happen
  error               TEXT,                          -- JSON {name, message, code?}
  attempt             INTEGER NOT NULL,
  compensates_id      TEXT,                          -- set on compensation rows
  compensated_by      TEXT,
  commit_order        INTEGER,
  created_at          INTEGER NOT NULL,
  settled_at          INTEGER
);
-- At most one live attempt per key, across connections and processes.
CREATE UNIQUE INDEX IF NOT EXISTS agent_effects_live_key ON agent_effects(idempotency_key)
  WHERE status IN ('pending','unknown','committed');
CREATE INDEX IF NOT EXISTS agent_effects_key ON agent_effects(idempotency_key, seq);
CREATE INDEX IF NOT EXISTS agent_effects_sandbox ON agent_effects(sandbox_id, seq);
CREATE INDEX IF NOT EXISTS agent_effects_lineage ON agent_effects(lineage_id, seq);
CREATE INDEX IF NOT EXISTS agent_effects_status ON agent_effects(status);
CREATE INDEX IF NOT EXISTS agent_effects_commit_order ON agent_effects(commit_order);

-- Effects a fork inherits from its parent's history (by reference, rows are not copied).
CREATE TABLE IF NOT EXISTS agent_effect_views (
  sandbox_id TEXT NOT NULL,
  effect_id  TEXT NOT NULL,
  PRIMARY KEY (sandbox_id, effect_id)
) WITHOUT ROWID;
`;

/**
 * Agent-state version 2: the process that runs an effect through run() (pid:start-time), so
 * that only attempts interrupted by that process's death become unknown; attempts begun
 * through begin() are run by the caller and stay pending until the caller settles them.
 */
export function addEffectRunner(db: Database.Database): void {
  addColumn(db, 'agent_effects', 'runner', 'TEXT');
}

/**
 * Agent-state version 3: verdicts belong to the timeline they were made on (sealed by a
 * checkpoint, abandoned by a rollback), so that a rollback judges exactly the verdicts of the
 * restored and abandoned timelines. Verdicts recorded before the upgrade look unsealed: the next
 * checkpoint seals them into the sandbox's current timeline, which is where the agent last held
 * them.
 */
export function addVerdictTimelines(db: Database.Database): void {
  addColumn(db, 'agent_verdicts', 'sealed_by', 'TEXT');
  addColumn(db, 'agent_verdicts', 'abandoned_by', 'TEXT');
}

/** The last version `agent_state_meta` ever recorded. */
const LAST_META_VERSION = 3;

/**
 * Refuses (AGENT_STATE_SCHEMA_TOO_NEW) agent-state tables whose `agent_state_meta` records a
 * version above 3: a build this one does not know wrote them.
 */
export function refuseNewerAgentState(db: Database.Database): void {
  if (!hasTable(db, 'agent_state_meta')) return;
  const v = db.prepare(`SELECT value FROM agent_state_meta WHERE key = 'schema_version'`).pluck().get() as
    string | undefined;
  const current = v === undefined ? 1 : Number(v);
  if (current > LAST_META_VERSION)
    throw new InvalidStateError(
      'AGENT_STATE_SCHEMA_TOO_NEW',
      `The agent-state tables are at schema version ${current}, newer than ` +
        `this build understands (${LAST_META_VERSION})`,
      { current, supported: LAST_META_VERSION },
    );
}

/** Drops `agent_state_meta`: the catalog's user_version now versions these tables. */
export function dropAgentStateMeta(db: Database.Database): void {
  refuseNewerAgentState(db);
  db.exec('DROP TABLE IF EXISTS agent_state_meta');
}
