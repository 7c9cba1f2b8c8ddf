#!/usr/bin/env node
// Builds web/dist from web/src, web/static and web/pkg (the wasm-bindgen output):
//   dist/index.html, dist/stock.html, dist/tiptap.html, dist/style.css
//   dist/assets/editor.js, dist/assets/stock.js, dist/assets/tiptap.js,
//   dist/assets/quire_client_bg.wasm
// Run it from anywhere: `node web/bundle.mjs`. Re-running replaces dist/ completely.

import { build } from 'esbuild'
import { existsSync } from 'node:fs'
import { copyFile, mkdir, readFile, readdir, rm, stat } from 'node:fs/promises'
import { dirname, join, relative } from 'node:path'
import { fileURLToPath } from 'node:url'
import { gzipSync } from 'node:zlib'

const root = dirname(fileURLToPath(import.meta.url))
const pkg = join(root, 'pkg')
const dist = join(root, 'dist')
const assets = join(dist, 'assets')
const wasmName = 'quire_client_bg.wasm'

function fail (message) {
  console.error(`bundle: ${message}`)
  process.exit(1)
}

for (const f of ['quire_client.js', wasmName]) {
  if (!existsSync(join(pkg, f))) {
    fail(`${relative(process.cwd(), join(pkg, f))} is missing: build the WASM client first (web/build.sh)`)
  }
}
if (!existsSync(join(root, 'node_modules', 'esbuild'))) {
  fail('node_modules is missing: run `npm ci` in web/ first')
}

await rm(dist, { recursive: true, force: true })
await mkdir(assets, { recursive: true })

try {
  await build({
    absWorkingDir: root,
    entryPoints: {
      editor: join(root, 'src', 'editor.js'),
      stock: join(root, 'src', 'stock.js'),
      tiptap: join(root, 'src', 'tiptap.js')
    },
    outdir: assets,
    bundle: true,
    format: 'esm',
    minify: true,
    target: 'es2020',
    sourcemap: false,
    legalComments: 'none',
    logLevel: 'warning'
  })
} catch (e) {
  // esbuild already printed the errors.
  fail('esbuild failed')
}

const staticDir = join(root, 'static')
for (const entry of await readdir(staticDir, { withFileTypes: true })) {
  if (entry.isFile()) await copyFile(join(staticDir, entry.name), join(dist, entry.name))
}
await copyFile(join(pkg, wasmName), join(assets, wasmName))

async function listFiles (dir) {
  const out = []
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name)
    if (entry.isDirectory()) out.push(...await listFiles(p))
    else out.push(p)
  }
  return out.sort()
}

const kib = (n) => `${(n / 1024).toFixed(1)} KiB`
let total = 0
let totalGz = 0
console.log('file                                 raw        gzip')
for (const file of await listFiles(dist)) {
  const size = (await stat(file)).size
  const gz = gzipSync(await readFile(file), { level: 9 }).length
  total += size
  totalGz += gz
  console.log(`${relative(dist, file).padEnd(34)} ${kib(size).padStart(10)} ${kib(gz).padStart(10)}`)
}
console.log(`${'total'.padEnd(34)} ${kib(total).padStart(10)} ${kib(totalGz).padStart(10)}`)
