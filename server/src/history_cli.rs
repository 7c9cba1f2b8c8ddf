//! `quire history` and `quire version`: the version history for operators, through a running
//! server's REST API (the same routes the web editor uses, so the CLI never writes a document
//! beside its room). The server is the configured `bind` address unless `--server` says
//! otherwise; the credential is `--token`, else the configured admin key.

use anyhow::{bail, Context};
use clap::Subcommand;
use serde_json::Value;

/// Where the server is and how to authenticate.
#[derive(clap::Args)]
pub struct Target {
    /// The server's base URL [default: http:// and the configured bind address]
    #[arg(long, env = "QUIRE_SERVER", global = true)]
    server: Option<String>,
    /// Bearer credential: a token, or the admin key [default: the configured admin key]
    #[arg(long, env = "QUIRE_TOKEN", global = true)]
    token: Option<String>,
}

#[derive(Subcommand)]
pub enum VersionCommand {
    /// List a document's versions, oldest first
    List { name: String },
    /// Record the current content as a named version
    Create {
        name: String,
        #[arg(long)]
        label: String,
    },
    /// Make a version's content current again, as a new change
    Restore { name: String, id: i64 },
}

/// A client of one server.
pub struct Api {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Api {
    pub fn new(target: Target, config: &quire_server::config::Config) -> Api {
        let base = target
            .server
            .unwrap_or_else(|| format!("http://{}", config.bind))
            .trim_end_matches('/')
            .to_owned();
        let token = target
            .token
            .or_else(|| config.admin_key.as_ref().map(|k| k.expose().to_owned()));
        Api {
            base,
            token,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self, name: &str, rest: &str) -> String {
        format!(
            "{}/api/v1/docs/{}{rest}",
            self.base,
            quire_server::http::doc_path(name)
        )
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the server at {}", self.base))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let detail = body["detail"].as_str().unwrap_or("");
            bail!("the server answered {status}: {detail}");
        }
        Ok(body)
    }
}

/// Milliseconds since the epoch as an RFC 3339 time (seconds).
fn time(ms: &Value) -> String {
    let ms = ms.as_i64().unwrap_or(0).max(0) as u64;
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `quire history NAME`: the editing sessions, newest first, one per line.
pub async fn history(api: &Api, name: &str, limit: u32) -> anyhow::Result<()> {
    let page = api
        .send(
            api.http
                .get(api.url(name, "/history"))
                .query(&[("limit", limit)]),
        )
        .await?;
    let items = page["items"].as_array().cloned().unwrap_or_default();
    if items.is_empty() {
        println!("no retained history for {name}");
    }
    for s in items {
        let authors: Vec<String> = s["authors"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|a| {
                format!(
                    "{} ({} updates, +{} -{})",
                    a["author"].as_str().unwrap_or("(unknown)"),
                    a["updates"],
                    a["inserted"],
                    a["deleted"]
                )
            })
            .collect();
        println!(
            "{} .. {}  positions {}-{}  {}",
            time(&s["first_at"]),
            time(&s["last_at"]),
            s["first_seq"],
            s["last_seq"],
            authors.join(", ")
        );
    }
    Ok(())
}

/// `quire version ...`.
pub async fn version(api: &Api, command: VersionCommand) -> anyhow::Result<()> {
    match command {
        VersionCommand::List { name } => {
            let list = api.send(api.http.get(api.url(&name, "/versions"))).await?;
            let list = list.as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                println!("no versions of {name}");
            }
            for v in list {
                println!(
                    "{}  position {}  {}  {}  {}  {}",
                    v["id"],
                    v["seq"],
                    v["kind"].as_str().unwrap_or(""),
                    time(&v["created_at"]),
                    v["author"].as_str().unwrap_or("-"),
                    v["label"].as_str().unwrap_or("")
                );
            }
        }
        VersionCommand::Create { name, label } => {
            let v = api
                .send(
                    api.http
                        .post(api.url(&name, "/versions"))
                        .json(&serde_json::json!({ "label": label })),
                )
                .await?;
            println!("version {} of {name} at position {}", v["id"], v["seq"]);
        }
        VersionCommand::Restore { name, id } => {
            let r = api
                .send(
                    api.http
                        .post(api.url(&name, &format!("/versions/{id}/restore")))
                        .json(&serde_json::json!({})),
                )
                .await?;
            println!(
                "restored version {id} of {name} at position {} (recorded as version {})",
                r["seq"], r["version"]["id"]
            );
        }
    }
    Ok(())
}
