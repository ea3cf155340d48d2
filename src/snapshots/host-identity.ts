/**
 * What a process image needs of the host that restores it, recorded in a
 * bundle's header and checked before an import writes anything:
 * - the architecture, and a kernel at least as new as the one it was dumped
 *   on (CRIU's images use the kernel interfaces the dump found; an older
 *   kernel may lack them);
 * - the CPU's instruction-set extensions. CRIU restores the FPU/xsave state
 *   of every task, and programs pick code paths by the CPU features they
 *   saw at start (glibc's ifuncs, NumPy's dispatch): restoring on a CPU
 *   without one of them ends in SIGILL or a refused restore. The list is
 *   /proc/cpuinfo's flags, restricted to instruction-set extensions (flags
 *   that describe the machine, such as `hypervisor` or bug workarounds, do
 *   not matter to a restored program).
 */
import fs from 'node:fs';
import os from 'node:os';
import { LockstepError } from '../errors.js';

/** The host facts a bundle records. */
export interface HostIdentity {
  arch: string;
  kernelRelease: string;
  cpuFlags: string[];
}

/** Instruction-set extensions user code can depend on (x86-64 names, as /proc/cpuinfo spells them). */
const ISA_FLAGS = new Set(
  (
    'fpu mmx sse sse2 ssse3 sse4_1 sse4_2 sse4a pni cx8 cx16 popcnt abm lzcnt movbe f16c fma fma4 ' +
    'avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512ifma avx512vbmi avx512vbmi2 avx512_vnni ' +
    'avx512_bitalg avx512_vpopcntdq avx512_bf16 avx512_fp16 avx_vnni bmi1 bmi2 adx aes pclmulqdq vaes ' +
    'vpclmulqdq gfni sha_ni rdrand rdseed xsave xsaveopt xsavec xsaves pku ospke clflushopt clwb erms ' +
    'fsrm amx_tile amx_int8 amx_bf16 cmov lahf_lm'
  ).split(' '),
);

/** This host's identity. */
export function hostIdentity(cpuinfo = readCpuinfo()): HostIdentity {
  const line = cpuinfo.split('\n').find((l) => /^(flags|Features)\s*:/.test(l)) ?? '';
  const flags = line
    .replace(/^[^:]*:/, '')
    .trim()
    .split(/\s+/)
    .filter((f) => ISA_FLAGS.has(f))
    .sort();
  return { arch: process.arch, kernelRelease: os.release(), cpuFlags: [...new Set(flags)] };
}

function readCpuinfo(): string {
  try {
    return fs.readFileSync('/proc/cpuinfo', 'utf8');
  } catch {
    return '';
  }
}

/** A snapshot bundle this host cannot run; nothing was imported. */
export class SnapshotIncompatibleError extends LockstepError {
  constructor(reason: string, details: Record<string, unknown> = {}) {
    super('SNAPSHOT_INCOMPATIBLE', `This host cannot restore the snapshot: ${reason}; nothing was imported`, {
      details: { reason, ...details },
    });
  }
}

function kernelVersion(release: string): [number, number] | null {
  const m = /^(\d+)\.(\d+)/.exec(release);
  return m ? [Number(m[1]), Number(m[2])] : null;
}

/** Throws SnapshotIncompatibleError unless `here` can restore an image dumped on `source`. */
export function checkCompatible(source: unknown, here: HostIdentity = hostIdentity()): void {
  const s = source as Partial<HostIdentity> | undefined;
  if (!s || typeof s.arch !== 'string' || typeof s.kernelRelease !== 'string' || !Array.isArray(s.cpuFlags))
    throw new SnapshotIncompatibleError('the bundle does not say which kernel and CPU its processes ran on');
  if (s.arch !== here.arch)
    throw new SnapshotIncompatibleError(`it was taken on ${s.arch}, this host is ${here.arch}`, { field: 'arch' });
  const want = kernelVersion(s.kernelRelease);
  const have = kernelVersion(here.kernelRelease);
  if (!want || !have || have[0] < want[0] || (have[0] === want[0] && have[1] < want[1]))
    throw new SnapshotIncompatibleError(
      `it was taken on kernel ${s.kernelRelease}, this host runs ${here.kernelRelease} (an older kernel may lack what CRIU restores)`,
      { field: 'kernelRelease', source: s.kernelRelease, here: here.kernelRelease },
    );
  const missing = s.cpuFlags.filter((f) => typeof f === 'string' && ISA_FLAGS.has(f) && !here.cpuFlags.includes(f));
  if (missing.length)
    throw new SnapshotIncompatibleError(`this CPU lacks ${missing.join(', ')}, which the source CPU had`, {
      field: 'cpuFlags',
      missing,
    });
}
