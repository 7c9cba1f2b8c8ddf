//! Writes the committed seed corpora, `fuzz/seeds/<target>/`, from real traffic:
//! - the frames the JavaScript `y-protocols` encoders produced (`server/tests/fixtures/`);
//! - the first edits of the automerge-paper editing trace (`tests/data/editing-trace.json.gz`)
//!   replayed into a yrs `Doc` with a fixed client id, each edit's update as a Sync Update frame,
//!   plus a second client's concurrent edits, sync requests, Step 2 answers and awareness;
//! - every `bus::Envelope` variant, and hand-written valid bodies for every HTTP route that
//!   takes one (`quire_server::fuzzing::ROUTES`).
//!
//! Run from anywhere: `cargo run --manifest-path fuzz/Cargo.toml --example gen_seeds
//! [-- TRACE.json.gz]`. The output is deterministic; it replaces what `seeds/` held.

use std::collections::HashMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use quire_server::bus::{Credential, Envelope};
use quire_server::fuzzing::ROUTES;
use quire_server::protocol;
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::AwarenessUpdate;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::{ClientID, Doc, GetString, ReadTxn, StateVector, Text, Transact};

/// Edits of the trace replayed (each is one keystroke, so one small update).
const TRACE_EDITS: usize = 300;
/// Every this many edits, the frame_decoder corpus gets the edit too (room_update gets all).
const DECODER_EVERY: usize = 5;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let trace_path = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| here.join("../tests/data/editing-trace.json.gz"));
    let out = here.join("seeds");
    let mut seeds = Seeds::new(&out)?;

    let fixtures = js_fixtures(&here.join("../server/tests/fixtures/y-protocols.json"))?;
    for (name, frame) in &fixtures {
        seeds.add("frame_decoder", &format!("js-{name}"), frame);
        seeds.add("room_update", &format!("js-{name}"), frame);
        if let Ok([protocol::Message::Awareness { update, .. }]) =
            protocol::decode_frame(frame).as_deref()
        {
            seeds.add(
                "awareness_decoder",
                &format!("js-{name}"),
                &update.encode_v1(),
            );
        }
    }

    let edits = trace_edits(&trace_path)?;
    trace_seeds(&mut seeds, &edits);
    awareness_seeds(&mut seeds, &edits);
    bus_seeds(&mut seeds, &fixtures);
    http_seeds(&mut seeds, &edits);
    let step2 = fixtures
        .iter()
        .find(|(n, _)| n == "sync-step2")
        .map(|(_, f)| f.clone())
        .unwrap_or_else(|| Bytes::from_static(&[0, 1, 2, 0, 0]));
    hocuspocus_seeds(&mut seeds, &step2);
    seeds.finish()
}

struct Seeds {
    out: PathBuf,
    files: HashMap<String, Vec<(String, Vec<u8>)>>,
}

impl Seeds {
    fn new(out: &Path) -> Result<Seeds> {
        Ok(Seeds {
            out: out.to_path_buf(),
            files: HashMap::new(),
        })
    }

    fn add(&mut self, target: &str, name: &str, bytes: &[u8]) {
        self.files
            .entry(target.to_owned())
            .or_default()
            .push((name.to_owned(), bytes.to_vec()));
    }

    fn finish(self) -> Result<()> {
        let mut total = 0;
        let mut targets: Vec<_> = self.files.into_iter().collect();
        targets.sort_by(|a, b| a.0.cmp(&b.0));
        for (target, files) in targets {
            let dir = self.out.join(&target);
            if dir.exists() {
                fs::remove_dir_all(&dir)?;
            }
            fs::create_dir_all(&dir)?;
            let mut bytes = 0;
            for (name, data) in &files {
                fs::write(dir.join(name), data)?;
                bytes += data.len();
            }
            println!("{target}: {} seeds, {bytes} bytes", files.len());
            total += bytes;
        }
        println!("total: {total} bytes in {}", self.out.display());
        Ok(())
    }
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&s[i..i + 2], 16)?))
        .collect()
}

