/**
 * Input limits that the library, the HTTP JSON schemas (http/schemas.ts) and
 * the MCP tools (mcp/server.ts) share, so that a caller meets the same rule
 * whichever way it comes in. The library's validation refuses what is past
 * them with INVALID_ARGUMENT naming the field.
 */

/** Longest image name, in characters (images/image-store.ts, validateImageName). */
export const IMAGE_NAME_MAX = 63;

/** Longest command timeout, in integer milliseconds: 24 h (instances/commands.ts, validateCommand). */
export const COMMAND_TIMEOUT_MAX_MS = 24 * 3600 * 1000;

/** A sandbox's lifetime (CreateOptions.timeoutMs), in integer milliseconds: 1 s to 30 days (lifecycle/create.ts). */
export const SANDBOX_LIFETIME_MS = { min: 1000, max: 30 * 24 * 3600 * 1000 };
