// The web editor compiled into the binary: `quire serve` started in a directory that has no
// web/dist (and no --web-root) serves the very pages web/build.sh wrote, byte for byte.
// Run after web/build.sh and a build of the binary:
//   QUIRE_BIN=target/debug/quire node --test web/test/embedded.test.mjs

import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { readdir, readFile, mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const distDir = resolve(here, '..', 'dist')
const QUIRE_BIN = resolve(process.env.QUIRE_BIN || join(here, '..', '..', 'target', 'debug', 'quire'))

function serve (cwd) {
  // The compiled-in pages, not a directory named in the environment.
  const env = { ...process.env, NO_COLOR: '1' }
  delete env.QUIRE_WEB_ROOT
  return new Promise((resolvePromise, reject) => {
    const child = spawn(QUIRE_BIN, ['serve', '--bind', '127.0.0.1:0', '--database', 'sqlite://quire.db'], {
      cwd,
      env,
      stdio: ['ignore', 'pipe', 'pipe']
    })
    let log = ''
    const timer = setTimeout(() => reject(new Error(`quire did not start:\n${log}`)), 60_000)
    const onData = (chunk) => {
      log += chunk
      const m = /quire listening on 127\.0\.0\.1:(\d+)/.exec(log)
      if (m) {
        clearTimeout(timer)
        resolvePromise({ child, base: `http://127.0.0.1:${m[1]}` })
      }
    }
    child.stdout.setEncoding('utf8')
    child.stderr.setEncoding('utf8')
    child.stdout.on('data', onData)
    child.stderr.on('data', onData)
    child.on('exit', (code) => { clearTimeout(timer); reject(new Error(`quire exited (${code}):\n${log}`)) })
  })
}

test('quire serve from any directory serves the built editor', async () => {
  const cwd = await mkdtemp(join(tmpdir(), 'quire-embedded-'))
  const { child, base } = await serve(cwd)
  try {
    const index = await fetch(`${base}/`)
    assert.equal(index.status, 200)
    assert.match(index.headers.get('content-type'), /^text\/html/)
    assert.deepEqual(Buffer.from(await index.arrayBuffer()), await readFile(join(distDir, 'index.html')))
    // Every other file of web/dist, by its path.
    const files = (await readdir(distDir, { recursive: true, withFileTypes: true }))
      .filter((e) => e.isFile())
      .map((e) => join(e.parentPath ?? e.path, e.name).slice(distDir.length + 1))
    assert.ok(files.length > 1, `web/dist holds ${files}`)
    for (const file of files) {
      const res = await fetch(`${base}/${file}`)
      assert.equal(res.status, 200, file)
      assert.deepEqual(Buffer.from(await res.arrayBuffer()), await readFile(join(distDir, file)), file)
    }
  } finally {
    child.kill('SIGTERM')
    await rm(cwd, { recursive: true, force: true })
  }
})
