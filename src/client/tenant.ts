/** The calling tenant over HTTP: `GET /v1/tenant`, the tenant the token names. */
import type { Tenant as TenantRow } from '../tenants/tenants.js';
import type { TenantUsage } from '../tenants/quotas.js';
import type { Answer, Checked } from './wire.js';
import { Transport, type CallOptions, type ConnectionOptions } from './transport.js';

/** The tenant as the API shows it: its id, name and quotas, with what it uses now. */
export type RemoteTenantInfo = TenantRow & { usage: TenantUsage };

/** The tenant the API key belongs to. */
export class Tenant {
  /** Its id (tn_…), name, quotas and usage. */
  static async info(opts: ConnectionOptions & CallOptions = {}): Promise<RemoteTenantInfo> {
    return new Transport(opts).json<Checked<RemoteTenantInfo, Answer<'/v1/tenant', 'get'>>>({
      method: 'GET',
      path: '/tenant',
      signal: opts.signal,
    });
  }
}
