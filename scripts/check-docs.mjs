#!/usr/bin/env node
// Docs that stay true: every repository path and every doc section cited by
// the docs and by source comments exists, and every "CRIU x.y.z" names the
// release Lockstep is tested with (package.json "lockstep.criuVersion", the
// one place that names it). `npm run check:docs`; CI runs it. Exit 1 with one
// line per broken citation.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFileSync } from 'node:child_process';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
const criuVersion = pkg.lockstep.criuVersion;

const docs = [
  'README.md',
  'bench/README.md',
  'deploy/README.md',
  // docs/*.md, and the measured decisions in docs/decisions/*.md.
  ...['docs', 'docs/decisions'].flatMap((dir) =>
    fs
      .readdirSync(path.join(root, dir))
      .filter((f) => f.endsWith('.md'))
      .map((f) => `${dir}/${f}`),
  ),
];
const sourceDirs = ['src', 'bench', 'test', 'native', 'scripts', 'demo', 'bin'];
const sourceExt = /\.(ts|mjs|js|c|cc|h|sh)$/;

function walk(dir) {
  const abs = path.join(root, dir);
  if (!fs.existsSync(abs)) return [];
  return fs.readdirSync(abs, { withFileTypes: true }).flatMap((e) => {
    const rel = `${dir}/${e.name}`;
    if (e.isDirectory()) return e.name === 'node_modules' || e.name === 'results' ? [] : walk(rel);
    return sourceExt.test(e.name) ? [rel] : [];
  });
}

/** The comment text of a source file, line by line (code is not checked: an import is checked by the compiler). */
function commentLines(file, text) {
  const hash = /\.(sh|gyp)$/.test(file);
  let inBlock = false;
  return text.split('\n').map((line) => {
    if (hash) {
      const i = line.indexOf('#');
      return i >= 0 && !line.slice(0, i).includes('"') ? line.slice(i + 1) : '';
    }
    let out = '';
    let rest = line;
    if (inBlock) {
      const end = rest.indexOf('*/');
      if (end < 0) return rest.replace(/^\s*\*/, '');
      out += rest.slice(0, end);
      rest = rest.slice(end + 2);
      inBlock = false;
    }
    const line2 = rest.match(/(?:^|[\s;{}(),])\/\/(.*)$/);
    const start = rest.indexOf('/*');
    if (start >= 0 && (!line2 || rest.indexOf('//') > start)) {
      const end = rest.indexOf('*/', start + 2);
      if (end < 0) {
        inBlock = true;
        return out + rest.slice(start + 2);
      }
      return out + rest.slice(start + 2, end);
    }
    return out + (line2 ? line2[1] : '');
  });
}

const problems = [];
const headings = new Map();

/** Headings of a Markdown file: their text without backticks, and their GitHub anchors. */
function headingsOf(doc) {
  if (!headings.has(doc)) {
    const text = fs.readFileSync(path.join(root, doc), 'utf8');
    const list = [...text.matchAll(/^#{1,6}\s+(.+)$/gm)].map((m) => m[1].replace(/`/g, '').trim());
    headings.set(doc, list);
  }
  return headings.get(doc);
}

function anchor(heading) {
  return heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, '')
    .replace(/ /g, '-');
}

const pathPattern =
  /(?<![\w/.@$-])((?:src|test|bench|native|scripts|docs|deploy|demo|sandbox-images|bin|clients|\.ci)\/[\w./-]*[\w/])/g;

/** Outputs of the build, the benchmarks and typedoc: cited, but made by a command (git ignores them). */
function generated(p) {
  try {
    execFileSync('git', ['check-ignore', '-q', '--no-index', p], { cwd: root, stdio: 'ignore' });
    return true;
  } catch {
    // typedoc.json has comments: read its "out" without a JSON parser.
    const out = /"out":\s*"(?:\.\/)?([^"]+)"/.exec(fs.readFileSync(path.join(root, 'typedoc.json'), 'utf8'))?.[1];
    return p === out;
  }
}

