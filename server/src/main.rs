//! The `quire` binary: parses the command line and hands over to the library.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use quire_server::auth::{Auth, Permission};
use quire_server::config::Settings;
use tokio_util::sync::CancellationToken;

mod backup_cli;
mod doc_cli;
mod history_cli;
mod ops_cli;

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
        target: history_cli::Target,
        #[command(flatten)]
        args: Args,
    },
    /// Export a document's content to a file, or import a file into a document
    Doc {
        #[command(subcommand)]
        command: doc_cli::DocCommand,
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
        target: history_cli::Target,
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
        command: history_cli::VersionCommand,
        #[command(flatten)]
        target: history_cli::Target,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
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
            let api = history_cli::Api::new(target, &config);
            history_cli::history(&api, &name, limit).await
        }
        Command::Backup { file, args } => {
            let config = args.resolve()?;
            backup_cli::backup(&config, &file).await
        }
        Command::RestoreBackup { file, target, args } => {
            let config = args.resolve()?;
            let api = history_cli::Api::new(target, &config);
            backup_cli::restore(&config, &api, &file).await
        }
        Command::Compact { names, args } => {
            let config = args.resolve()?;
            ops_cli::compact(&config, names).await
        }
        Command::Doctor { args } => {
            let config = args.resolve()?;
            ops_cli::doctor(&config).await
        }
        Command::Doc { command } => doc_cli::run(command).await,
        Command::Version {
            command,
            target,
            args,
        } => {
            let config = args.resolve()?;
            let api = history_cli::Api::new(target, &config);
            history_cli::version(&api, command).await
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
