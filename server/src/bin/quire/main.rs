//! The `quire` binary: parses the command line and hands over to the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args as _;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use quire_server::auth::{Auth, Permission};
use quire_server::config::Settings;
use tokio_util::sync::CancellationToken;

/// jemalloc rather than the system's allocator: glibc's malloc kept the freed buffers of a
/// large document (its load, its sync answers, its snapshots) resident for the life of the
/// process, so a 20 MiB document cost twice the floor's memory; jemalloc's background thread
/// hands freed pages back within about a second (settings in `.cargo/config.toml`).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

mod backup;
mod branch;
mod doc;
mod history;
mod ops;

#[derive(Parser)]
#[command(
    name = "quire",
    version,
    about = "Quire: a durable Yjs collaborative-document sync server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve documents over WebSocket (y-websocket protocol)
    Serve(Args),
    /// Apply database migrations and exit
    Migrate(Args),
    /// Issue or revoke access tokens
    #[command(subcommand)]
    Token(TokenCommand),
    /// A document's editing sessions, newest first (from a running server)
    History {
        /// The document's name
        name: String,
        /// Sessions to show
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        target: history::Target,
        #[command(flatten)]
        args: Args,
    },
    /// Export a document's content to a file, or import a file into a document
    Doc {
        #[command(subcommand)]
        command: doc::DocCommand,
    },
    /// Back the store up into FILE while the server runs (SQLite; prints the pg_dump command
    /// for PostgreSQL), then check the copy
    Backup {
        file: PathBuf,
        #[command(flatten)]
        args: Args,
    },
    /// Restore a backup made by `quire backup` into an empty store, with no server running
    RestoreBackup {
        file: PathBuf,
        #[command(flatten)]
        target: history::Target,
        #[command(flatten)]
        args: Args,
    },
    /// Write a snapshot of the named documents now (every document when none is named)
    Compact {
        names: Vec<String>,
        #[command(flatten)]
        args: Args,
    },
    /// Check the configuration, the database and its migrations, disk space, the bus and the
    /// clock; exits 1 when a check fails
    Doctor {
        #[command(flatten)]
        args: Args,
    },
    /// A document's versions: list, create, restore (through a running server)
    Version {
        #[command(subcommand)]
        command: history::VersionCommand,
        #[command(flatten)]
        target: history::Target,
        #[command(flatten)]
        args: Args,
    },
    /// A document's branches: create, list, review changes, merge, reject, close (through a
    /// running server)
    Branch {
        #[command(subcommand)]
        command: branch::BranchCommand,
        #[command(flatten)]
        target: history::Target,
        #[command(flatten)]
        args: Args,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Sign a token with the first configured auth key and print it
    Issue {
        /// User id (the token's subject)
        #[arg(long)]
        user: String,
        /// Document name, or a pattern ending in `*` (`*` for every document)
        #[arg(long)]
        doc: String,
        /// read, write or admin
        #[arg(long, value_parser = parse_permission)]
        permission: Permission,
        /// Lifetime
        #[arg(long, default_value = "1h")]
        ttl: quire_server::config::HumanDuration,
        #[command(flatten)]
        args: Args,
    },
    /// Revoke a token id, or every token of a user issued until now; running servers close
    /// the matching sockets with 4403 within a second
    Revoke {
        #[arg(long, required_unless_present = "user")]
        token_id: Option<String>,
        #[arg(long)]
        user: Option<String>,
        #[command(flatten)]
        args: Args,
    },
}

fn parse_permission(s: &str) -> Result<Permission, String> {
    Permission::parse(s).ok_or_else(|| format!("{s:?} is not read, write or admin"))
}

