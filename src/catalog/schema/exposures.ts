/** Exposed ports of sandboxes, reached through the manager (src/network/exposed-ports.ts); tokens kept as sha256 hashes. */
export const EXPOSURES_TABLE = `
CREATE TABLE IF NOT EXISTS exposures (
  id          TEXT PRIMARY KEY,
  sandbox_id  TEXT NOT NULL,
  tenant      TEXT,
  port        INTEGER NOT NULL,
  token_hash  TEXT NOT NULL,
  created_at  INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS exposures_port ON exposures(sandbox_id, port);`;
