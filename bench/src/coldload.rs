//! `coldload`: the editing trace through one client, or a new client's sync to it.

use super::*;

#[derive(clap::Args, Clone)]
pub(crate) struct ColdArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// The editing trace (gzipped JSON: edits and finalText)
    #[arg(long, default_value = "tests/data/editing-trace.json.gz")]
    pub(crate) trace: PathBuf,
    /// Instead of ingesting: time a new client's sync and check its text
    #[arg(long)]
    pub(crate) verify: bool,
    /// Edits per frame... one update per message, this many messages per write batch
    #[arg(long, default_value_t = 64)]
    pub(crate) batch: usize,
    /// Give up on a server that has not taken and relayed the whole trace by then (a server
    /// that stops reading would otherwise hold the run forever)
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
}

pub(crate) struct Trace {
    pub(crate) edits: Vec<(u32, u32, String)>,
    pub(crate) final_text: String,
}

pub(crate) fn read_trace(path: &PathBuf) -> anyhow::Result<Trace> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_reader(flate2::read::GzDecoder::new(file))?;
    let edits = json["edits"]
        .as_array()
        .context("edits")?
        .iter()
        .filter_map(|e| {
            let e = e.as_array()?;
            Some((
                e.first()?.as_u64()? as u32,
                e.get(1)?.as_u64()? as u32,
                e.get(2)?.as_str()?.to_owned(),
            ))
        })
        .collect();
    let final_text = json["finalText"].as_str().context("finalText")?.to_owned();
    Ok(Trace { edits, final_text })
}

