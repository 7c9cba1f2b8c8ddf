// A branch reviewed and partly merged while real clients edit (docs/branches.md), run by
// server/tests/js_interop.rs. The parent is edited by a y-websocket client (pat) and a
// Hocuspocus provider (hugo); a reviewer creates a branch over HTTP; alice (y-websocket) and
// bob (Hocuspocus), each with a token of their own, so two authors, edit the branch: alice
// rewrites a word and adds a sentence, bob writes inside alice's sentence (his change needs
// hers). Merging bob's changes alone is refused with alice's ids; then, while pat and hugo
// keep typing on the parent and bob keeps typing on the branch, alice's changes (ids from GET /changes by author) are merged.
// Every client converges, and a fresh client of the parent reads exactly alice's changes plus
// pat's and hugo's typing, nothing of bob's.
// Usage: node branches.mjs --url ws://HOST:PORT --http http://HOST:PORT --tokens JSON
//        [--parent NAME] [--seed N] [--merge alice|both]
// (`--merge both` merges bob's changes too: the checks must then fail.)
import { args, prng, connect, connectHp, sleep, waitSynced, waitConverged, destroy } from './lib.mjs'

const a = args()
const tokens = JSON.parse(a.tokens)
const rng = prng(Number(a.seed ?? 1))
const parentName = a.parent ?? 'plan'
const branchName = `${parentName}-review`
const api = (name, path) => `${a.http}/api/v1/docs/${encodeURIComponent(name)}${path}`

function check (ok, what) {
  if (!ok) throw new Error(`failed: ${what}`)
  console.log(`ok - ${what}`)
}

async function until (cond, what, ms = 15000) {
  const deadline = Date.now() + ms
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}`)
    await sleep(20)
  }
}

// A request as the reviewer; the status and the JSON body.
async function call (method, name, path, body) {
  if (method === 'POST' && path === '/merge' && body && Array.isArray(body.changes)) {
    // As a reviewer merges: each change named with the last position the change list shows.
    const listed = (await call('GET', name, '/changes')).body.changes
    body = {
      changes: body.changes.map((id) => ({ id, last_seq: listed.find((c) => c.id === id)?.last_seq ?? 0 }))
    }
  }
  const resp = await fetch(api(name, path), {
    method,
    headers: { authorization: `Bearer ${tokens.rev}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body)
  })
  return { status: resp.status, body: await resp.json() }
}

