/**
 * What the sandbox verbs ask of the network, in one place: a new egress
 * sandbox's pair and policy (create), a restored instance's pair (fork,
 * standby, CRIU rollback), the standby swap, and the teardown. Every function
 * returns at once for a sandbox without a network ("none"), so that mode
 * costs nothing.
 */
import type { SandboxRow } from '../catalog/catalog.js';
import type { VethConfig } from '../native/binding.js';
import { policyOf } from '../host/network/policy.js';
import { SandboxFiles } from '../instances/files.js';
import type { HostNetwork } from '../host/network/host-network.js';
import type { NativeBinding } from '../ports.js';
import type { SandboxResolver } from './dns.js';
import type { StatePaths } from '../paths.js';

/** What sandbox-network.ts uses of the manager's services (api/engine.ts builds them). */
export interface SandboxNetworkDeps {
  dns: SandboxResolver;
  native: NativeBinding;
  network: HostNetwork;
  paths: StatePaths;
}

/** A new sandbox's init is running: give it its eth0 and its policy. */
export async function attachNewSandbox(engine: SandboxNetworkDeps, row: SandboxRow, pid: number): Promise<void> {
  const policy = policyOf(row.network ?? null);
  if (!policy || row.net_slot == null) return;
  const veth = await engine.network.addLinks(row.instance, row.net_slot, policy, { up: true });
  await engine.native.attachVeth(pid, veth);
  await engine.network.addPolicy(row.net_slot, policy);
  await engine.dns.open(row);
  await pointResolverAt(engine, row);
}

/**
 * /etc/resolv.conf names the sandbox's own resolver (its gateway, the one
 * DNS server its policy lets it reach), so ordinary tools resolve through
 * it. Written through the files API (openat2 below the root, temp file and
 * rename), as root inside; a fork's is rewritten, since its gateway is its own.
 */
async function pointResolverAt(engine: SandboxNetworkDeps, row: SandboxRow): Promise<void> {
  const { gateway } = engine.network.addresses(row.net_slot!);
  const files = new SandboxFiles(
    engine.native,
    () => engine.paths.sandboxRoot(row.instance),
    () => row.id_base,
  );
  await files.write(
    '/etc/resolv.conf',
    `# Lockstep's resolver for this sandbox: it answers the names its allow list permits\nnameserver ${gateway}\n`,
    { mode: 0o644 },
  );
}

/**
 * Before CRIU restores an instance of `row` (fork, standby, rollback): the
 * pair, whose sandbox side the addon moves in at setup-namespaces. A
 * standby's host side stays down until it is swapped in (it shares the
 * sandbox's address, and only one of the two may route it).
 */
export async function prepareRestoredNetwork(
  engine: SandboxNetworkDeps,
  instance: string,
  row: SandboxRow,
  opts: { standby: boolean },
): Promise<VethConfig | undefined> {
  const policy = policyOf(row.network ?? null);
  if (!policy || row.net_slot == null) return undefined;
  return engine.network.addLinks(instance, row.net_slot, policy, { up: !opts.standby });
}

/** A fork's own policy under its own address (its pair was made by prepareRestoredNetwork). */
export async function addForkPolicy(engine: SandboxNetworkDeps, child: SandboxRow): Promise<void> {
  const policy = policyOf(child.network ?? null);
  if (!policy || child.net_slot == null) return;
  await engine.network.addPolicy(child.net_slot, policy);
  await engine.dns.open(child);
  await pointResolverAt(engine, child);
}

/**
 * The standby swap's network step: the old instance's host side goes down
 * (its routes with it), the standby's comes up (its connected route takes
 * the sandbox's /31). Two ioctls; the allow set is keyed by address and does
 * not change. `undo` puts it back when the swap does not commit.
 */
export function swapLinks(engine: SandboxNetworkDeps, row: SandboxRow, from: string, to: string): void {
  if (!row.network || row.net_slot == null) return;
  engine.native.setLinkUp(engine.network.linkNames(from).host, false);
  engine.native.setLinkUp(engine.network.linkNames(to).host, true);
}

/** Removes a sandbox's policy elements and resolver (remove, failed create or fork). Pairs go with their instances. */
export async function forgetNetwork(
  engine: SandboxNetworkDeps,
  row: Pick<SandboxRow, 'id' | 'network' | 'net_slot'>,
): Promise<void> {
  if (row.net_slot == null) return;
  await engine.dns.close(row.id);
  await engine.network.removePolicies(new Set([engine.network.addresses(row.net_slot).address]));
}
