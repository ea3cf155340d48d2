/**
 * Who made a bundle: every bundle this state directory exports is signed
 * with its own Ed25519 key (node:crypto), and an import accepts a bundle
 * only if it is signed by a key it trusts (its own, and those in
 * LOCKSTEP_TRUSTED_BUNDLE_KEYS). A bundle's CRIU images are parsed by CRIU
 * as root when a sandbox starts from it, and its layer by `btrfs receive`:
 * the signature is what lets a host run those parsers only on bytes another
 * Lockstep host of the operator's produced (docs/SECURITY.md, "Snapshots, bundles and pulls").
 *
 * What is signed is the bundle's digest (the SHA-256 of every byte before
 * its end frame), under a context string, so the signature covers every
 * frame. Ed25519 signatures are deterministic: the same bundle exported
 * twice has the same bytes, which resumed downloads rely on.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createPrivateKey, createPublicKey, generateKeyPairSync, sign, verify, type KeyObject } from 'node:crypto';
import { LockstepError } from '../errors.js';

/** What the signature is over: this context, then the 32-byte digest. */
const CONTEXT = Buffer.from('lockstep snapshot bundle v1\0', 'latin1');
/** DER prefix of an Ed25519 SubjectPublicKeyInfo; the 32 raw key bytes follow. */
const SPKI_PREFIX = Buffer.from('302a300506032b6570032100', 'hex');

/** The bundle is unsigned, signed by a key this host does not trust, or its signature does not verify; nothing was imported. */
export class BundleUntrustedError extends LockstepError {
  constructor(reason: string, details: Record<string, unknown> = {}) {
    super(
      'BUNDLE_UNTRUSTED',
      `The snapshot bundle is not trusted here: ${reason}; nothing was imported ` +
        '(an import accepts bundles signed by this host or by a key in LOCKSTEP_TRUSTED_BUNDLE_KEYS)',
      { details: { reason, ...details } },
    );
  }
}

/** The public key as configuration names it: `ed25519:` and its 32 bytes in base64url. */
export function keyName(key: KeyObject): string {
  const der = key.export({ format: 'der', type: 'spki' });
  return `ed25519:${der.subarray(SPKI_PREFIX.length).toString('base64url')}`;
}

function publicKeyOf(name: string): KeyObject | undefined {
  const raw = Buffer.from(name.slice('ed25519:'.length), 'base64url');
  if (!name.startsWith('ed25519:') || raw.length !== 32) return undefined;
  return createPublicKey({ key: Buffer.concat([SPKI_PREFIX, raw]), format: 'der', type: 'spki' });
}

/** A host's signing key pair. */
export interface SigningKey {
  privateKey: KeyObject;
  /** `ed25519:…` */
  name: string;
}

/** This state directory's key, made on first use (0600 in a 0700 folder; a concurrent maker's key wins). */
export function hostSigningKey(file: string): SigningKey {
  if (!fs.existsSync(file)) {
    fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
    const { privateKey } = generateKeyPairSync('ed25519');
    const pem = privateKey.export({ format: 'pem', type: 'pkcs8' });
    const tmp = `${file}.${process.pid}.tmp`;
    fs.writeFileSync(tmp, pem, { mode: 0o600 });
    try {
      fs.linkSync(tmp, file); // fails if another process made one meanwhile: theirs is kept
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    } finally {
      fs.rmSync(tmp, { force: true });
    }
  }
  const privateKey = createPrivateKey(fs.readFileSync(file));
  return { privateKey, name: keyName(createPublicKey(privateKey)) };
}

/** The signature frame's payload: which key signed, and the signature over the digest. */
export interface BundleSignature {
  key: string;
  signature: string;
}

export function signDigest(key: SigningKey, digest: Buffer): BundleSignature {
  return {
    key: key.name,
    signature: sign(null, Buffer.concat([CONTEXT, digest]), key.privateKey).toString('base64url'),
  };
}

/** Throws BUNDLE_UNTRUSTED unless `sig` is a valid signature of `digest` by one of `trusted`. */
export function checkSignature(sig: unknown, digest: Buffer, trusted: readonly string[]): string {
  if (sig === undefined) throw new BundleUntrustedError('it is not signed', { signer: null });
  const s = sig as Partial<BundleSignature>;
  if (!s || typeof s.key !== 'string' || typeof s.signature !== 'string')
    throw new BundleUntrustedError('its signature frame is malformed', { signer: null });
  if (!trusted.includes(s.key))
    throw new BundleUntrustedError(`it is signed by ${s.key}, which this host does not trust`, { signer: s.key });
  const key = publicKeyOf(s.key);
  const raw = Buffer.from(s.signature, 'base64url');
  if (!key || raw.length !== 64 || !verify(null, Buffer.concat([CONTEXT, digest]), key, raw))
    throw new BundleUntrustedError(`its signature by ${s.key} does not verify (the bundle was altered)`, {
      signer: s.key,
    });
  return s.key;
}
