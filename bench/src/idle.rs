//! `idle`: many connections, connected and synced, then idle.

use super::*;

#[derive(clap::Args, Clone)]
pub(crate) struct IdleArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    #[arg(long, default_value_t = 2000)]
    pub(crate) conns: usize,
    #[arg(long, default_value_t = 500)]
    pub(crate) rooms: usize,
    /// Connections opened at once
    #[arg(long, default_value_t = 64)]
    pub(crate) parallel: usize,
    /// How long to hold the connections before measuring
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) settle: Duration,
}

pub(crate) async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let rss_before = c.server_pid.and_then(process_rss_kib);
    let started = Instant::now();
    let mut conns = Vec::with_capacity(args.conns);
    let mut i = 0;
    while i < args.conns {
        let wave: Vec<_> = (i..(i + args.parallel).min(args.conns))
            .map(|k| {
                let doc = format!("{}-{}", c.prefix, k % args.rooms);
                let (url, flavor) = (c.url.clone(), c.flavor);
                tokio::spawn(async move {
                    let mut ws = wire::connect(&url, &doc, flavor).await?;
                    wire::wait_synced(&mut ws, flavor, &doc, &[0, 0]).await?;
                    anyhow::Ok(ws)
                })
            })
            .collect();
        for t in wave {
            conns.push(t.await??);
        }
        i += args.parallel;
    }
    let connect = started.elapsed();
    tokio::time::sleep(args.settle).await;
    let rss_after = c.server_pid.and_then(process_rss_kib);
    let per_conn = match (rss_before, rss_after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / args.conns as f64),
        _ => None,
    };
    println!(
        "{} idle: {} connections over {} rooms in {connect:.2?}; server RSS {} -> {} KiB ({:.2} KiB per connection)",
        c.label,
        args.conns,
        args.rooms,
        rss_before.unwrap_or(0),
        rss_after.unwrap_or(0),
        per_conn.unwrap_or(0.0)
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "idle", "label": c.label, "conns": args.conns, "rooms": args.rooms,
            "connect_s": connect.as_secs_f64(), "rss_before_kib": rss_before,
            "rss_after_kib": rss_after, "kib_per_conn": per_conn,
        })
    );
    drop(conns);
    Ok(())
}
