/**
 * Catalog step 16: the `instances` table (one row per process instance of a
 * sandbox, live or warm standby) replaces the sandboxes.standby_* columns,
 * and the `holds` table says who keeps a layer, an image or a process image.
 *
 * Both tables are kept by SQLite triggers in the transaction of the row
 * they follow:
 * - the live instance row mirrors sandboxes.instance, init_pid and
 *   init_start (inserted with the sandbox, replaced when its instance
 *   changes, deleted with it); the standby row is written only by
 *   Catalog.setStandby and Catalog.clearStandby;
 * - a sandbox holds its image; a checkpoint holds its layer, its image and
 *   its process image folder (named by its id); a snapshot holds its layer,
 *   its image and its process image folder; an instance holds the image its
 *   root filesystem mounts (its sandbox's).
 * A thing is held while any `holds` row names it (Catalog.isHeld).
 */
import type Database from 'better-sqlite3';

/** Milliseconds since the epoch, in SQL (for rows the triggers write). */
const NOW_MS = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)";

/** The tables and triggers, idempotent. */
export const INSTANCES_AND_HOLDS_SQL = `
CREATE TABLE IF NOT EXISTS instances (
  id            TEXT PRIMARY KEY,
  sandbox_id    TEXT NOT NULL,
  role          TEXT NOT NULL CHECK (role IN ('live', 'standby')),
  checkpoint_id TEXT,
  pid           INTEGER,
  start         INTEGER,
  created_at    INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS instances_role ON instances(sandbox_id, role);

CREATE TABLE IF NOT EXISTS holds (
  what        TEXT NOT NULL CHECK (what IN ('layer', 'image', 'process-image')),
  id          TEXT NOT NULL,
  holder_kind TEXT NOT NULL CHECK (holder_kind IN ('sandbox', 'checkpoint', 'snapshot', 'instance')),
  holder_id   TEXT NOT NULL,
  PRIMARY KEY (what, id, holder_kind, holder_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS holds_holder ON holds(holder_kind, holder_id);

-- sandboxes: the live instance, and the image the sandbox holds
CREATE TRIGGER IF NOT EXISTS sandboxes_holds_insert AFTER INSERT ON sandboxes BEGIN
  INSERT OR IGNORE INTO holds VALUES ('image', NEW.image, 'sandbox', NEW.id);
  INSERT INTO instances (id, sandbox_id, role, checkpoint_id, pid, start, created_at)
    VALUES (coalesce(NEW.instance, NEW.id), NEW.id, 'live', NULL, NEW.init_pid, NEW.init_start, ${NOW_MS});
END;
CREATE TRIGGER IF NOT EXISTS sandboxes_holds_image AFTER UPDATE OF image ON sandboxes
WHEN NEW.image IS NOT OLD.image BEGIN
  UPDATE holds SET id = NEW.image WHERE what = 'image' AND (
    (holder_kind = 'sandbox' AND holder_id = NEW.id) OR
    (holder_kind = 'instance' AND holder_id IN (SELECT id FROM instances WHERE sandbox_id = NEW.id)));
END;
CREATE TRIGGER IF NOT EXISTS sandboxes_live_instance AFTER UPDATE OF instance, init_pid, init_start ON sandboxes BEGIN
  -- The old live instance, unless it is still the one; a promoted standby becomes the live row.
  DELETE FROM instances WHERE sandbox_id = NEW.id AND role = 'live' AND id IS NOT coalesce(NEW.instance, NEW.id);
  DELETE FROM instances WHERE id = coalesce(NEW.instance, NEW.id) AND role = 'standby';
  UPDATE instances SET pid = NEW.init_pid, start = NEW.init_start
    WHERE id = coalesce(NEW.instance, NEW.id) AND role = 'live';
  INSERT INTO instances (id, sandbox_id, role, checkpoint_id, pid, start, created_at)
    SELECT coalesce(NEW.instance, NEW.id), NEW.id, 'live', NULL, NEW.init_pid, NEW.init_start, ${NOW_MS}
    WHERE NOT EXISTS (SELECT 1 FROM instances WHERE id = coalesce(NEW.instance, NEW.id));
END;
CREATE TRIGGER IF NOT EXISTS sandboxes_holds_delete AFTER DELETE ON sandboxes BEGIN
  DELETE FROM instances WHERE sandbox_id = OLD.id;
  DELETE FROM holds WHERE holder_kind = 'sandbox' AND holder_id = OLD.id;
END;

-- instances: the image their root filesystem mounts
CREATE TRIGGER IF NOT EXISTS instances_holds_insert AFTER INSERT ON instances BEGIN
  INSERT OR IGNORE INTO holds SELECT 'image', image, 'instance', NEW.id FROM sandboxes WHERE id = NEW.sandbox_id;
END;
CREATE TRIGGER IF NOT EXISTS instances_holds_delete AFTER DELETE ON instances BEGIN
  DELETE FROM holds WHERE holder_kind = 'instance' AND holder_id = OLD.id;
END;

-- checkpoints: their layer, image and process image folder
CREATE TRIGGER IF NOT EXISTS checkpoints_holds_insert AFTER INSERT ON checkpoints BEGIN
  INSERT OR IGNORE INTO holds VALUES ('layer', NEW.layer_id, 'checkpoint', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('image', NEW.image, 'checkpoint', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('process-image', NEW.id, 'checkpoint', NEW.id);
END;
CREATE TRIGGER IF NOT EXISTS checkpoints_holds_update AFTER UPDATE OF id, layer_id, image ON checkpoints BEGIN
  DELETE FROM holds WHERE holder_kind = 'checkpoint' AND holder_id = OLD.id;
  INSERT OR IGNORE INTO holds VALUES ('layer', NEW.layer_id, 'checkpoint', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('image', NEW.image, 'checkpoint', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('process-image', NEW.id, 'checkpoint', NEW.id);
END;
CREATE TRIGGER IF NOT EXISTS checkpoints_holds_delete AFTER DELETE ON checkpoints BEGIN
  DELETE FROM holds WHERE holder_kind = 'checkpoint' AND holder_id = OLD.id;
END;

-- snapshots: their layer, image and process image folder
CREATE TRIGGER IF NOT EXISTS snapshots_holds_insert AFTER INSERT ON snapshots BEGIN
  INSERT OR IGNORE INTO holds VALUES ('layer', NEW.layer_id, 'snapshot', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('image', NEW.image, 'snapshot', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('process-image', NEW.process_image, 'snapshot', NEW.id);
END;
CREATE TRIGGER IF NOT EXISTS snapshots_holds_update AFTER UPDATE OF id, layer_id, image, process_image ON snapshots BEGIN
  DELETE FROM holds WHERE holder_kind = 'snapshot' AND holder_id = OLD.id;
  INSERT OR IGNORE INTO holds VALUES ('layer', NEW.layer_id, 'snapshot', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('image', NEW.image, 'snapshot', NEW.id);
  INSERT OR IGNORE INTO holds VALUES ('process-image', NEW.process_image, 'snapshot', NEW.id);
END;
CREATE TRIGGER IF NOT EXISTS snapshots_holds_delete AFTER DELETE ON snapshots BEGIN
  DELETE FROM holds WHERE holder_kind = 'snapshot' AND holder_id = OLD.id;
END;
`;

