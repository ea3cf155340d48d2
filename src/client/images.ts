/** The images a tenant can create sandboxes from, over HTTP. */
import type { Answer, Checked } from './wire.js';
import { Transport, type CallOptions, type ConnectionOptions } from './transport.js';

/** An image as the API lists it; ready: false is a shipped recipe not made yet (the first create from it makes it). */
export interface ImageInfo {
  name: string;
  ready: boolean;
  source: string;
  sizeBytes: number | null;
  createdAt: string | null;
}

/** Image listing (building images is the operator's: `lockstep image build NAME` on the host). */
export class Images {
  static async list(opts: ConnectionOptions & CallOptions = {}): Promise<ImageInfo[]> {
    return new Transport(opts).json<Checked<ImageInfo, Answer<'/v1/images', 'get'>[number]>[]>({
      method: 'GET',
      path: '/images',
      signal: opts.signal,
    });
  }
}
