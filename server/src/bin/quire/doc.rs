//! `quire doc export` and `quire doc import`: a document's content out to a file and in from
//! one.
//!
//! - **Export** reads the committed state from the store: the snapshot and the log after it,
//!   read in one transaction, replayed. It needs no server and never disturbs a running one
//!   (SQLite readers run beside the writer; PostgreSQL is shared anyway).
//! - **Import** computes what the file adds to the document's current state (so importing
//!   the same update twice adds nothing the second time), then writes it through the
//!   document's room when a server answers at the target address (`POST
//!   /api/v1/docs/{name}/update`: applied, logged and broadcast like any client's edit), or
//!   straight to the store when none does: one log row appended at the next position, with
//!   the position check every writer makes, so a server that starts meanwhile can neither
//!   lose it nor be overwritten by it (the append fails, and the import reads again and
//!   retries). Never both: the store is written only when no server answers at the address.
//!   A server elsewhere (another node, another address) that holds the document open finds
//!   the row when it next appends (a position conflict makes its room reload), so its clients
//!   see the import with the next edit, not at once.
//! - Both refuse a store whose schema is not exactly this binary's (`quire migrate` first):
//!   they never create or migrate one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use quire_server::storage::{LogEntry, StorageError};
use yrs::updates::decoder::Decode;
use yrs::{Doc, GetString, ReadTxn, StateVector, Text, Transact, Update};

use crate::history::{Api, Target};

