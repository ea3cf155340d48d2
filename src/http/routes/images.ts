/**
 * Route: the images a sandbox can be created from. Installed images are
 * ready; shipped recipes not built into this state directory are listed too
 * (ready: false): the first create from one makes it (a build, or a link
 * from the build cache), so it may take longer.
 * Host paths (the rootfs) stay on the server.
 */
import type { FastifyInstance } from 'fastify';
import { listRecipes } from '../../images/image-store.js';
import type { ApiContext } from '../context.js';
import * as S from '../schemas.js';

/** An image as the API lists it. */
export interface ImageListing {
  name: string;
  ready: boolean;
  /** recipe:NAME@HASH, docker:REF, or "recipe" for a recipe not built yet. */
  source: string;
  sizeBytes: number | null;
  createdAt: string | null;
}

export function imageRoutes(app: FastifyInstance, ctx: ApiContext): void {
  app.get(
    '/images',
    {
      schema: {
        tags: ['images'],
        operationId: 'listImages',
        'x-lockstep-doc': {
          success:
            '200 `[{name, ready, source, sizeBytes, createdAt}]` (`ready: false`: a shipped recipe not built yet)',
        },
        summary: 'Images to create sandboxes from (ready: false: a shipped recipe the first create will build or link)',
        response: { 200: S.arrayOf(S.imageInfo, 'Images by name'), ...S.errors() },
      },
    },
    async (): Promise<ImageListing[]> => {
      const installed: ImageListing[] = ctx.lockstep.images.list().map((r) => ({
        name: r.name,
        ready: true,
        source: r.source,
        sizeBytes: r.size_bytes,
        createdAt: new Date(r.created_at).toISOString(),
      }));
      const names = new Set(installed.map((i) => i.name));
      const pending: ImageListing[] = listRecipes()
        .filter((n) => !names.has(n))
        .map((name) => ({ name, ready: false, source: 'recipe', sizeBytes: null, createdAt: null }));
      return [...installed, ...pending].sort((a, b) => a.name.localeCompare(b.name));
    },
  );
}
