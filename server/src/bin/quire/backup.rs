//! `quire backup FILE` and `quire restore-backup FILE`.
//!
//! On SQLite a backup is `VACUUM INTO`: one read transaction copies a consistent state of the
//! database into a new, compacted file while the server goes on writing (WAL readers never
//! block the writer), then the copy is reopened and checked (`PRAGMA integrity_check`, the
//! migrations it has, its documents). A restore copies a checked backup into place, only where
//! no database file is yet and only while no server answers.
//! On PostgreSQL both print the `pg_dump` / `pg_restore` command that does it (the password,
//! if the URL has one, is left out: pass it as `PGPASSWORD`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::history::Api;

/// What a checked SQLite file holds.
struct Checked {
    documents: i64,
    migrations: i64,
    bytes: u64,
}

/// The SQLite file of a `sqlite:` URL.
fn sqlite_path(url: &str) -> anyhow::Result<PathBuf> {
    let opts = SqliteConnectOptions::from_str(url).context("not a SQLite URL")?;
    Ok(opts.get_filename().to_path_buf())
}

/// Opens `path` read-only and checks it is a sound Quire database.
async fn check(path: &Path) -> anyhow::Result<Checked> {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await
        .with_context(|| format!("cannot open {}", path.display()))?;
    let integrity: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await?;
    if integrity != "ok" {
        bail!(
            "{} fails SQLite's integrity check: {integrity}",
            path.display()
        );
    }
    let migrations: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut conn)
        .await
        .with_context(|| format!("{} is not a Quire database", path.display()))?;
    let documents: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM documents")
        .fetch_one(&mut conn)
        .await
        .with_context(|| format!("{} is not a Quire database", path.display()))?;
    conn.close().await?;
    Ok(Checked {
        documents,
        migrations,
        bytes: std::fs::metadata(path)?.len(),
    })
}

/// A bar of `total` bytes that follows the size of `file` while `work` runs, on a terminal
/// (hidden elsewhere, where the outcome line alone is printed).
async fn with_file_progress<T>(
    what: &str,
    file: &Path,
    total: u64,
    work: impl std::future::Future<Output = T>,
) -> T {
    let bar = ProgressBar::new(total.max(1));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_owned());
    let mut work = std::pin::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let out = loop {
        tokio::select! {
            out = &mut work => break out,
            _ = tick.tick() => {
                if let Ok(meta) = std::fs::metadata(file) {
                    bar.set_position(meta.len().min(total));
                }
            }
        }
    };
    bar.finish_and_clear();
    out
}

fn rate(bytes: u64, since: Instant) -> String {
    let secs = since.elapsed().as_secs_f64();
    format!(
        "{}, {secs:.2} s, {}/s",
        indicatif::BinaryBytes(bytes),
        indicatif::BinaryBytes((bytes as f64 / secs.max(1e-3)) as u64)
    )
}

/// `quire backup FILE`.
pub async fn backup(config: &quire_server::config::Config, file: &Path) -> anyhow::Result<()> {
    let url = config.database_url.expose();
    if quire_server::storage::postgres::is_postgres_url(url) {
        println!(
            "PostgreSQL is backed up with its own tool, while Quire runs:\n  pg_dump \
             --format=custom --file {} '{}'\n(a password in the URL is not shown: pass it as \
             PGPASSWORD)",
            shell_quote(&file.display().to_string()),
            quire_server::storage::redact_url(url)
        );
        return Ok(());
    }
    if file.exists() {
        bail!(
            "{} exists already: a backup never overwrites a file",
            file.display()
        );
    }
    let source = sqlite_path(url)?;
    if !source.exists() {
        bail!("there is no database at {}", source.display());
    }
    let total = std::fs::metadata(&source)?.len();
    let started = Instant::now();
    let copy = async {
        let mut conn = SqliteConnectOptions::from_str(url)?
            .read_only(true)
            .busy_timeout(Duration::from_secs(30))
            .connect()
            .await?;
        sqlx::query("VACUUM INTO ?")
            .bind(file.display().to_string())
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok::<_, sqlx::Error>(())
    };
    let label = format!("backing up to {}", file.display());
    with_file_progress(&label, file, total, copy)
        .await
        .with_context(|| format!("backup to {} failed", file.display()))?;
    let checked = match check(file).await {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(file);
            return Err(e.context("the backup did not check out and was removed"));
        }
    };
    println!(
        "backed up {} documents to {} ({}); checked: integrity ok, {} migrations",
        checked.documents,
        file.display(),
        rate(checked.bytes, started),
        checked.migrations
    );
    Ok(())
}

/// `quire restore-backup FILE`.
pub async fn restore(
    config: &quire_server::config::Config,
    api: &Api,
    file: &Path,
) -> anyhow::Result<()> {
    let url = config.database_url.expose();
    if quire_server::storage::postgres::is_postgres_url(url) {
        println!(
            "A PostgreSQL backup made with pg_dump is restored into an empty database with:\n  \
             pg_restore --no-owner --dbname '{}' {}\n(a password in the URL is not shown: pass \
             it as PGPASSWORD)",
            quire_server::storage::redact_url(url),
            shell_quote(&file.display().to_string())
        );
        return Ok(());
    }
    if api.answers().await {
        bail!(
            "a server answers at {}: stop it before restoring into its store",
            api.base()
        );
    }
    let backup = check(file)
        .await
        .with_context(|| format!("{} is not a usable backup", file.display()))?;
    let target = sqlite_path(url)?;
    // Restored only where no database file is yet: deleting one, even an empty one, could
    // pull it from under a server that has it open (one this check cannot see, at another
    // address), which would then write to a file nobody can open again.
    if target.exists() {
        let documents = check(&target).await.map(|c| c.documents).unwrap_or(0);
        if documents > 0 {
            bail!(
                "{} holds {documents} documents: a backup is restored only into an empty store",
                target.display()
            );
        }
        bail!(
            "{} exists: a backup is restored only where no database is yet (move the empty one \
             away, with no server using it)",
            target.display()
        );
    }
    // A write-ahead log or shared-memory file left beside the target (a database removed
    // without its companions) would be read by SQLite as part of the restored file: its
    // pages would replay over the backup's.
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut leftover = target.clone().into_os_string();
        leftover.push(suffix);
        let leftover = std::path::PathBuf::from(leftover);
        if leftover.exists() {
            bail!(
                "{} exists beside the target: it belongs to a database that was there before \
                 and SQLite would read it into the restored one; move it away first",
                leftover.display()
            );
        }
    }
    let started = Instant::now();
    let copy = async {
        let mut conn = SqliteConnectOptions::new()
            .filename(file)
            .read_only(true)
            .connect()
            .await?;
        sqlx::query("VACUUM INTO ?")
            .bind(target.display().to_string())
            .execute(&mut conn)
            .await?;
        conn.close().await?;
        Ok::<_, sqlx::Error>(())
    };
    let label = format!("restoring {}", file.display());
    with_file_progress(&label, &target, backup.bytes, copy)
        .await
        .with_context(|| format!("restore into {} failed", target.display()))?;
    // (A backup from an older Quire is brought up to date by the server's migrations when it
    // starts.)
    let restored = check(&target).await?;
    println!(
        "restored {} documents from {} into {} ({}); checked: integrity ok",
        restored.documents,
        file.display(),
        target.display(),
        rate(restored.bytes, started)
    );
    Ok(())
}

/// `s` quoted for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-:@%+=,".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
