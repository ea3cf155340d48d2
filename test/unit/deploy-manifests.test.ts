/**
 * The Kubernetes manifests under deploy/kubernetes, checked offline (no
 * cluster, no root): every YAML document parses, is a kind this test knows,
 * and passes the Kubernetes API schema of its kind (kubernetes-models'
 * validators, generated from the API's OpenAPI document: types, required
 * fields, enums, formats); every object and pod template carries the
 * labels the selectors rely on; the selectors select what they should; the
 * settings in them are ones Lockstep reads, and the server's configuration
 * file is accepted by the server's own parser.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { ConfigMap, Namespace, Service, ServiceAccount } from 'kubernetes-models/v1';
import { DaemonSet } from 'kubernetes-models/apps/v1';
import { Role, RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1';
import { PriorityClass } from 'kubernetes-models/scheduling.k8s.io/v1';
import { ENVIRONMENT } from '../../src/config.js';
import { parseConfigFile } from '../../src/http/config.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const dir = path.join(root, 'deploy', 'kubernetes');

/** The kinds the design uses, each with its schema-validating model. */
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/Namespace': Namespace,
  'v1/ServiceAccount': ServiceAccount,
  'v1/ConfigMap': ConfigMap,
  'v1/Service': Service,
  'apps/v1/DaemonSet': DaemonSet,
  'rbac.authorization.k8s.io/v1/Role': Role,
  'rbac.authorization.k8s.io/v1/RoleBinding': RoleBinding,
  'networking.k8s.io/v1/NetworkPolicy': NetworkPolicy,
  'scheduling.k8s.io/v1/PriorityClass': PriorityClass,
};

const REQUIRED_LABELS = ['app.kubernetes.io/name', 'app.kubernetes.io/part-of', 'app.kubernetes.io/component'];

interface Obj {
  apiVersion?: string;
  kind?: string;
  metadata?: { name?: string; namespace?: string; labels?: Record<string, string> };
  spec?: Record<string, unknown>;
  data?: Record<string, string>;
  [k: string]: unknown;
}

/** Every document of every YAML file, with where it came from. */
function load(): { where: string; obj: Obj }[] {
  const out: { where: string; obj: Obj }[] = [];
  for (const file of fs
    .readdirSync(dir)
    .filter((f) => /\.ya?ml$/.test(f))
    .sort()) {
    const docs = parseAllDocuments(fs.readFileSync(path.join(dir, file), 'utf8'));
    docs.forEach((doc, i) => {
      if (doc.errors.length) throw new Error(`${file} document ${i + 1}: ${doc.errors[0]!.message}`);
      const obj = doc.toJS() as Obj | null;
      if (obj !== null) out.push({ where: `${file}#${i + 1} ${obj.kind}/${obj.metadata?.name}`, obj });
    });
  }
  return out;
}

/** Problems with one object: unknown kind, schema errors, missing labels. */
function problems(obj: Obj): string[] {
  const out: string[] = [];
  const key = `${obj.apiVersion}/${obj.kind}`;
  const Model = MODELS[key];
  if (!Model) return [`unknown kind ${key}`];
  try {
    new Model(obj as never).validate();
  } catch (e) {
    out.push(`schema: ${(e as Error).message}`);
  }
  for (const l of REQUIRED_LABELS) if (!obj.metadata?.labels?.[l]) out.push(`metadata.labels lacks ${l}`);
  const template = (obj.spec?.template as Obj | undefined)?.metadata;
  if (obj.spec?.template)
    for (const l of REQUIRED_LABELS) if (!template?.labels?.[l]) out.push(`spec.template.metadata.labels lacks ${l}`);
  return out;
}

const all = load();
const find = (kind: string, name: string) => all.find((d) => d.obj.kind === kind && d.obj.metadata?.name === name)?.obj;
const matches = (selector: Record<string, string> | undefined, labels: Record<string, string> | undefined) =>
  selector !== undefined && Object.entries(selector).every(([k, v]) => labels?.[k] === v);

