/** One Lockstep per CLI invocation: opened for the command, closed after it (sandboxes keep running). */
import { Lockstep } from '../api/lockstep.js';

export async function withLockstep<T>(fn: (ls: Lockstep) => Promise<T>): Promise<T> {
  const ls = await Lockstep.open();
  try {
    return await fn(ls);
  } finally {
    await ls.close();
  }
}
