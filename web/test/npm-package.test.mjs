// The WASM client as an npm package (web/npm, made by web/build.sh): installed by path into a
// scratch project the way an application would, then used from there against a real Quire
// server: it syncs, edits, and the edit is committed (read back through the HTTP API).
// Run: QUIRE_BIN=target/debug/quire node --test web/test/npm-package.test.mjs
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname, resolve } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const pkg = resolve(here, '../npm')
const scratch = mkdtempSync(join(tmpdir(), 'quire-npm-'))
let server

after(() => {
  server?.kill('SIGKILL')
  rmSync(scratch, { recursive: true, force: true })
})

async function startServer () {
  const bin = process.env.QUIRE_BIN
  if (!bin) throw new Error('set QUIRE_BIN to the quire binary (e.g. target/debug/quire)')
  server = spawn(bin, ['serve', '--bind', '127.0.0.1:0', '--database', `sqlite://${join(scratch, 'quire.db')}`], {
    env: { ...process.env, QUIRE_LOG: 'warn' },
    stdio: ['ignore', 'pipe', 'inherit']
  })
  const lines = createInterface({ input: server.stdout })
  return new Promise((resolve, reject) => {
    server.once('exit', (code) => reject(new Error(`quire exited (${code}) before listening`)))
    lines.on('line', (line) => {
      const m = line.match(/^quire listening on (.*)$/)
      if (m) resolve(m[1])
    })
  })
}

test('the package installs by path and works from an application', async () => {
  const manifest = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8'))
  assert.equal(manifest.name, '@quire/client')
  assert.match(manifest.version, /^\d+\.\d+\.\d+/)
  for (const file of manifest.files) assert.ok(existsSync(join(pkg, file)), `${file} is in the package`)

  writeFileSync(join(scratch, 'package.json'), JSON.stringify({
    name: 'scratch-app',
    private: true,
    type: 'module',
    dependencies: { '@quire/client': `file:${pkg}` }
  }))
  // --install-links copies the package as a registry install would, instead of a symlink.
  const install = spawnSync('npm', ['install', '--install-links', '--no-audit', '--no-fund', '--offline'], {
    cwd: scratch, encoding: 'utf8'
  })
  assert.equal(install.status, 0, `npm install failed:\n${install.stdout}\n${install.stderr}`)
  const installed = join(scratch, 'node_modules/@quire/client')
  assert.ok(existsSync(join(installed, 'quire_client.d.ts')), 'the types are installed')
  assert.ok(existsSync(join(installed, 'quire_client_bg.wasm')), 'the module is installed')

  writeFileSync(join(scratch, 'app.mjs'), `
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import init, { QuireClient } from '@quire/client'

const [url, doc] = process.argv.slice(2)
const wasm = fileURLToPath(import.meta.resolve('@quire/client/quire_client_bg.wasm'))
await init({ module_or_path: readFileSync(wasm) })
const client = new QuireClient(url, doc)
await client.whenSynced()
const text = client.getText('content')
text.insert(text.length, 'written through the npm package')
await client.whenSaved()
console.log(JSON.stringify({ text: text.toString(), unsaved: client.unsaved }))
client.destroy()
process.exit(0)
`)
  const addr = await startServer()
  const flags = Number(process.versions.node.split('.')[0]) < 22 ? ['--experimental-websocket'] : []
  const run = spawnSync('node', [...flags, 'app.mjs', `ws://${addr}`, 'npm-app'], {
    cwd: scratch, encoding: 'utf8', timeout: 30_000
  })
  assert.equal(run.status, 0, `the application failed:\n${run.stdout}\n${run.stderr}`)
  const said = JSON.parse(run.stdout.trim().split('\n').pop())
  assert.deepEqual(said, { text: 'written through the npm package', unsaved: 0 })
  const stored = await (await fetch(`http://${addr}/api/v1/docs/npm-app/json`)).json()
  assert.equal(stored.content, 'written through the npm package')
})