function checkPath(where, cited) {
  const p = cited.replace(/[.,:;)]+$/, '');
  // Patterns and placeholders (src/*.ts, sandbox-images/NAME) name no one file.
  if (/[*{}<>]/.test(p) || /\/[A-Z_]+(\/|$)/.test(p)) return;
  // A file (with an extension) or a folder written with its slash; "npm test/demo" is neither.
  if (!/\.\w+$/.test(p.split('/').pop()) && !cited.endsWith('/')) return;
  if (fs.existsSync(path.join(root, p))) return;
  // Compiled names cite their sources: x.js comes from x.ts.
  if (/\.js$/.test(p) && fs.existsSync(path.join(root, p.replace(/\.js$/, '.ts')))) return;
  if (generated(p)) return;
  problems.push(`${where}: cites ${p}, which does not exist`);
}

function checkSection(where, doc, section) {
  // A name without its folder (SECURITY.md, decisions/x.md) is one of docs/ when the root has none.
  const file =
    !fs.existsSync(path.join(root, doc)) && fs.existsSync(path.join(root, 'docs', doc)) ? `docs/${doc}` : doc;
  if (!fs.existsSync(path.join(root, file))) return problems.push(`${where}: cites ${file}, which does not exist`);
  const want = section.toLowerCase();
  if (!headingsOf(file).some((h) => h.toLowerCase().startsWith(want)))
    problems.push(`${where}: cites section "${section}" of ${file}, which has no such heading`);
}

function checkAnchor(where, doc, hash) {
  if (!headingsOf(doc).some((h) => anchor(h) === hash))
    problems.push(`${where}: links to ${doc}#${hash}, which has no such heading`);
}

function checkCriu(where, line) {
  for (const m of line.matchAll(/\bCRIU (\d+\.\d+\.\d+)\b/g)) {
    // History and other distributions' releases are named on purpose.
    if (/Debian 1[23]|trixie|bookworm|measured with|3\.17/.test(line)) continue;
    if (m[1] !== criuVersion)
      problems.push(
        `${where}: names CRIU ${m[1]}, but Lockstep is tested with ${criuVersion} (package.json lockstep.criuVersion)`,
      );
  }
}

/** Checks one text (a doc, or a source file's comments joined so that citations may wrap lines). */
function checkText(file, lines, isDoc) {
  lines.forEach((line, i) => {
    const where = `${file}:${i + 1}`;
    for (const m of line.matchAll(pathPattern)) checkPath(where, m[1]);
    checkCriu(where, line);
    if (isDoc) {
      for (const m of line.matchAll(/\]\(([^)#\s]*)(?:#([^)\s]+))?\)/g)) {
        const [, target, hash] = m;
        if (/^[a-z]+:/.test(target)) continue; // a URL
        const resolved = target ? path.posix.normalize(path.posix.join(path.posix.dirname(file), target)) : file;
        if (!fs.existsSync(path.join(root, resolved)))
          problems.push(`${where}: links to ${resolved}, which does not exist`);
        else if (hash && resolved.endsWith('.md')) checkAnchor(where, resolved, hash);
      }
    }
  });
  // Section citations may wrap: look at the text with line breaks and comment markers folded.
  const joined = lines.map((l) => l.replace(/^\s*(?:\*|\/\/|#)?\s*/, '')).join(' ');
  // SECURITY.md, docs/SECURITY.md, network.md, docs/network.md, and under docs/decisions/ likewise.
  for (const m of joined.matchAll(
    /((?:docs\/)?(?:decisions\/[a-z][\w-]*|[A-Z][A-Za-z-]*|[a-z][\w-]*(?=\.md,\s+(?:section\s+)?"))\.md),\s+(?:section\s+)?"([^"]+)"/g,
  ))
    checkSection(file, m[1], m[2]);
}

for (const doc of docs) {
  if (fs.existsSync(path.join(root, doc)))
    checkText(doc, fs.readFileSync(path.join(root, doc), 'utf8').split('\n'), true);
}
for (const file of [...sourceDirs.flatMap(walk), 'binding.gyp']) {
  const text = fs.readFileSync(path.join(root, file), 'utf8');
  checkText(
    file,
    file === 'binding.gyp'
      ? text.split('\n').map((l) => (l.includes('#') ? l.slice(l.indexOf('#') + 1) : ''))
      : commentLines(file, text),
    false,
  );
}

if (problems.length) {
  process.stderr.write(`check:docs: ${problems.length} broken citation(s)\n${problems.join('\n')}\n`);
  process.exit(1);
}
process.stdout.write(`check:docs: every cited path and section exists; CRIU ${criuVersion} throughout\n`);