/// (name, frame) for every fixture the JavaScript encoders wrote.
fn js_fixtures(path: &Path) -> Result<Vec<(String, Bytes)>> {
    let json: serde_json::Value = serde_json::from_str(&fs::read_to_string(path)?)?;
    let mut out = Vec::new();
    for f in json["fixtures"].as_array().ok_or("no fixtures array")? {
        let name = f["name"].as_str().ok_or("fixture without a name")?;
        let bytes = unhex(f["bytes"].as_str().ok_or("fixture without bytes")?)?;
        out.push((name.to_owned(), Bytes::from(bytes)));
    }
    Ok(out)
}

/// The first `TRACE_EDITS` edits: (position, characters deleted, text inserted).
fn trace_edits(path: &Path) -> Result<Vec<(u32, u32, String)>> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(fs::File::open(path).map_err(|e| {
        format!(
            "{}: {e} (pass the editing trace's path as the argument)",
            path.display()
        )
    })?)
    .read_to_string(&mut text)?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    let edits = json["edits"].as_array().ok_or("no edits array")?;
    let mut out = Vec::with_capacity(TRACE_EDITS);
    for e in edits.iter().take(TRACE_EDITS) {
        let pos = e[0].as_u64().ok_or("edit without a position")? as u32;
        let del = e[1].as_u64().ok_or("edit without a delete count")? as u32;
        let ins = e[2].as_str().ok_or("edit without a text")?.to_owned();
        out.push((pos, del, ins));
    }
    Ok(out)
}

/// Applies one edit in its own transaction; returns that transaction's update (Yjs v1).
fn edit(doc: &Doc, (pos, del, ins): &(u32, u32, String)) -> Vec<u8> {
    let text = doc.get_or_insert_text("text");
    let mut txn = doc.transact_mut();
    if *del > 0 {
        text.remove_range(&mut txn, *pos, *del);
    }
    if !ins.is_empty() {
        text.insert(&mut txn, *pos, ins);
    }
    txn.encode_update_v1()
}

fn concat(frames: &[Bytes]) -> Bytes {
    let mut buf = BytesMut::new();
    for f in frames {
        buf.extend_from_slice(f);
    }
    buf.freeze()
}

fn trace_seeds(seeds: &mut Seeds, edits: &[(u32, u32, String)]) {
    // Client 1 types the trace; each keystroke is one Sync Update frame, as y-websocket sends.
    let doc = Doc::with_client_id(1);
    let mut frames = Vec::with_capacity(edits.len());
    for (i, e) in edits.iter().enumerate() {
        let frame = protocol::encode_update(&edit(&doc, e));
        seeds.add("room_update", &format!("trace-{i:04}"), &frame);
        if i % DECODER_EVERY == 0 {
            seeds.add("frame_decoder", &format!("trace-{i:04}"), &frame);
        }
        frames.push(frame);
    }
    // A burst: twenty keystrokes in one frame, then a durable ack request (what a client
    // waiting for durability sends).
    let mut burst: Vec<Bytes> = frames[100..120].to_vec();
    burst.push(protocol::encode_durable_ack(7));
    let burst = concat(&burst);
    seeds.add("room_update", "trace-burst-ack", &burst);
    seeds.add("frame_decoder", "trace-burst-ack", &burst);

    // What a client sends on connecting with the whole document: Step 1 and Step 2.
    let sv = doc.transact().state_vector();
    let state = doc.transact().encode_diff_v1(&StateVector::default());
    let hello = concat(&[protocol::encode_step1(&sv), protocol::encode_step2(&state)]);
    seeds.add("room_update", "trace-step1-step2", &hello);
    seeds.add("frame_decoder", "trace-step1-step2", &hello);
    seeds.add(
        "room_update",
        "step1-empty",
        &protocol::encode_step1(&StateVector::default()),
    );

    // Client 2 starts from the document after 150 edits and edits concurrently: its updates
    // depend on client 1's, and delete characters client 1 typed.
    let doc1 = Doc::with_client_id(1);
    for e in &edits[..150] {
        edit(&doc1, e);
    }
    let doc2 = Doc::with_client_id(2);
    let base = doc1.transact().encode_diff_v1(&StateVector::default());
    {
        let update = yrs::Update::decode_v1(&base).unwrap_or_else(|e| panic!("own update: {e}"));
        doc2.transact_mut()
            .apply_update(update)
            .unwrap_or_else(|e| panic!("own update: {e}"));
    }
    let len = doc2
        .get_or_insert_text("text")
        .get_string(&doc2.transact())
        .len() as u32;
    let concurrent = [
        (0, 0, "% ".to_owned()),
        (len / 2, 3, String::new()),
        (len / 3, 1, "X".to_owned()),
        (len - 10, 1, "\n\\section{Introduction}\n".to_owned()),
    ];
    for (i, e) in concurrent.iter().enumerate() {
        let frame = protocol::encode_update(&edit(&doc2, e));
        seeds.add("room_update", &format!("client2-{i}"), &frame);
        seeds.add("frame_decoder", &format!("client2-{i}"), &frame);
    }
    // Client 2's whole state as the Step 2 it would answer the server's Step 1 with.
    let state2 = doc2.transact().encode_diff_v1(&StateVector::default());
    seeds.add(
        "room_update",
        "client2-step2",
        &protocol::encode_step2(&state2),
    );
    // A durable ack request alone, and a query for awareness.
    seeds.add(
        "frame_decoder",
        "durable-ack",
        &protocol::encode_durable_ack(300),
    );
    seeds.add("frame_decoder", "query-awareness", &[3]);
}