/** The standby columns step 16 moves into `instances` rows. */
const STANDBY_COLUMNS = ['standby_instance', 'standby_checkpoint', 'standby_pid', 'standby_start', 'standby_at'];

/**
 * Step 9, run inside the step's transaction: creates `instances` and
 * `holds` with their triggers, moves each sandbox's live instance and warm
 * standby (the standby_* columns) into `instances` rows, drops those
 * columns, and fills `holds` from the rows that hold.
 */
export function instancesAndHolds(db: Database.Database): void {
  db.exec(INSTANCES_AND_HOLDS_SQL);
  const cols = new Set((db.prepare('PRAGMA table_info(sandboxes)').all() as { name: string }[]).map((c) => c.name));
  db.exec(`
INSERT OR IGNORE INTO instances (id, sandbox_id, role, checkpoint_id, pid, start, created_at)
  SELECT coalesce(instance, id), id, 'live', NULL, init_pid, init_start, created_at FROM sandboxes;`);
  if (cols.has('standby_instance'))
    db.exec(`
INSERT OR IGNORE INTO instances (id, sandbox_id, role, checkpoint_id, pid, start, created_at)
  SELECT standby_instance, id, 'standby', standby_checkpoint, standby_pid, standby_start,
         ${cols.has('standby_at') ? 'coalesce(standby_at, 0)' : '0'}
  FROM sandboxes WHERE standby_instance IS NOT NULL;`);
  // No index or trigger names these columns, so SQLite drops them in place.
  for (const col of STANDBY_COLUMNS) if (cols.has(col)) db.exec(`ALTER TABLE sandboxes DROP COLUMN ${col}`);
  db.exec(`
DELETE FROM holds;
INSERT OR IGNORE INTO holds SELECT 'image', image, 'sandbox', id FROM sandboxes;
INSERT OR IGNORE INTO holds SELECT 'image', s.image, 'instance', i.id FROM instances i JOIN sandboxes s ON s.id = i.sandbox_id;
INSERT OR IGNORE INTO holds SELECT 'layer', layer_id, 'checkpoint', id FROM checkpoints;
INSERT OR IGNORE INTO holds SELECT 'image', image, 'checkpoint', id FROM checkpoints;
INSERT OR IGNORE INTO holds SELECT 'process-image', id, 'checkpoint', id FROM checkpoints;
INSERT OR IGNORE INTO holds SELECT 'layer', layer_id, 'snapshot', id FROM snapshots;
INSERT OR IGNORE INTO holds SELECT 'image', image, 'snapshot', id FROM snapshots;
INSERT OR IGNORE INTO holds SELECT 'process-image', process_image, 'snapshot', id FROM snapshots;`);
}