#[derive(clap::Args)]
pub struct Args {
    /// TOML file of settings (flags and QUIRE_* variables override it)
    #[arg(long, env = "QUIRE_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

impl Args {
    pub fn resolve(self) -> anyhow::Result<quire_server::config::Config> {
        let file = match &self.config {
            Some(path) => Settings::from_file(path)?,
            None => Settings::default(),
        };
        Ok(self.settings.or(file).resolve())
    }
}

/// The settings each command reads, by their field names in `Settings`: its `--help` shows
/// these and hides the others (which it still accepts, like a config file's, and ignores).
/// `serve` reads them all.
const STORE: &[&str] = &[
    "database_url",
    "sqlite_synchronous",
    "sqlite_commit_delay",
    "sqlite_commit_siblings",
    "postgres_commit_delay",
    "postgres_commit_siblings",
    "log_format",
    "log",
];
/// A running server's address and the key that administers it (`history`, `version`, ...).
const SERVER: &[&str] = &["bind", "admin_key"];

/// The command line, each subcommand's help showing only the settings it reads.
fn command() -> clap::Command {
    let reads: &[(&[&str], &[&[&str]])] = &[
        (&["migrate"], &[STORE]),
        (&["token", "issue"], &[&["auth_keys"]]),
        (&["token", "revoke"], &[STORE]),
        (&["history"], &[SERVER]),
        (&["version"], &[SERVER]),
        (&["branch"], &[SERVER]),
        (&["doc", "export"], &[STORE, SERVER]),
        (&["doc", "import"], &[STORE, SERVER]),
        (&["backup"], &[STORE]),
        (&["restore-backup"], &[STORE, SERVER]),
        (&["compact"], &[STORE, &["history_retention"]]),
        (
            &["doctor"],
            &[
                STORE,
                SERVER,
                &[
                    "auth_keys",
                    "node_id",
                    "bus_url",
                    "bus_credentials",
                    "cluster_key",
                ],
            ],
        ),
    ];
    let settings = Settings::augment_args(clap::Command::new("settings"));
    let all: Vec<String> = settings
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let mut cmd = Cli::command();
    for (path, groups) in reads {
        let keep: Vec<&str> = groups.iter().flat_map(|g| g.iter().copied()).collect();
        cmd = hide_settings(cmd, path, &all, &keep);
    }
    cmd
}

/// Hides, in the subcommand at `path`, every setting of `all` but those in `keep`.
fn hide_settings(
    cmd: clap::Command,
    path: &[&str],
    all: &[String],
    keep: &[&str],
) -> clap::Command {
    let Some((first, rest)) = path.split_first() else {
        return all
            .iter()
            .filter(|id| !keep.contains(&id.as_str()))
            .fold(cmd, |cmd, id| cmd.mut_arg(id, |a| a.hide(true)));
    };
    cmd.mut_subcommand(*first, |sub| hide_settings(sub, rest, all, keep))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Serve(args) => {
            let config = args.resolve()?;
            quire_server::telemetry::init(config.log_format, &config.log);
            // Everything that can be checked before the port is taken and "listening" said.
            quire_server::check_config(&config)?;
            let listener = tokio::net::TcpListener::bind(config.bind)
                .await
                .with_context(|| format!("cannot listen on {}", config.bind))?;
            let addr = listener.local_addr()?;
            tracing::info!(%addr, database = %quire_server::storage::redact_url(config.database_url.expose()), "listening");
            // Scripts and tests read this line to learn the port when binding to port 0.
            println!("quire listening on {addr}");
            let shutdown = CancellationToken::new();
            tokio::spawn(signal_shutdown(shutdown.clone()));
            quire_server::run(listener, config, shutdown).await
        }
        Command::Migrate(args) => {
            let config = args.resolve()?;
            quire_server::telemetry::init(config.log_format, &config.log);
            quire_server::open_stores(&config).await?;
            tracing::info!(database = %quire_server::storage::redact_url(config.database_url.expose()), "migrations applied");
            Ok(())
        }
        Command::Token(TokenCommand::Issue {
            user,
            doc,
            permission,
            ttl,
            args,
        }) => {
            let config = args.resolve()?;
            let auth = Auth::new(&config.auth_keys, None).map_err(anyhow::Error::msg)?;
            let (token, _) = auth.issue(
                &user,
                &doc,
                permission,
                ttl.0.as_secs() as i64,
                quire_server::auth::now_secs(),
            )?;
            println!("{token}");
            Ok(())
        }
        Command::History {
            name,
            limit,
            target,
            args,
        } => {
            let config = args.resolve()?;
            let api = history::Api::new(target, &config);
            history::history(&api, &name, limit).await
        }
        Command::Backup { file, args } => {
            let config = args.resolve()?;
            backup::backup(&config, &file).await
        }
        Command::RestoreBackup { file, target, args } => {
            let config = args.resolve()?;
            let api = history::Api::new(target, &config);
            backup::restore(&config, &api, &file).await
        }
        Command::Compact { names, args } => {
            let config = args.resolve()?;
            ops::compact(&config, names).await
        }
        Command::Doctor { args } => {
            let config = args.resolve()?;
            ops::doctor(&config).await
        }
        Command::Doc { command } => doc::run(command).await,
        Command::Version {
            command,
            target,
            args,
        } => {
            let config = args.resolve()?;
            let api = history::Api::new(target, &config);
            history::version(&api, command).await
        }
        Command::Branch {
            command,
            target,
            args,
        } => {
            let config = args.resolve()?;
            let api = history::Api::new(target, &config);
            branch::branch(&api, command).await
        }
        Command::Token(TokenCommand::Revoke {
            token_id,
            user,
            args,
        }) => {
            let config = args.resolve()?;
            quire_server::telemetry::init(config.log_format, &config.log);
            let stores = quire_server::open_stores(&config).await?;
            let r = stores
                .api
                .revoke(
                    token_id.as_deref(),
                    user.as_deref(),
                    quire_server::storage::now_ms(),
                )
                .await?;
            println!("revocation {} recorded", r.id);
            Ok(())
        }
    }
}

/// Cancels `token` on SIGINT or SIGTERM.
async fn signal_shutdown(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    token.cancel();
}
