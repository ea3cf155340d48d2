/** Named snapshots that outlive their sandbox (src/snapshots/). */
export const SNAPSHOTS_TABLE = `
CREATE TABLE IF NOT EXISTS snapshots (
  id                TEXT PRIMARY KEY,
  tenant            TEXT,
  name              TEXT,
  metadata          TEXT NOT NULL DEFAULT '{}',
  size_bytes        INTEGER NOT NULL,
  layer_id          TEXT NOT NULL,
  process_image     TEXT NOT NULL,
  image             TEXT NOT NULL REFERENCES images(name),
  image_source      TEXT NOT NULL,
  runtime_layer     TEXT NOT NULL,
  checksums         TEXT NOT NULL,
  context_id        TEXT,
  lineage_id        TEXT NOT NULL,
  ledger_cursor     INTEGER NOT NULL DEFAULT 0,
  source_sandbox    TEXT,
  source_checkpoint TEXT,
  template          TEXT NOT NULL,
  digest            TEXT,
  bundle_bytes      INTEGER,
  created_at        INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS snapshots_name ON snapshots(coalesce(tenant, ''), name) WHERE name IS NOT NULL;
CREATE INDEX IF NOT EXISTS snapshots_tenant ON snapshots(tenant);
CREATE INDEX IF NOT EXISTS snapshots_layer ON snapshots(layer_id);`;