pub(crate) async fn coldload(args: ColdArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let trace = read_trace(&args.trace)?;
    let doc_name = format!("{}-trace", c.prefix);
    if args.verify {
        let started = Instant::now();
        let mut ws = wire::connect(&c.url, &doc_name, c.flavor).await?;
        let state = wire::wait_synced(&mut ws, c.flavor, &doc_name, &[0, 0]).await?;
        let synced = started.elapsed();
        let doc = Doc::new();
        let text = doc.get_or_insert_text("text");
        {
            let mut txn = doc.transact_mut();
            if let Ok(u) = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(&state) {
                let _ = txn.apply_update(u);
            }
        }
        let got = text.get_string(&doc.transact());
        let ok = got == trace.final_text;
        println!(
            "{} cold sync: {synced:.2?} to a synced client, {} chars, text {}",
            c.label,
            got.len(),
            if ok { "matches" } else { "DIFFERS" }
        );
        println!(
            "{}",
            serde_json::json!({
                "scenario": "coldload-verify", "label": c.label, "sync_ms": synced.as_secs_f64() * 1000.0,
                "chars": got.len(), "text_ok": ok, "server_rss_kib": c.server_pid.and_then(process_rss_kib),
            })
        );
        return Ok(());
    }
    // Ingest: every edit is one update message, as an editor sends them; a second client
    // watches, and the ingest is done when it has received every edit.
    let cpu_start = own_cpu_seconds();
    let mut ws = wire::connect(&c.url, &doc_name, c.flavor).await?;
    wire::wait_synced(&mut ws, c.flavor, &doc_name, &[0, 0]).await?;
    let mut watcher = wire::connect(&c.url, &doc_name, c.flavor).await?;
    wire::wait_synced(&mut watcher, c.flavor, &doc_name, &[0, 0]).await?;
    let total_edits = trace.edits.len();
    // Encode every edit's update before the clock starts: the generator must not be what is
    // measured.
    let doc = Doc::with_client_id(424_242);
    let text = doc.get_or_insert_text("text");
    let updates: Vec<Vec<u8>> = trace
        .edits
        .iter()
        .map(|(pos, del, ins)| {
            let mut txn = doc.transact_mut();
            if *del > 0 {
                text.remove_range(&mut txn, *pos, *del);
            }
            if !ins.is_empty() {
                text.insert(&mut txn, *pos, ins);
            }
            txn.encode_update_v1()
        })
        .collect();
    // The same updates decoded and applied by yrs alone, on this machine, now: the reference
    // the ingest rate is read against (the machine's speed varies from day to day).
    let local = {
        let started = Instant::now();
        let alone = Doc::new();
        for update in &updates {
            if let Ok(u) = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(update) {
                let _ = alone.transact_mut().apply_update(u);
            }
        }
        total_edits as f64 / started.elapsed().as_secs_f64()
    };
    let frames: Vec<Bytes> = updates
        .iter()
        .map(|u| wire::wrap(c.flavor, &doc_name, protocol::encode_update(u)))
        .collect();
    drop(updates);
    let started = Instant::now();
    let (mut sink, mut stream) = ws.split();
    // Drain whatever the server sends the writer (echoes), so its socket never stalls; say why
    // if the server closes it before we do.
    let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let we_close = closing.clone();
    let drain = tokio::spawn(async move {
        while let Some(msg) = stream.next().await {
            match msg {
                Ok(WsMessage::Close(frame)) if !we_close.load(Ordering::SeqCst) => {
                    eprintln!("the server closed the ingest connection: {frame:?}");
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("the ingest connection failed: {e}");
                    break;
                }
            }
        }
    });
    let writer = async {
        for chunk in frames.chunks(args.batch) {
            let mut msgs =
                futures_util::stream::iter(chunk.iter().map(|f| Ok(WsMessage::Binary(f.clone()))));
            sink.send_all(&mut msgs).await?;
        }
        anyhow::Ok(sink)
    };
    // The watcher only collects what it receives, so it keeps up with any server (applying
    // every update as it arrived made it slower than Quire, which then closed it with 1013 as
    // a peer that does not read). It is done when it holds one update per edit (servers relay
    // each update as it came), or, for a server that merges updates, when the stream has been
    // quiet for a while and what it holds gives the trace's final text. The time is taken at
    // the last arrival; the text is checked after the clock stops, in either case.
    let watch = async {
        let mut received: Vec<Bytes> = Vec::with_capacity(total_edits);
        let mut last_arrival = started;
        loop {
            if received.len() >= total_edits {
                break;
            }
            match tokio::time::timeout(WATCH_QUIET, watcher.next()).await {
                Ok(None) => anyhow::bail!("watcher closed before the end of the trace"),
                Ok(Some(frame)) => match frame? {
                    WsMessage::Binary(data) => {
                        for m in wire::parse(c.flavor, &data) {
                            if let Incoming::Update(u) = m {
                                received.push(u);
                                last_arrival = Instant::now();
                            }
                        }
                    }
                    // Say why, for the record.
                    WsMessage::Close(frame) => eprintln!(
                        "the server closed the watcher after {} updates: {frame:?}",
                        received.len()
                    ),
                    _ => {}
                },
                Err(_) if watched_text(&received) == trace.final_text => break,
                Err(_) => {}
            }
        }
        let elapsed = last_arrival.duration_since(started);
        if watched_text(&received) != trace.final_text {
            anyhow::bail!("the watcher's text differs from the trace's final text");
        }
        anyhow::Ok(elapsed)
    };
    let Ok((sink, watched)) =
        tokio::time::timeout(args.timeout, async { tokio::join!(writer, watch) }).await
    else {
        anyhow::bail!(
            "the server had not taken and relayed the trace after {:?} (--timeout)",
            args.timeout
        );
    };
    let mut sink = sink?;
    let elapsed = watched?;
    closing.store(true, Ordering::SeqCst);
    let _ = sink.close().await;
    drain.abort();
    let rate = total_edits as f64 / elapsed.as_secs_f64();
    println!(
        "{} ingest: {total_edits} edits in {elapsed:.2?} ({rate:.0} updates/s; yrs alone \
         here: {local:.0}/s), generator CPU {:.2} s",
        c.label,
        own_cpu_seconds() - cpu_start
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "coldload-ingest", "label": c.label, "edits": total_edits,
            "secs": elapsed.as_secs_f64(), "updates_per_s": rate,
            "yrs_alone_per_s": local,
            "bench_cpu_s": own_cpu_seconds() - cpu_start,
            "server_rss_kib": c.server_pid.and_then(process_rss_kib),
        })
    );
    Ok(())
}

/// How long the trace's watcher waits on a quiet stream before checking whether what it
/// holds is already the final text (servers that merge updates send fewer messages).
pub(crate) const WATCH_QUIET: Duration = Duration::from_millis(500);

/// The text of a document made of `updates`.
pub(crate) fn watched_text(updates: &[Bytes]) -> String {
    let doc = Doc::new();
    let text = doc.get_or_insert_text("text");
    {
        let mut txn = doc.transact_mut();
        for u in updates {
            if let Ok(u) = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(u) {
                let _ = txn.apply_update(u);
            }
        }
    }
    let s = text.get_string(&doc.transact());
    s
}
