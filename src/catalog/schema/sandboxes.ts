/**
 * The core tables as the first catalog version made them: images,
 * sandboxes, layers, checkpoints and the operation journal. Columns added
 * since are steps of src/catalog/migrations.ts.
 */
export const CORE_TABLES = `
CREATE TABLE IF NOT EXISTS images (
  name TEXT PRIMARY KEY,
  rootfs TEXT NOT NULL,
  source TEXT NOT NULL,
  size_bytes INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  deleted INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sandboxes (
  id TEXT PRIMARY KEY,
  tenant TEXT,
  image TEXT NOT NULL REFERENCES images(name),
  runtime_layer TEXT NOT NULL,
  state TEXT NOT NULL,
  init_pid INTEGER,
  init_start INTEGER,
  memory_bytes INTEGER,
  pids_max INTEGER,
  hostname TEXT NOT NULL,
  lineage_id TEXT NOT NULL,
  branch_id TEXT NOT NULL,
  head_checkpoint_id TEXT,
  forked_from TEXT,
  env TEXT NOT NULL DEFAULT '{}',
  metadata TEXT NOT NULL DEFAULT '{}',
  created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_tenant ON sandboxes(tenant);
CREATE TABLE IF NOT EXISTS layers (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL CHECK (kind IN ('upper', 'checkpoint')),
  sandbox_id TEXT NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
  id TEXT PRIMARY KEY,
  sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
  parent_id TEXT,
  layer_id TEXT NOT NULL REFERENCES layers(id),
  image TEXT NOT NULL REFERENCES images(name),
  runtime_layer TEXT NOT NULL,
  branch_id TEXT NOT NULL,
  label TEXT,
  ledger_cursor INTEGER NOT NULL DEFAULT 0,
  context_id TEXT,
  sizes TEXT NOT NULL DEFAULT '{}',
  timings TEXT NOT NULL DEFAULT '{}',
  created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoints_sandbox ON checkpoints(sandbox_id);
CREATE TABLE IF NOT EXISTS operations (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  sandbox_id TEXT NOT NULL,
  phase TEXT NOT NULL,
  payload TEXT NOT NULL DEFAULT '{}',
  started_at INTEGER NOT NULL
);`;
