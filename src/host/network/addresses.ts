/**
 * Addresses of egress sandboxes. The configured private range
 * (LOCKSTEP_NETWORK_RANGE) is cut into /31s: slot k is the pair
 * (base + 2k, base + 2k + 1); the even address is the host side of the
 * sandbox's veth (its gateway and resolver), the odd one the sandbox's own.
 * A slot is recorded on the sandbox's row under a unique index, so no two
 * sandboxes (forks included) share an address; a warm standby shares its
 * sandbox's, which is what lets a swap keep the policy untouched.
 */
import { HostError } from '../../errors.js';
import { intToIpv4, parseCidr } from './policy.js';

export interface SlotAddresses {
  slot: number;
  /** Host side of the veth: the sandbox's gateway and DNS server. */
  gateway: string;
  /** The sandbox's own address (eth0 inside). */
  address: string;
  prefixLength: 31;
}

/** The /31 of a slot in the range. */
export function slotAddresses(range: string, slot: number): SlotAddresses {
  const r = parseCidr(range)!;
  const base = r.base + 2 * slot;
  return { slot, gateway: intToIpv4(base), address: intToIpv4(base + 1), prefixLength: 31 };
}

/** Slots in the range; slot 0 (the range's first address) is never handed out. */
export function slotCount(range: string): number {
  const r = parseCidr(range)!;
  return 2 ** (32 - r.bits) / 2;
}

/**
 * The next free slot after the highest one in use (wrapping to the lowest
 * free), so a freed address is not handed out again at once: conntrack
 * entries of the old sandbox's connections age out first. Call inside the
 * transaction that records it.
 */
export function freeSlot(catalog: { netSlots(): number[] }, range: string): number {
  const used = catalog.netSlots();
  const count = slotCount(range);
  const highest = used.length ? used[used.length - 1]! : 0;
  if (highest + 1 < count) return highest + 1;
  const taken = new Set(used);
  for (let s = 1; s < count; s++) if (!taken.has(s)) return s;
  throw new HostError(
    'NETWORK_ADDRESSES_EXHAUSTED',
    `Every one of the ${count - 1} sandbox addresses in ${range} is in use (LOCKSTEP_NETWORK_RANGE)`,
  );
}
