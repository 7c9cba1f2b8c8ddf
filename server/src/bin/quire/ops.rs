//! `quire compact [NAME...]` and `quire doctor`.
//!
//! - **compact** writes a snapshot of each named document (every document when none is
//!   named) now, the way a room does: the committed state replayed from the store, written
//!   with the snapshot version check (a room that wrote meanwhile makes it a conflict, which is
//!   tried once more from a fresh read; a room whose own snapshot then conflicts reloads), and
//!   large snapshots staged in parts first.
//! - **doctor** checks a deployment without changing it and exits non-zero when a check
//!   fails: the configuration, the database (reachable, migrations applied, none unknown),
//!   free disk space beside a SQLite file, the bus (NATS reachable), and the clock against the
//!   database's (on PostgreSQL, the nodes' shared clock).

use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use quire_server::storage::api::DocQuery;
use quire_server::storage::{SnapshotBytes, SnapshotOutcome, SNAPSHOT_PART_BYTES};
use yrs::{ReadTxn, Transact};

/// What compacting one document did.
enum Compacted {
    Written { rows: usize, bytes: usize },
    AlreadyCompact,
}

async fn compact_one(stores: &quire_server::Stores, name: &str) -> anyhow::Result<Compacted> {
    // `load` creates a document it does not find: a mistyped name must not.
    if stores.api.get_doc_by_name(name).await?.is_none() {
        bail!("no document named {name:?}");
    }
    for _ in 0..2 {
        let stored = stores.docs.load(name).await?;
        if stored.deleted {
            bail!("document {name:?} is deleted");
        }
        if stored.updates.is_empty() {
            return Ok(Compacted::AlreadyCompact);
        }
        let (doc, aside) = quire_server::room::replay_stored_checked(&stored)
            .map_err(|e| anyhow::anyhow!("document {name:?} does not replay: {e}"))?;
        // Rows that do not integrate are recorded before the snapshot covers them.
        if !aside.is_empty() {
            stores.docs.shared().set_aside(stored.id, &aside).await?;
        }
        let encoded = {
            let txn = doc.transact();
            if txn.has_missing_updates() {
                bail!("document {name:?} has updates waiting on missing ones; not compacted");
            }
            quire_server::protocol::state::encode_state_v2(&txn)
        };
        let bytes = encoded.len();
        let data = bytes::Bytes::from(encoded);
        let snapshot = if bytes > SNAPSHOT_PART_BYTES {
            SnapshotBytes::Staged(stores.docs.stage_snapshot(stored.id, data).await?)
        } else {
            SnapshotBytes::Whole(data)
        };
        let written = stores
            .docs
            .write_snapshot(
                stored.id,
                None,
                stored.snapshot_version,
                snapshot,
                stored.last_seq(),
            )
            .await?;
        match written {
            SnapshotOutcome::Written { .. } => {
                return Ok(Compacted::Written {
                    rows: stored.updates.len(),
                    bytes,
                })
            }
            SnapshotOutcome::Conflict => continue,
        }
    }
    bail!("document {name:?}: a room kept writing snapshots; try again")
}

/// Opens the configured store for a command that reads or writes documents, after checking
/// that its schema is exactly this binary's: the store is never created (a mistyped SQLite
/// path is an error, not a new empty database) and never migrated behind a running server
/// (an older server would find its tables changed under it).
pub async fn open_current_store(
    config: &quire_server::config::Config,
) -> anyhow::Result<quire_server::Stores> {
    let url = config.database_url.expose();
    let postgres = quire_server::storage::postgres::is_postgres_url(url);
    let shown = quire_server::storage::redact_url(url);
    let Facts { applied, .. } = database_facts(url, postgres)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the store at {shown}: {e}"))?;
    let Some(applied) = applied else {
        bail!("{shown} is not a Quire store (no migrations): run `quire migrate` to create one");
    };
    let expected = quire_server::storage::migrations(postgres);
    if applied.iter().any(|v| !expected.contains(v)) {
        bail!("{shown} was migrated by a newer Quire than this binary");
    }
    if expected.iter().any(|v| !applied.contains(v)) {
        bail!(
            "{shown} needs migrations this binary has: run `quire migrate` (with the servers \
             stopped or upgraded) first"
        );
    }
    Ok(quire_server::open_stores(config).await?)
}