async function ok (method, name, path, body) {
  const r = await call(method, name, path, body)
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`)
  return r.body
}

const committed = async (name) => (await ok('GET', name, '/json')).text ?? ''
const text = (c) => c.doc.getText('text').toString()

// The parent: pat (y-websocket) writes, hugo (Hocuspocus) adds to it.
const pat = connect(a.url, parentName, 'pat', { params: { token: tokens.pat } })
const hugo = connectHp(a.url, parentName, 'hugo', { token: tokens.hugo })
await Promise.all([waitSynced(pat), waitSynced(hugo)])
const BASE = 'The plan for the team. It ends here.'
pat.doc.getText('text').insert(0, 'The plan for the team.')
await until(() => text(hugo) === 'The plan for the team.', 'hugo sees pat\'s sentence')
hugo.doc.getText('text').insert(text(hugo).length, ' It ends here.')
await until(async () => (await committed(parentName)) === BASE, 'the parent committed')

const branch = await ok('POST', parentName, '/branches', { name: branchName })
check(branch.parent === parentName && branch.state === 'open', 'the branch is created over HTTP')

// alice (y-websocket) and bob (Hocuspocus) on the branch.
const alice = connect(a.url, branchName, 'alice', { params: { token: tokens.alice } })
const bob = connectHp(a.url, branchName, 'bob', { token: tokens.bob })
await Promise.all([waitSynced(alice), waitSynced(bob)])
check(text(alice) === BASE && text(bob) === BASE, 'both branch clients start from the parent\'s content')
// alice: "plan" becomes "proposal", and a sentence after the first one, typed in pieces.
const ta = alice.doc.getText('text')
ta.delete(4, 4)
ta.insert(4, 'proposal')
let at = 'The proposal for the team.'.length
for (const piece of [' Alice', ' adds', ' this', ' sentence.']) {
  ta.insert(at, piece)
  at += piece.length
  await sleep(5 + rng.int(20))
}
const ALICE = 'The proposal for the team. Alice adds this sentence. It ends here.'
check(text(alice) === ALICE, 'alice\'s edits')
// bob, once he has them: inside alice's sentence (needs her change), and at the start.
await until(() => text(bob) === ALICE, 'bob sees alice\'s edits')
const tb = bob.doc.getText('text')
tb.insert(ALICE.indexOf(' this'), ' BOB-INSIDE')
tb.insert(0, 'BOB-FIRST ')
await waitConverged([alice, bob])
await until(async () => (await committed(branchName)) === text(alice), 'the branch committed both authors')

// The review: the changes by author.
const review = await ok('GET', branchName, '/changes')
const idsOf = (author) => review.changes.filter((c) => c.author === author).map((c) => c.id)
const aliceIds = idsOf('alice')
const bobIds = idsOf('bob')
check(aliceIds.length > 0 && bobIds.length > 0, `changes by author: alice ${aliceIds}, bob ${bobIds}`)
check(review.changes.every((c) => c.author === 'alice' || c.author === 'bob'), 'no other author on the branch')
check(review.changes.filter((c) => c.author === 'bob').some((c) => c.depends_on.some((d) => aliceIds.includes(d))),
  'bob\'s writing inside alice\'s sentence depends on her change')

// bob's changes alone: refused, naming alice's; the parent unchanged.
const refused = await call('POST', branchName, '/merge', { changes: bobIds })
check(refused.status === 409 && refused.body.type.endsWith('missing-dependencies'), 'merging bob alone is refused (409 missing-dependencies)')
const missing = refused.body.current.missing
check(missing.length > 0 && missing.every((id) => aliceIds.includes(id)), `the refusal names alice's changes: ${missing}`)
check((await committed(parentName)) === BASE, 'the refused merge applied nothing')

// pat and hugo type on the parent without pause, before, during and after the merge: marked
// tokens at the end of the text.
let typing = true
const typed = []
const typist = (c, mark) => (async () => {
  let n = 0
  while (typing) {
    const t = c.doc.getText('text')
    const token = `«${mark}${n++}»`
    t.insert(t.length, token)
    typed.push(token)
    await sleep(3 + rng.int(10))
  }
})()
// bob keeps typing on the branch meanwhile: his changes are not chosen, so none of it may
// reach the parent, and all of it stays on the branch. (With `--merge both` his changes are
// chosen, and a change that grows after its review is refused: he stops typing then.)
const branchTyped = []
const branchTypist = (async () => {
  let n = 0
  while (typing && a.merge !== 'both') {
    const t = bob.doc.getText('text')
    const token = `«b${n++}»`
    t.insert(t.length, token)
    branchTyped.push(token)
    await sleep(5 + rng.int(10))
  }
})()
const typists = [typist(pat, 'p'), typist(hugo, 'h'), branchTypist]
await sleep(100)
const chosen = a.merge === 'both' ? [...aliceIds, ...bobIds] : aliceIds
const typedBefore = typed.length
const merged = await ok('POST', branchName, '/merge', { changes: chosen })
const typedDuring = typed.length
check(JSON.stringify([...merged.merged].sort()) === JSON.stringify([...chosen].sort()), `merged ${merged.merged} at parent position ${merged.parent_seq}`)
await sleep(100)
typing = false
await Promise.all(typists)
check(typedBefore > 0 && typed.length > typedDuring, `the parent's clients typed before (${typedBefore}), during (${typedDuring - typedBefore}) and after (${typed.length - typedDuring}) the merge`)
const again = await ok('POST', branchName, '/merge', { changes: aliceIds })
check(again.merged.length === 0 && again.already_merged.length === aliceIds.length, 'merging again applies nothing')

// Everyone converges; a fresh client of the parent reads alice's changes and the typing.
const fresh = connect(a.url, parentName, 'fresh', { params: { token: tokens.rita } })
await waitSynced(fresh)
await waitConverged([pat, hugo, fresh, alice, bob])
const final = text(fresh)
const problems = []
const untyped = final.replace(/«[ph]\d+»/g, '')
if (untyped !== ALICE) problems.push(`without the typing the parent reads ${JSON.stringify(untyped)}, not alice's ${JSON.stringify(ALICE)}`)
if (final.includes('BOB')) problems.push('bob\'s unmerged text reached the parent')
const found = final.match(/«[ph]\d+»/g) ?? []
if (found.length !== typed.length || !typed.every((t) => found.includes(t))) problems.push(`typed ${typed.length} tokens, the parent holds ${found.length}`)
if (!typed.some((t) => t.startsWith('«p')) || !typed.some((t) => t.startsWith('«h'))) problems.push('both parent clients typed')
if ((await committed(parentName)) !== final) problems.push('the committed parent differs from the clients')
if (text(alice) !== text(bob) || !text(bob).includes('BOB-INSIDE')) problems.push('the branch lost its content')
if (final.includes('«b')) problems.push('bob\'s typing on the branch during the merge reached the parent')
const branchNow = await committed(branchName)
if (!branchTyped.length || !branchTyped.every((t) => branchNow.includes(t))) problems.push(`bob typed ${branchTyped.length} tokens on the branch during the merge; the branch does not hold them all`)
// The merge is the authors' in the parent's history, the reviewer the merger.
const history = await ok('GET', parentName, '/history?limit=100')
const authors = new Set(history.items.flatMap((s) => s.authors.map((x) => x.author)))
if (!authors.has('alice') || authors.has('bob')) problems.push(`the parent's history names ${[...authors]}`)
for (const p of problems) console.log(`not ok - ${p}`)
console.log(JSON.stringify({ ok: problems.length === 0, problems, typed: typed.length, branchTyped: branchTyped.length, merged: merged.merged, missing, final }))
destroy([pat, hugo, alice, bob, fresh])
process.exit(problems.length === 0 ? 0 : 1)
