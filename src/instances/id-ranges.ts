/**
 * Host id ranges for sandboxes' user namespaces. Root inside a sandbox is
 * host uid/gid `id_base`, and ids 0..ID_RANGE_SIZE-1 inside are
 * id_base..id_base+ID_RANGE_SIZE-1 on the host. Ranges start high, well
 * clear of the ranges /etc/subuid hands out (100000 and up by default), and
 * are recorded on the sandbox's catalog row under a unique index, so two
 * sandboxes (forks included) never share one; removing the row (remove, the
 * reaper) frees it.
 */
import fs from 'node:fs';
import path from 'node:path';
import { HostError } from '../errors.js';
import type { StatePaths } from '../paths.js';

export const ID_RANGE_SIZE = 65536;
/** First host id handed out: 2^30. */
export const FIRST_ID_BASE = 0x40000000;
/** Ranges up to just below 2^32 - 1 ((uid_t)-1 is reserved). */
export const MAX_ID_RANGES = (0xffff0000 - FIRST_ID_BASE) / ID_RANGE_SIZE;

/**
 * A restored tree resolves its root, /dev and process image paths from
 * inside its user namespace, as an unprivileged host id: the folders on the
 * way must be searchable (not readable) by others, as Docker's userns-remap
 * and runc require. The last folder of each path (a sandbox's run folder, a
 * process image) is open only to the sandbox's root group (0750), so no
 * other host user gets further.
 */
export function openHomeForUserNamespaces(paths: StatePaths): void {
  for (let dir = path.dirname(paths.home); dir !== path.dirname(dir); dir = path.dirname(dir)) {
    if ((fs.statSync(dir).mode & 0o001) === 0) {
      throw new HostError(
        'HOME_NOT_SEARCHABLE',
        `User namespaces need every folder above the state directory to be searchable by others (o+x); ${dir} is not`,
      );
    }
  }
  for (const dir of [
    paths.home,
    paths.run,
    paths.sandboxesRun,
    paths.store,
    paths.uppers,
    paths.processImages,
    paths.scratch,
  ])
    fs.chmodSync(dir, 0o711);
}

/**
 * The lowest free range. Call inside the transaction that writes it to the
 * row: the unique index turns a race between managers into a failed
 * transaction rather than a shared range.
 */
export function freeIdBase(catalog: { idBases(): number[] }): number {
  let want = FIRST_ID_BASE;
  for (const base of catalog.idBases()) {
    if (base > want) break;
    if (base === want) want += ID_RANGE_SIZE;
  }
  if ((want - FIRST_ID_BASE) / ID_RANGE_SIZE >= MAX_ID_RANGES) {
    throw new HostError(
      'ID_RANGES_EXHAUSTED',
      `Every one of the ${MAX_ID_RANGES} host id ranges for user namespaces is in use`,
    );
  }
  return want;
}