#[derive(Subcommand)]
pub enum DocCommand {
    /// Write a document's content to a file (or standard output)
    Export {
        name: String,
        #[arg(long, value_enum, default_value_t = ExportFormat::Update)]
        format: ExportFormat,
        /// The file to write [default: standard output]
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The text root `--format text` reads
        #[arg(long, default_value = "content")]
        root: String,
        #[command(flatten)]
        args: crate::Args,
    },
    /// Add a file's content to a document: a Yjs update (v1 or v2) or plain text
    Import {
        name: String,
        file: PathBuf,
        #[arg(long, value_enum, default_value_t = ImportFormat::Auto)]
        format: ImportFormat,
        /// The text root plain text is appended to
        #[arg(long, default_value = "content")]
        root: String,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        args: crate::Args,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// The whole state as one Yjs update, v1 encoding (what y-websocket clients exchange)
    Update,
    /// The same in Yjs's v2 encoding (smaller)
    UpdateV2,
    /// Every root type as JSON
    Json,
    /// The text of one text root (`--root`)
    Text,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportFormat {
    /// A Yjs update, v1 or v2 (the one that decodes to content), else UTF-8 text
    Auto,
    Update,
    UpdateV2,
    Text,
}

/// A spinner with the bytes moved and their rate while an operation runs, on a terminal;
/// nothing while it runs elsewhere. Either way its outcome is one plain line on stdout.
struct Progress {
    bar: ProgressBar,
    started: Instant,
}

impl Progress {
    fn start(what: String) -> Progress {
        // Hidden by itself when stderr is not a terminal.
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} {bytes} ({binary_bytes_per_sec})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(what);
        bar.enable_steady_tick(Duration::from_millis(100));
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    fn bytes(&self, n: u64) {
        self.bar.inc(n);
    }

    fn done(self, line: &str) {
        self.bar.finish_and_clear();
        let secs = self.started.elapsed().as_secs_f64();
        let bytes = self.bar.position();
        println!(
            "{line} ({}, {secs:.2} s, {}/s)",
            indicatif::BinaryBytes(bytes),
            indicatif::BinaryBytes((bytes as f64 / secs.max(1e-3)) as u64)
        );
    }
}

pub async fn run(command: DocCommand) -> anyhow::Result<()> {
    match command {
        DocCommand::Export {
            name,
            format,
            output,
            root,
            args,
        } => {
            let config = args.resolve()?;
            export(&config, &name, format, output.as_deref(), &root).await
        }
        DocCommand::Import {
            name,
            file,
            format,
            root,
            target,
            args,
        } => {
            let config = args.resolve()?;
            let api = Api::new(target, &config);
            import(&api, &config, &name, &file, format, &root).await
        }
    }
}

/// The document's committed state, read from the store; an error for a document that does
/// not exist or is deleted.
async fn stored_doc(
    stores: &quire_server::Stores,
    name: &str,
) -> anyhow::Result<(quire_server::storage::StoredDoc, Doc)> {
    match stores.api.get_doc_by_name(name).await? {
        None => bail!("no document named {name:?}"),
        Some(meta) if meta.deleted_at.is_some() => bail!("document {name:?} is deleted"),
        Some(_) => {}
    }
    let stored = stores.docs.load(name).await?;
    if stored.deleted {
        bail!("document {name:?} is deleted");
    }
    let doc = quire_server::room::replay_stored(&stored)
        .map_err(|e| anyhow::anyhow!("document {name:?} does not replay: {e}"))?;
    Ok((stored, doc))
}

async fn export(
    config: &quire_server::config::Config,
    name: &str,
    format: ExportFormat,
    output: Option<&Path>,
    root: &str,
) -> anyhow::Result<()> {
    let progress = Progress::start(format!("exporting {name}"));
    let stores = crate::ops::open_current_store(config).await?;
    let (_, doc) = stored_doc(&stores, name).await?;
    let bytes = {
        let txn = doc.transact();
        match format {
            ExportFormat::Update => txn.encode_state_as_update_v1(&StateVector::default()),
            ExportFormat::UpdateV2 => quire_server::protocol::state::encode_state_v2(&txn),
            ExportFormat::Json => {
                let mut json = serde_json::to_vec_pretty(&quire_server::room::doc_json(&doc))?;
                json.push(b'\n');
                json
            }
            ExportFormat::Text => match txn.get_text(root) {
                Some(text) => text.get_string(&txn).into_bytes(),
                None => bail!("document {name:?} has no text root {root:?} (see --root)"),
            },
        }
    };
    progress.bytes(bytes.len() as u64);
    match output {
        Some(path) => {
            std::fs::write(path, &bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
            progress.done(&format!("exported {name} to {}", path.display()));
        }
        None => {
            progress.bar.finish_and_clear();
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)?;
            out.flush()?;
        }
    }
    Ok(())
}

/// What a file holds, decoded.
enum Content {
    Update(Update),
    Text(String),
}

fn decode_file(bytes: &[u8], format: ImportFormat) -> anyhow::Result<Content> {
    let v1 = || -> anyhow::Result<Update> {
        quire_server::counts::check_update(bytes)
            .map_err(|e| anyhow::anyhow!("not a Yjs v1 update: {e}"))?;
        Update::decode_v1(bytes).map_err(|e| anyhow::anyhow!("not a Yjs v1 update: {e}"))
    };
    // yrs has no bound check for v2 input as it has for v1 (`check_update`); a file that
    // makes it panic is refused like one that does not decode.
    let v2 = || -> anyhow::Result<Update> {
        // (A file an earlier Quire exported with yrs 0.28's skip fault is read around it.)
        std::panic::catch_unwind(|| quire_server::protocol::state::decode_state_v2(bytes))
            .map_err(|_| anyhow::anyhow!("not a Yjs v2 update"))?
            .map(|(update, _)| update)
            .map_err(|e| anyhow::anyhow!("not a Yjs v2 update: {e}"))
    };
    let text = || -> anyhow::Result<String> {
        String::from_utf8(bytes.to_vec()).context("not UTF-8 text")
    };
    Ok(match format {
        ImportFormat::Update => Content::Update(v1()?),
        ImportFormat::UpdateV2 => Content::Update(v2()?),
        ImportFormat::Text => Content::Text(text()?),
        // Some bytes decode both ways (a v2 update can read as an empty v1 one): the encoding
        // that finds content wins.
        ImportFormat::Auto => match (v1(), v2()) {
            (Ok(u), _) if !u.is_empty() => Content::Update(u),
            (_, Ok(u)) if !u.is_empty() => Content::Update(u),
            (Ok(u), _) | (_, Ok(u)) => Content::Update(u),
            (Err(_), Err(_)) => match text() {
                Ok(t) => Content::Text(t),
                Err(_) => bail!("the file is neither a Yjs update (v1 or v2) nor UTF-8 text"),
            },
        },
    })
}

/// What `content` adds to `doc` (a Yjs v1 update), `None` if nothing.
fn addition(doc: &Doc, content: Content, root: &str) -> anyhow::Result<Option<Vec<u8>>> {
    let before = doc.transact().snapshot();
    match content {
        Content::Update(update) => {
            let mut txn = doc.transact_mut();
            txn.apply_update(update)
                .map_err(|e| anyhow::anyhow!("the update does not apply: {e}"))?;
            if txn.has_missing_updates() {
                bail!("the update depends on changes the document does not have");
            }
        }
        Content::Text(text) => {
            let shared = doc.get_or_insert_text(root);
            let mut txn = doc.transact_mut();
            let end = shared.len(&txn);
            shared.insert(&mut txn, end, &text);
        }
    }
    let txn = doc.transact();
    if txn.snapshot() == before {
        return Ok(None);
    }
    // The new blocks, and the document's deletions (which include the new ones).
    Ok(Some(txn.encode_diff_v1(&before.state_map)))
}

async fn import(
    api: &Api,
    config: &quire_server::config::Config,
    name: &str,
    file: &Path,
    format: ImportFormat,
    root: &str,
) -> anyhow::Result<()> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let progress = Progress::start(format!("importing {} into {name}", file.display()));
    if api.answers().await {
        let state = api.current_update(name).await?;
        let doc = Doc::new();
        {
            let current = Update::decode_v1(&state)
                .map_err(|e| anyhow::anyhow!("the server sent an invalid update: {e}"))?;
            doc.transact_mut()
                .apply_update(current)
                .map_err(|e| anyhow::anyhow!("the server sent an invalid update: {e}"))?;
        }
        let Some(update) = addition(&doc, decode_file(&bytes, format)?, root)? else {
            progress.done(&format!(
                "{name} already has everything in {}",
                file.display()
            ));
            return Ok(());
        };
        progress.bytes(update.len() as u64);
        let seq = api.post_update(name, update).await?;
        progress.done(&format!(
            "imported {} into {name} through the server at {}, log position {seq}",
            file.display(),
            api.base()
        ));
        return Ok(());
    }
    quire_server::room::DocName::parse(name)
        .map_err(|e| anyhow::anyhow!("{name:?} is not a document name: {e}"))?;
    let stores = crate::ops::open_current_store(config).await?;
    // A document that does not exist yet is created, as a first WebSocket client would.
    if let Some(meta) = stores.api.get_doc_by_name(name).await? {
        if meta.deleted_at.is_some() {
            bail!("document {name:?} is deleted");
        }
    }
    for _ in 0..10 {
        let stored = stores.docs.load(name).await?;
        if stored.deleted {
            bail!("document {name:?} is deleted");
        }
        let doc = quire_server::room::replay_stored(&stored)
            .map_err(|e| anyhow::anyhow!("document {name:?} does not replay: {e}"))?;
        let Some(update) = addition(&doc, decode_file(&bytes, format)?, root)? else {
            progress.done(&format!(
                "{name} already has everything in {}",
                file.display()
            ));
            return Ok(());
        };
        // What enters a document must integrate, as through the server's room
        // (docs/durability.md): deletions of what does not exist are cut.
        let update = admitted(&doc, update)?;
        progress.bytes(update.len() as u64);
        let seq = stored.last_seq() + 1;
        let entry = LogEntry {
            data: update.into(),
            author: Some("quire doc import".into()),
            ..LogEntry::default()
        };
        match stores
            .docs
            .append_log(stored.id, None, seq, vec![entry])
            .await
        {
            Ok(()) => {
                progress.done(&format!(
                    "imported {} into {name} in the store (no server answered at {}), log \
                     position {seq}",
                    file.display(),
                    api.base()
                ));
                return Ok(());
            }
            // Another writer took the position (a server started meanwhile): read again.
            Err(StorageError::Conflict) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    bail!("document {name:?} kept changing under the import; try again")
}

/// `update` as it may enter `doc`: refused if it depends on content `doc` does not hold, with
/// deletions of clocks nobody holds cut (the check every write path passes).
fn admitted(doc: &Doc, update: Vec<u8>) -> anyhow::Result<Vec<u8>> {
    use quire_server::integrity::{admit, Admission};
    use yrs::updates::encoder::Encode;
    use yrs::ReadTxn;
    let mut decoded = Update::decode_v1(&update)
        .map_err(|e| anyhow::anyhow!("the import is not a valid update: {e}"))?;
    let sv = doc.transact().state_vector();
    match admit(&sv, &mut decoded) {
        Admission::Integrates { cut: None } => Ok(update),
        Admission::Integrates { cut: Some(_) } => Ok(decoded.encode_v1()),
        Admission::Missing(id) => anyhow::bail!(
            "the file depends on content the document does not hold (client {}, clock {})",
            id.client,
            id.clock
        ),
    }
}
