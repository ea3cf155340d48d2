/** The MCP server: one sandbox as tools for any MCP client. */
export { createMcpServer, type McpServerOptions } from './server.js';
export { runMcpStdio, type McpStdioOptions } from './stdio.js';
