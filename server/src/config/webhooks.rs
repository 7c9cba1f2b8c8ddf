//! Webhooks: where events go, signed how, retried how often.

use super::*;

layered! {
    /// Webhooks: where events go, signed how, retried how often.
    pub struct WebhookSettings {
        /// Webhook URLs that receive events; repeat or separate with commas [default: none]
        #[arg(
            long = "webhook-url",
            env = "QUIRE_WEBHOOK_URLS",
            value_delimiter = ','
        )]
        pub webhook_urls: Option<Vec<String>>,
        /// Secret for the webhook signature header [default: none, unsigned]
        #[arg(long, env = "QUIRE_WEBHOOK_SECRET")]
        pub webhook_secret: Option<Secret>,
        /// Delivery attempts before an event moves to the dead-letter table [default: 8]
        #[arg(long, env = "QUIRE_WEBHOOK_MAX_ATTEMPTS")]
        pub webhook_max_attempts: Option<u32>,
        /// At most one document.updated event per document per this interval [default: 10s]
        #[arg(long, env = "QUIRE_WEBHOOK_DEBOUNCE")]
        pub webhook_debounce: Option<HumanDuration>,
        /// First retry delay; doubles per attempt, with jitter [default: 1s]
        #[arg(long, env = "QUIRE_WEBHOOK_BACKOFF")]
        pub webhook_backoff: Option<HumanDuration>,
        /// Time allowed for one webhook POST [default: 10s]
        #[arg(long, env = "QUIRE_WEBHOOK_TIMEOUT")]
        pub webhook_timeout: Option<HumanDuration>,
    }
}

/// Where and how events are delivered.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub urls: Vec<String>,
    pub secret: Option<Secret>,
    pub max_attempts: u32,
    pub debounce: Duration,
    pub backoff: Duration,
    /// Time allowed for one POST; an event's claim lasts long enough for one attempt at
    /// every URL.
    pub timeout: Duration,
}

impl WebhookSettings {
    pub(super) fn resolve(&self) -> WebhookConfig {
        let d = or_default;
        WebhookConfig {
            urls: self.webhook_urls.clone().unwrap_or_default(),
            secret: self.webhook_secret.clone(),
            max_attempts: self.webhook_max_attempts.unwrap_or(8).max(1),
            debounce: d(self.webhook_debounce, Duration::from_secs(10)),
            backoff: d(self.webhook_backoff, Duration::from_secs(1)),
            timeout: d(self.webhook_timeout, Duration::from_secs(10)),
        }
    }
}
