/**
 * The floors of src/ (docs/ARCHITECTURE.md, "Layers"). A module imports only
 * from its own floor or the floors below it; type-only imports count too.
 * `npm run lint:floors` checks it; `npm run floors:graph` draws the graph.
 *
 *   5 front ends  http/ mcp/ cli/ client/ integrations/
 *   4 api         api/ index.ts
 *   3 verbs       lifecycle/ checkpoints/ snapshots/ agent-state/ context/
 *                 effects/ provenance/ network/ tenants/ images/
 *   2 catalog     catalog/
 *   1 host        the base files, host/ native/ layers/ instances/
 */
const floors = [
  {
    name: 'host',
    path: [
      '^src/(errors|errors-from-wire|config|log|paths|ports|faults|admission|token-bucket|version|server-defaults|limits)\\.ts$',
      '^src/(host|native|layers|instances)/',
    ],
  },
  { name: 'catalog', path: ['^src/catalog/'] },
  {
    name: 'verbs',
    path: ['^src/(lifecycle|checkpoints|snapshots|agent-state|context|effects|provenance|network|tenants|images)/'],
  },
  { name: 'api', path: ['^src/api/', '^src/index\\.ts$'] },
  { name: 'front ends', path: ['^src/(http|mcp|cli|client|integrations)/'] },
];

const join = (paths) => paths.join('|');
const above = (i) => floors.slice(i + 1).flatMap((f) => f.path);

module.exports = {
  forbidden: [
    ...floors.slice(0, -1).map((floor, i) => ({
      name: `no-import-up-from-${floor.name.replace(' ', '-')}`,
      comment: `The ${floor.name} floor imports only from itself and the floors below it.`,
      severity: 'error',
      from: { path: join(floor.path) },
      to: { path: join(above(i)) },
    })),
    {
      name: 'every-module-on-a-floor',
      comment: 'Every module in src/ belongs to one floor (add a new folder to a floor in .dependency-cruiser.cjs).',
      severity: 'error',
      from: { path: '^src/', pathNot: join(floors.flatMap((f) => f.path)) },
      to: {},
    },
    {
      name: 'no-cycles',
      comment: 'No import cycles in src/.',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    includeOnly: '^src/',
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
