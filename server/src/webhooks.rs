//! The webhook delivery worker: claims due events in the outbox, posts each to every
//! configured URL, and records the outcome in the outbox row. With several nodes on one
//! database each event is claimed by one node at a time, so it gets one delivery attempt per
//! round across the cluster; a node that dies mid-delivery leaves a claim that expires, and
//! another node delivers the event then. Delivery is therefore at least once: a receiver
//! deduplicates with the event id (sent as `Idempotency-Key` and in the body).
//!
//! - Signature: `Quire-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
//! - Retries: exponential backoff from `webhook_backoff`, doubled per attempt, with ±25 %
//!   jitter, capped at [`MAX_BACKOFF`]; after `webhook_max_attempts` the event moves to the
//!   dead-letter table.
//! - A URL that accepted an event is remembered, so retries go only to the ones that did not.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::WebhookConfig;
use crate::storage::api::{ApiStore, OutboxEvent};
use crate::storage::now_ms;

/// Longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// How often the worker looks for due events when nothing wakes it.
const POLL: Duration = Duration::from_millis(500);
/// Events claimed per round.
const BATCH: u32 = 16;

pub async fn run(
    api: Arc<dyn ApiStore>,
    config: WebhookConfig,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let client = match reqwest::Client::builder().timeout(config.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook HTTP client; webhooks are off");
            return;
        }
    };
    loop {
        let due = match api
            .claim_due_events(now_ms(), claim_ms(&config), BATCH)
            .await
        {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the outbox");
                Vec::new()
            }
        };
        let full = due.len() as u32 == BATCH;
        let mut due = due.into_iter();
        while let Some(event) = due.next() {
            if shutdown.is_cancelled() {
                // The events not attempted go back to the other nodes at once.
                let left: Vec<i64> = std::iter::once(event.id).chain(due.map(|e| e.id)).collect();
                if let Err(e) = api.release_claims(&left).await {
                    tracing::warn!(error = %e, "cannot release webhook claims; they expire");
                }
                return;
            }
            deliver(&*api, &client, &config, event).await;
        }
        if full {
            continue;
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// How long a round's claim lasts: one attempt at every URL for every event of a full round,
/// plus one timeout of margin. Another node takes an event over only after that.
fn claim_ms(config: &WebhookConfig) -> i64 {
    let attempts = config.urls.len() as u32 * BATCH + 1;
    config.timeout.saturating_mul(attempts).as_millis() as i64
}

async fn deliver(
    api: &dyn ApiStore,
    client: &reqwest::Client,
    config: &WebhookConfig,
    event: OutboxEvent,
) {
    let data: serde_json::Value =
        serde_json::from_str(&event.payload).unwrap_or(serde_json::Value::Null);
    let body = serde_json::json!({
        "id": event.event_id,
        "type": event.kind,
        "created_at": event.created_at,
        "data": data,
    })
    .to_string();
    let mut delivered = event.delivered_urls.clone();
    let mut errors = Vec::new();
    for url in &config.urls {
        if delivered.contains(url) {
            continue;
        }
        match post(client, config, url, &event, &body).await {
            Ok(()) => delivered.push(url.clone()),
            Err(e) => errors.push(format!("{url}: {e}")),
        }
    }
    let now = now_ms();
    let result = if errors.is_empty() {
        tracing::debug!(event = %event.event_id, kind = %event.kind, "event delivered");
        api.event_delivered(event.id, event.revision, now).await
    } else {
        let error = errors.join("; ");
        let attempts = event.attempts + 1;
        if attempts >= i64::from(config.max_attempts) {
            tracing::warn!(event = %event.event_id, %error, "event dead after {attempts} attempts");
            api.event_dead(event.id, event.revision, &error, now).await
        } else {
            let wait = backoff(
                config.backoff,
                attempts,
                rand::rng().random_range(0.75..1.25),
            );
            tracing::debug!(event = %event.event_id, %error, ?wait, "delivery failed; will retry");
            api.event_failed(
                event.id,
                event.revision,
                &delivered,
                now + wait.as_millis() as i64,
                &error,
            )
            .await
        }
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "cannot record a delivery outcome; it will be retried");
    }
}

/// Delay before attempt `attempts + 1`: `base * 2^(attempts-1) * jitter`, capped.
pub fn backoff(base: Duration, attempts: i64, jitter: f64) -> Duration {
    let exp = attempts.clamp(1, 30) - 1;
    let raw = base.as_secs_f64() * 2f64.powi(exp as i32) * jitter;
    Duration::from_secs_f64(raw.min(MAX_BACKOFF.as_secs_f64()))
}

/// The `Quire-Signature` header value for `body` at time `t` (seconds).
pub fn signature(secret: &str, t: i64, body: &str) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.as_bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(), // HMAC takes keys of any length
    };
    mac.update(format!("{t}.{body}").as_bytes());
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={t},v1={hex}")
}

async fn post(
    client: &reqwest::Client,
    config: &WebhookConfig,
    url: &str,
    event: &OutboxEvent,
    body: &str,
) -> Result<(), String> {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", &event.event_id)
        .header("quire-event-id", &event.event_id)
        .header("quire-event-type", &event.kind)
        .body(body.to_owned());
    if let Some(secret) = &config.secret {
        req = req.header(
            "quire-signature",
            signature(secret.expose(), now_ms() / 1000, body),
        );
    }
    let resp = req.send().await.map_err(|e| e.to_string())?;
    if resp.status().is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}", resp.status().as_u16()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_a_cap() {
        let base = Duration::from_secs(1);
        assert_eq!(backoff(base, 1, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(base, 3, 1.0), Duration::from_secs(4));
        assert_eq!(backoff(base, 3, 0.75), Duration::from_secs(3));
        assert_eq!(backoff(base, 40, 1.0), MAX_BACKOFF);
    }

    #[test]
    fn signatures_are_hmac_sha256_over_time_and_body() {
        // Computed independently with openssl:
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac secret
        let sig = signature("secret", 1_700_000_000, r#"{"a":1}"#);
        assert_eq!(
            sig,
            "t=1700000000,v1=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686"
        );
        assert_ne!(sig, signature("other", 1_700_000_000, r#"{"a":1}"#));
    }
}
