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
        self.answer(req).await?.ok()
    }
}

/// A server's answer: its status and JSON body (a problem+json body for a refusal).
pub struct Answer {
    pub status: reqwest::StatusCode,
    pub body: Value,
}

impl Answer {
    /// The body of a success; a refusal as an error with the server's reason.
    pub fn ok(self) -> anyhow::Result<Value> {
        if !self.status.is_success() {
            let detail = self.body["detail"].as_str().unwrap_or("");
            match self.problem() {
                "" => bail!("the server answered {}: {detail}", self.status),
                kind => bail!("the server answered {} ({kind}): {detail}", self.status),
            }
        }
        Ok(self.body)
    }

    /// The problem type of a refusal, its URI's last segment (`missing-dependencies`, ...);
    /// empty if none.
    pub fn problem(&self) -> &str {
        let kind = self.body["type"].as_str().unwrap_or("");
        kind.rsplit('/').next().unwrap_or(kind)
    }
}

impl Api {
    /// `GET /api/v1/docs/{name}{rest}`, refusals included.
    pub async fn get(&self, name: &str, rest: &str) -> anyhow::Result<Answer> {
        self.answer(self.http.get(self.url(name, rest))).await
    }

    /// `POST /api/v1/docs/{name}{rest}` with a JSON body (or none), refusals included.
    pub async fn post(
        &self,
        name: &str,
        rest: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Answer> {
        let req = self.http.post(self.url(name, rest));
        let req = match body {
            Some(body) => req.json(&body),
            None => req,
        };
        self.answer(req).await
    }

    async fn answer(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Answer> {
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
        Ok(Answer { status, body })
    }
}

impl Api {
    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether a server answers at the base URL (`/healthz` within two seconds).
    pub async fn answers(&self) -> bool {
        let probe = self
            .http
            .get(format!("{}/healthz", self.base))
            .timeout(std::time::Duration::from_secs(2))
            .send()
            .await;
        probe.is_ok()
    }

    /// The document's whole committed state as a Yjs v1 update; a document that does not
    /// exist is created first (empty), as a first WebSocket client would have it.
    pub async fn current_update(&self, name: &str) -> anyhow::Result<Vec<u8>> {
        let get = || {
            let req = self.http.get(self.url(name, "/update"));
            match &self.token {
                Some(t) => req.bearer_auth(t),
                None => req,
            }
        };
        let resp = get()
            .send()
            .await
            .with_context(|| format!("cannot reach the server at {}", self.base))?;
        let resp = if resp.status() == reqwest::StatusCode::NOT_FOUND {
            self.send(
                self.http
                    .post(format!("{}/api/v1/docs", self.base))
                    .json(&serde_json::json!({ "name": name })),
            )
            .await?;
            get().send().await?
        } else {
            resp
        };
        let status = resp.status();
        if !status.is_success() {
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            bail!(
                "the server answered {status}: {}",
                body["detail"].as_str().unwrap_or("")
            );
        }
        Ok(resp.bytes().await?.to_vec())
    }

    /// Applies a Yjs v1 update through the document's room; the log position it reached.
    pub async fn post_update(&self, name: &str, update: Vec<u8>) -> anyhow::Result<i64> {
        let body = self
            .send(
                self.http
                    .post(self.url(name, "/update"))
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(update),
            )
            .await?;
        body["seq"]
            .as_i64()
            .context("the server's answer has no log position")
    }
}

/// Milliseconds since the epoch as an RFC 3339 time (seconds).
pub fn time(ms: &Value) -> String {
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