test('every document under deploy/kubernetes is a known kind that passes its Kubernetes API schema and carries the labels', (t) => {
  t.true(all.length >= 9, `only ${all.length} documents found`);
  for (const { where, obj } of all) t.deepEqual(problems(obj), [], where);
});

test('the check itself fails on an unknown kind, a schema error and a missing label', (t) => {
  const ds = structuredClone(find('DaemonSet', 'lockstep-node')!);
  t.deepEqual(problems({ ...ds, kind: 'Deamonset' }), ['unknown kind apps/v1/Deamonset']);
  const noSelector = structuredClone(ds);
  delete noSelector.spec!.selector;
  t.true(problems(noSelector).some((p) => /schema: .*selector/.test(p)));
  const badPort = structuredClone(find('Service', 'lockstep-node')!);
  (badPort.spec!.ports as { port: unknown }[])[0]!.port = 'http';
  t.true(problems(badPort).some((p) => /schema: .*port must be integer/.test(p)));
  const unlabelled = structuredClone(ds);
  delete unlabelled.metadata!.labels!['app.kubernetes.io/part-of'];
  t.deepEqual(problems(unlabelled), ['metadata.labels lacks app.kubernetes.io/part-of']);
});

test('the Service and the NetworkPolicy select the node agents; namespaced objects are in the namespace', (t) => {
  const ds = find('DaemonSet', 'lockstep-node')!;
  const podLabels = (ds.spec!.template as Obj).metadata!.labels;
  t.true(matches((ds.spec!.selector as { matchLabels: Record<string, string> }).matchLabels, podLabels));
  t.true(matches(find('Service', 'lockstep-node')!.spec!.selector as Record<string, string>, podLabels));
  const np = find('NetworkPolicy', 'lockstep-node')!;
  t.true(matches((np.spec!.podSelector as { matchLabels: Record<string, string> }).matchLabels, podLabels));
  const ns = find('Namespace', 'lockstep-system');
  t.truthy(ns);
  for (const { where, obj } of all)
    if (!['Namespace', 'PriorityClass'].includes(obj.kind!)) t.is(obj.metadata?.namespace, 'lockstep-system', where);
  // Every ConfigMap, Secret, ServiceAccount and PriorityClass the pods name is shipped or documented.
  const podSpec = (ds.spec!.template as Obj).spec as Record<string, unknown>;
  t.truthy(find('ServiceAccount', podSpec.serviceAccountName as string));
  t.truthy(find('PriorityClass', podSpec.priorityClassName as string));
  // The agent holds no cluster credentials: no token mounted, no Role bound to its account.
  t.is(podSpec.automountServiceAccountToken, false);
  t.is(find('ServiceAccount', 'lockstep-node')!.automountServiceAccountToken, false);
  for (const { where, obj } of all)
    if (obj.kind === 'RoleBinding' || obj.kind === 'ClusterRoleBinding')
      t.false(
        (obj.subjects as { name: string }[]).some((s) => s.name === podSpec.serviceAccountName),
        `${where} binds the agent's ServiceAccount`,
      );
  // The server refuses a metrics token file others can read.
  const token = (podSpec.volumes as { name: string; secret?: { defaultMode?: number } }[]).find(
    (v) => v.name === 'metrics-token',
  );
  t.is(token?.secret?.defaultMode, 0o600);
});

test("the settings in the manifests are ones Lockstep reads, and config.json passes the server's parser", (t) => {
  const cm = find('ConfigMap', 'lockstep-node')!;
  const { ['config.json']: configJson, ...vars } = cm.data!;
  t.notThrows(() => parseConfigFile(configJson!, 'deploy/kubernetes/configmap.yaml'));
  const ds = find('DaemonSet', 'lockstep-node')!;
  const containers = ((ds.spec!.template as Obj).spec as { containers: { env?: { name: string }[] }[] }).containers;
  const names = [...Object.keys(vars), ...containers.flatMap((c) => (c.env ?? []).map((e) => e.name))];
  t.true(names.length > 3);
  for (const n of names) t.true(n in ENVIRONMENT, `${n} is not a variable Lockstep reads (src/config.ts)`);
});