/// `quire compact [NAME...]`.
pub async fn compact(
    config: &quire_server::config::Config,
    names: Vec<String>,
) -> anyhow::Result<()> {
    let stores = open_current_store(config).await?;
    stores
        .api
        .set_history_retention(config.room.history.retention);
    let names = if names.is_empty() {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let page = stores
                .api
                .list_docs(&DocQuery {
                    owner: None,
                    name_prefix: None,
                    after_id: after,
                    limit: 500,
                    include_deleted: false,
                })
                .await?;
            let Some(last) = page.last() else { break };
            after = Some(last.id);
            all.extend(page.into_iter().map(|d| d.name));
        }
        all
    } else {
        names
    };
    let bar = ProgressBar::new(names.len() as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "compacting [{bar:30}] {pos}/{len} documents ({per_sec}) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    let (mut written, mut failed) = (0, 0);
    for name in &names {
        bar.set_message(name.clone());
        match compact_one(&stores, name).await {
            Ok(Compacted::Written { rows, bytes }) => {
                written += 1;
                // Above the bar on a terminal, a plain line elsewhere.
                bar.suspend(|| {
                    println!(
                        "{name}: {rows} log rows into a snapshot of {}",
                        indicatif::BinaryBytes(bytes as u64)
                    )
                });
            }
            Ok(Compacted::AlreadyCompact) => {}
            Err(e) => {
                failed += 1;
                eprintln!("{name}: {e:#}");
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    println!(
        "compacted {written} of {} documents in {:.2} s ({} already compact, {failed} failed)",
        names.len(),
        started.elapsed().as_secs_f64(),
        names.len() - written - failed
    );
    if failed > 0 {
        bail!("{failed} documents were not compacted");
    }
    Ok(())
}

/// One check's outcome.
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// `quire doctor`: every check, one line each; an error (exit code 1) if any failed.
pub async fn doctor(config: &quire_server::config::Config) -> anyhow::Result<()> {
    let mut checks = vec![Check {
        name: "configuration",
        ok: true,
        detail: format!(
            "bind {}, database {}, node {}",
            config.bind,
            quire_server::storage::redact_url(config.database_url.expose()),
            config.node_id
        ),
    }];
    checks.extend(database_checks(config).await);
    if let Some(check) = disk_check(config) {
        checks.push(check);
    }
    checks.push(bus_check(config).await);
    let mut failed = 0;
    for c in &checks {
        if !c.ok {
            failed += 1;
        }
        println!(
            "{} {:<14} {}",
            if c.ok { "ok  " } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    if failed > 0 {
        bail!("{failed} of {} checks failed", checks.len());
    }
    println!("all {} checks passed", checks.len());
    Ok(())
}

/// Rows of the `set_aside` table as doctor lists them: document, position, bytes, why.
type AsideRow = (String, i64, i64, String);

/// The newest set-aside rows (`None`: no such table yet).
const SET_ASIDE: &str = "SELECT d.name, s.seq, CAST(length(s.data) AS BIGINT), s.reason \
     FROM set_aside s JOIN documents d ON d.id = s.doc_id ORDER BY s.created_at DESC LIMIT 20";

/// What the database says: the versions of the migrations applied (`None`: no migrations
/// table), on PostgreSQL the database's clock in ms since the epoch, and the newest rows set
/// aside; read without changing anything.
struct Facts {
    applied: Option<Vec<i64>>,
    clock: Option<f64>,
    aside: Option<Vec<AsideRow>>,
}

async fn database_facts(url: &str, postgres: bool) -> Result<Facts, sqlx::Error> {
    const APPLIED: &str = "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version";
    if postgres {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await?;
        let applied: Option<Vec<i64>> = sqlx::query_scalar(APPLIED).fetch_all(&pool).await.ok();
        let clock: f64 = sqlx::query_scalar(
            "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS FLOAT8)",
        )
        .fetch_one(&pool)
        .await?;
        let aside = sqlx::query_as(SET_ASIDE).fetch_all(&pool).await.ok();
        pool.close().await;
        return Ok(Facts {
            applied,
            clock: Some(clock),
            aside,
        });
    }
    use std::str::FromStr;
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)?.read_only(true);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(opts)
        .await?;
    let applied: Option<Vec<i64>> = sqlx::query_scalar(APPLIED).fetch_all(&pool).await.ok();
    let aside = sqlx::query_as(SET_ASIDE).fetch_all(&pool).await.ok();
    pool.close().await;
    Ok(Facts {
        applied,
        clock: None,
        aside,
    })
}

/// The rows set aside because they did not integrate (docs/durability.md): listed, never a
/// failure (the documents loaded without them).
fn set_aside_check(aside: Option<Vec<AsideRow>>) -> Option<Check> {
    let rows = aside?;
    let detail = if rows.is_empty() {
        "no stored update was set aside".to_owned()
    } else {
        let listed: Vec<String> = rows
            .iter()
            .map(|(doc, seq, bytes, why)| format!("{doc} row {seq} ({bytes} bytes): {why}"))
            .collect();
        format!(
            "{} stored updates kept out of their documents (newest first; GET \
             /api/v1/admin/set-aside): {}",
            rows.len(),
            listed.join("; ")
        )
    };
    Some(Check {
        name: "set aside",
        ok: true,
        detail,
    })
}

/// Reachability, migrations and the clock, read without migrating anything.
async fn database_checks(config: &quire_server::config::Config) -> Vec<Check> {
    let url = config.database_url.expose();
    let postgres = quire_server::storage::postgres::is_postgres_url(url);
    let Facts {
        applied,
        clock,
        aside,
    } = match database_facts(url, postgres).await {
        Ok(facts) => facts,
        Err(e) => {
            return vec![Check {
                name: "database",
                ok: false,
                detail: format!("cannot connect: {e}"),
            }]
        }
    };
    let mut checks = vec![Check {
        name: "database",
        ok: true,
        detail: "reachable".into(),
    }];
    let expected = quire_server::storage::migrations(postgres);
    checks.push(match applied {
        None => Check {
            name: "migrations",
            ok: false,
            detail: "none applied: run `quire migrate` (or start the server once)".into(),
        },
        Some(applied) => {
            let missing: Vec<i64> = expected
                .iter()
                .filter(|v| !applied.contains(v))
                .copied()
                .collect();
            let unknown: Vec<i64> = applied
                .iter()
                .filter(|v| !expected.contains(v))
                .copied()
                .collect();
            if !unknown.is_empty() {
                Check {
                    name: "migrations",
                    ok: false,
                    detail: format!(
                        "the database has migrations this binary does not know ({unknown:?}): \
                         it was used by a newer Quire"
                    ),
                }
            } else if !missing.is_empty() {
                Check {
                    name: "migrations",
                    ok: false,
                    detail: format!(
                        "{} pending ({missing:?}): run `quire migrate` (or start the server)",
                        missing.len()
                    ),
                }
            } else {
                Check {
                    name: "migrations",
                    ok: true,
                    detail: format!("all {} applied", expected.len()),
                }
            }
        }
    });
    if let Some(db) = clock {
        let skew = (quire_server::storage::now_ms() as f64 - db).abs();
        checks.push(Check {
            name: "clock",
            ok: skew < 1_000.0,
            detail: format!(
                "{skew:.0} ms from the database's clock, which the nodes' leases and expiries \
                 are compared through (more than 1,000 ms fails)"
            ),
        });
    }
    checks.extend(set_aside_check(aside));
    checks
}

/// Free space on the file system of a SQLite database (at least 1 GiB, or 10 %).
fn disk_check(config: &quire_server::config::Config) -> Option<Check> {
    use std::str::FromStr;
    let url = config.database_url.expose();
    if quire_server::storage::postgres::is_postgres_url(url) {
        return None;
    }
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    let file = opts.get_filename();
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    Some(match rustix::fs::statvfs(dir) {
        Ok(st) => {
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            let total = st.f_blocks.saturating_mul(st.f_frsize);
            let ok = free >= 1 << 30 || free.saturating_mul(10) >= total;
            Check {
                name: "disk",
                ok,
                detail: format!(
                    "{} free of {} at {} (less than 1 GiB and 10 % fails)",
                    indicatif::BinaryBytes(free),
                    indicatif::BinaryBytes(total),
                    dir.display()
                ),
            }
        }
        Err(e) => Check {
            name: "disk",
            ok: false,
            detail: format!("cannot read the free space at {}: {e}", dir.display()),
        },
    })
}

/// The bus, when one is configured: a TCP connection to the NATS server within 5 s.
async fn bus_check(config: &quire_server::config::Config) -> Check {
    let Some(url) = &config.bus_url else {
        return Check {
            name: "bus",
            ok: true,
            detail: "none configured (a single node)".into(),
        };
    };
    let url = url.expose();
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .rsplit('@')
        .next()
        .unwrap_or("")
        .split('/')
        .next()
        .unwrap_or("")
        .to_owned();
    let addr = if host.contains(':') {
        host.clone()
    } else {
        format!("{host}:4222")
    };
    match tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(&addr),
    )
    .await
    {
        Ok(Ok(_)) => Check {
            name: "bus",
            ok: true,
            detail: format!("NATS reachable at {addr}"),
        },
        Ok(Err(e)) => Check {
            name: "bus",
            ok: false,
            detail: format!("NATS unreachable at {addr}: {e}"),
        },
        Err(_) => Check {
            name: "bus",
            ok: false,
            detail: format!("NATS at {addr} did not answer within 5 s"),
        },
    }
}
