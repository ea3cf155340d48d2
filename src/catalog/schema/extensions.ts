/** The schema version of each catalog extension (src/catalog/extensions.ts), by extension name. */
export const EXTENSIONS_TABLE = `
CREATE TABLE IF NOT EXISTS catalog_extensions (
  name    TEXT PRIMARY KEY,
  version INTEGER NOT NULL
);`;