fn awareness(entries: &[(u64, u32, &str)]) -> AwarenessUpdate {
    AwarenessUpdate {
        clients: entries
            .iter()
            .map(|(id, clock, json)| {
                (
                    ClientID::new(*id),
                    AwarenessUpdateEntry {
                        clock: *clock,
                        json: Arc::from(*json),
                    },
                )
            })
            .collect(),
    }
}

/// An awareness update as the awareness_decoder target reads it: a varUint8Array.
fn chunk(update: &AwarenessUpdate) -> Vec<u8> {
    let payload = update.encode_v1();
    let mut out = Vec::with_capacity(payload.len() + 4);
    let mut n = payload.len() as u64;
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(&payload);
    out
}

fn awareness_seeds(seeds: &mut Seeds, edits: &[(u32, u32, String)]) {
    // The cursor of the trace's typist, as y-codemirror/y-prosemirror publish it, every
    // 30 keystrokes; then the client leaves (a null state with the next clock).
    let user = r##""user":{"name":"Martin","color":"#30bced"}"##;
    let mut sequence = Vec::new();
    for (i, (pos, _, _)) in edits.iter().enumerate().step_by(30) {
        let clock = (i / 30) as u32 + 1;
        let json = format!(r#"{{{user},"cursor":{{"anchor":{pos},"head":{pos}}}}}"#);
        let update = awareness(&[(1, clock, &json)]);
        seeds.add(
            "awareness_decoder",
            &format!("cursor-{i:04}"),
            &chunk(&update),
        );
        if i % 60 == 0 {
            let frame = protocol::encode_awareness(&update);
            seeds.add("frame_decoder", &format!("awareness-cursor-{i:04}"), &frame);
            seeds.add("room_update", &format!("awareness-cursor-{i:04}"), &frame);
        }
        sequence.extend_from_slice(&chunk(&update));
    }
    sequence.extend_from_slice(&chunk(&awareness(&[(1, 99, "null")])));
    seeds.add("awareness_decoder", "cursor-sequence-leave", &sequence);
    // Three clients in one update, one of them removed; then the removed one comes back.
    let three = awareness(&[
        (1, 4, r#"{"user":{"name":"Ann"}}"#),
        (2, 1, r#"{"user":{"name":"Bob"},"cursor":null}"#),
        (3, 7, "null"),
    ]);
    let back = awareness(&[(3, 8, r#"{"user":{"name":"Cy"}}"#), (2, 1, "null")]);
    seeds.add("awareness_decoder", "three-clients", &chunk(&three));
    seeds.add(
        "awareness_decoder",
        "three-clients-then-changes",
        &[chunk(&three), chunk(&back)].concat(),
    );
    seeds.add(
        "awareness_decoder",
        "clock-max",
        &chunk(&awareness(&[(9, u32::MAX, "{}")])),
    );
    seeds.add("awareness_decoder", "empty", &chunk(&awareness(&[])));
    let frame = protocol::encode_awareness(&three);
    seeds.add("frame_decoder", "awareness-three", &frame);
    seeds.add(
        "room_update",
        "awareness-three-query",
        &concat(&[frame, Bytes::from_static(&[3])]),
    );
}

fn bus_seeds(seeds: &mut Seeds, fixtures: &[(String, Bytes)]) {
    let from: std::sync::Arc<str> = "node-0a1b2c3d".into();
    let frame = fixtures
        .iter()
        .find(|(n, _)| n == "batched")
        .map(|(_, f)| f.clone())
        .unwrap_or_else(|| Bytes::from_static(&[3]));
    let step2 = fixtures
        .iter()
        .find(|(n, _)| n == "sync-step2")
        .map(|(_, f)| f.clone())
        .unwrap_or_else(|| Bytes::from_static(&[0, 1, 2, 0, 0]));
    let envelopes = [
        (
            "open",
            Envelope::Open { from: from.clone(), conn: 42, doc: "notes/meeting".into(), auth: Credential { user: Some("ann".into()), can_write: true, expires_at: Some(1_767_225_600), seen_change: 0, hocuspocus: false, profile: None } },
        ),
        (
            "open-anonymous-readonly",
            Envelope::Open { from: from.clone(), conn: u64::MAX, doc: "d".into(), auth: Credential { user: None, can_write: false, expires_at: None, seen_change: 0, hocuspocus: true, profile: None } },
        ),
        (
            "frame",
            Envelope::Frame {
                from: from.clone(),
                conn: 42,
                seq: 1,
                data: frame,
            },
        ),
        (
            "alive",
            Envelope::Alive {
                from: from.clone(),
                conn: 42,
                sent: 1,
            },
        ),
        ("close", Envelope::Close { from, conn: 42 }),
        (
            "out",
            Envelope::Out {
                conn: 42,
                seq: 1,
                data: step2,
            },
        ),
        (
            "kill",
            Envelope::Kill {
                conn: 42,
                code: 1007,
                reason: "invalid update".into(),
            },
        ),
    ];
    for (name, envelope) in envelopes {
        seeds.add("bus_envelope", name, &envelope.encode());
    }
}

/// Frames a 4.x and a 3.x provider send (and some a server sends), for `hocuspocus_frame`.
fn hocuspocus_seeds(seeds: &mut Seeds, step2: &Bytes) {
    use quire_server::protocol::hocuspocus as hp;
    let addr = "notes/meeting";
    let session = "notes/meeting\0k3j2h1";
    let frames: [(&str, Bytes); 11] = [
        ("auth-v4", hp::encode_auth_with_version(session, "eyJ.token.sig", "4.8.0")),
        ("auth-v3", hp::encode_auth(addr, "")),
        ("step1", hp::wrap(addr, &protocol::encode_step1(&StateVector::default()))),
        ("step2", hp::wrap(addr, step2)),
        ("update", hp::wrap(session, &protocol::encode_update(&[0, 0]))),
        ("awareness", hp::wrap(addr, &[1, 11, 1, 7, 1, 7, b'{', b'"', b'a', b'"', b':', b'1', b'}'])),
        ("stateless", hp::encode_stateless(addr, r#"{"hello":1}"#)),
        ("close", hp::wrap(addr, &[7])),
        ("sync-status", hp::encode_sync_status(addr, true)),
        ("ping", Bytes::from_static(&[9])),
        ("authenticated", hp::encode_authenticated(addr, "read-write")),
    ];
    for (name, frame) in frames {
        seeds.add("hocuspocus_frame", name, &frame);
    }
}

fn http_seeds(seeds: &mut Seeds, edits: &[(u32, u32, String)]) {
    // The selector byte: route + ROUTES.len() * variant, where variant = credential (0 admin,
    // 1 writer token, 2 viewer token) + 3 * idempotency key + 6 * If-Match mode (0 current,
    // 1 none, 2 stale): see `HttpHarness::request`.
    let n = ROUTES.len() as u8;
    let sel = |route: u8, credential: u8, idem: u8, if_match: u8| {
        route + n * (credential + 3 * idem + 6 * if_match)
    };
    let json: [(&str, u8, &str); 18] = [
        (
            "create-doc",
            sel(0, 0, 0, 0),
            r#"{"name":"notes/meeting","title":"Meeting notes"}"#,
        ),
        (
            "create-doc-untitled-writer",
            sel(0, 1, 0, 0),
            r#"{"name":"fuzz-w"}"#,
        ),
        (
            "create-doc-idempotent",
            sel(0, 0, 1, 0),
            r#"{"name":"idem","title":"once"}"#,
        ),
        (
            "create-doc-viewer",
            sel(0, 2, 0, 0),
            r#"{"name":"fuzz-v","title":""}"#,
        ),
        ("patch-doc-title", sel(1, 0, 0, 0), r#"{"title":"Renamed"}"#),
        (
            "patch-doc-owner",
            sel(1, 0, 0, 0),
            r#"{"owner":"fuzz-user"}"#,
        ),
        (
            "patch-doc-writer",
            sel(1, 1, 1, 0),
            r#"{"title":"by the writer","owner":null}"#,
        ),
        ("patch-doc-no-if-match", sel(1, 0, 0, 1), r#"{"title":"x"}"#),
        ("patch-doc-stale", sel(1, 0, 0, 2), r#"{"title":"x"}"#),
        ("put-access-viewer", sel(2, 0, 0, 0), r#"{"role":"viewer"}"#),
        ("put-access-editor", sel(2, 0, 0, 0), r#"{"role":"editor"}"#),
        (
            "put-access-owner-writer",
            sel(2, 1, 0, 0),
            r#"{"role":"owner"}"#,
        ),
        (
            "patch-user",
            sel(3, 0, 0, 0),
            r##"{"display_name":"Ann","color":"#30bced","avatar_url":"https://example.org/ann.png"}"##,
        ),
        (
            "patch-user-clear",
            sel(3, 0, 1, 0),
            r#"{"display_name":null}"#,
        ),
        (
            "issue-token",
            sel(4, 0, 0, 0),
            r#"{"user":"ann","doc":"notes/*","permission":"write","ttl_secs":600}"#,
        ),
        (
            "issue-token-read",
            sel(4, 0, 1, 0),
            r#"{"user":"bob","doc":"notes/meeting","permission":"read"}"#,
        ),
        (
            "revoke-token",
            sel(5, 0, 0, 0),
            r#"{"token_id":"6f1c4b8e-0000-4000-8000-000000000000"}"#,
        ),
        ("revoke-user", sel(5, 0, 0, 0), r#"{"user":"bob"}"#),
    ];
    for (name, selector, body) in json {
        let mut input = vec![selector];
        input.extend_from_slice(body.as_bytes());
        seeds.add("http_json", name, &input);
    }
    // POST /docs/{id}/update takes a Yjs update: the trace's first keystrokes, as one update.
    let doc = Doc::with_client_id(5);
    for e in &edits[..40] {
        edit(&doc, e);
    }
    let update = doc.transact().encode_diff_v1(&StateVector::default());
    let mut input = vec![sel(6, 0, 0, 0)];
    input.extend_from_slice(&update);
    seeds.add("http_json", "post-update", &input);
    let mut input = vec![sel(6, 1, 1, 0)];
    input.extend_from_slice(&edit(&doc, &(0, 0, "x".to_owned())));
    seeds.add("http_json", "post-update-writer-idempotent", &input);
}
