/**
 * The wire formats moved to src/wire.ts: the MCP server and the clients use
 * them too, so they are no part of the HTTP layer. This re-export keeps the
 * old import path working for code written against it.
 */
export * from '../wire.js';
