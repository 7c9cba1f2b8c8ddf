//! The replay guard of forwarded requests: an owner admits each forwarded request's nonce
//! once, only within [`FORWARD_MAX_AGE`] of its send time, and only if it was sent after this
//! process started (the nonces seen are in memory: without that, a restarted owner would
//! admit again a request captured in the window before its restart).

/// Oldest (and furthest in the future, for clocks apart) a forwarded request may be when it
/// arrives: past it the owner drops it. Nodes' clocks must agree within this.
pub const FORWARD_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30);

/// Most nonces remembered: a node that has seen this many within [`FORWARD_MAX_AGE`] refuses
/// further forwarded requests (answered 503 at once) until the oldest age out.
const MAX_NONCES: usize = 1 << 16;

/// The nonces seen, and when, oldest first.
type Seen = (
    std::collections::HashSet<String>,
    std::collections::VecDeque<(i64, String)>,
);

/// The nonces of the forwarded requests served within [`FORWARD_MAX_AGE`], oldest first.
#[derive(Default)]
pub struct ReplayGuard {
    seen: std::sync::Mutex<Seen>,
    /// When this process started (ms since the epoch): requests sent before are refused.
    started_ms: i64,
}

/// Why a forwarded request was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Sent longer ago than [`FORWARD_MAX_AGE`] (or that far ahead).
    Stale,
    /// Its nonce was seen.
    Seen,
    /// The guard is full of nonces still within the window.
    Full,
    /// Sent before this process started.
    BeforeStart,
}

impl Replay {
    /// The metric label and the refusal's reason.
    pub fn why(self) -> &'static str {
        match self {
            Replay::Stale => "stale",
            Replay::Seen => "seen",
            Replay::Full => "full",
            Replay::BeforeStart => "before_start",
        }
    }
}

impl ReplayGuard {
    /// A guard for a process started at `started_ms`.
    pub fn new(started_ms: i64) -> ReplayGuard {
        ReplayGuard {
            seen: std::sync::Mutex::default(),
            started_ms,
        }
    }

    /// Admits a request sent at `sent_at_ms` with `nonce`, at `now_ms`, once.
    pub fn admit(&self, nonce: &str, sent_at_ms: i64, now_ms: i64) -> Result<(), Replay> {
        let window = FORWARD_MAX_AGE.as_millis() as i64;
        if nonce.is_empty() || (now_ms - sent_at_ms).abs() > window {
            return Err(Replay::Stale);
        }
        if sent_at_ms < self.started_ms {
            return Err(Replay::BeforeStart);
        }
        let mut guard = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (set, order) = &mut *guard;
        // A nonce stays until its request could no longer be admitted anyway.
        while order
            .front()
            .is_some_and(|(at, _)| now_ms - at > window * 2)
        {
            if let Some((_, old)) = order.pop_front() {
                set.remove(&old);
            }
        }
        if set.contains(nonce) {
            return Err(Replay::Seen);
        }
        if set.len() >= MAX_NONCES {
            return Err(Replay::Full);
        }
        set.insert(nonce.to_owned());
        order.push_back((now_ms, nonce.to_owned()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_admitted_once_and_only_within_the_window() {
        let guard = ReplayGuard::default();
        let now = 1_000_000;
        let window = FORWARD_MAX_AGE.as_millis() as i64;
        assert_eq!(guard.admit("a", now, now), Ok(()));
        assert_eq!(guard.admit("a", now, now + 1), Err(Replay::Seen));
        assert_eq!(guard.admit("b", now - window - 1, now), Err(Replay::Stale));
        assert_eq!(guard.admit("c", now + window + 1, now), Err(Replay::Stale));
        assert_eq!(guard.admit("", now, now), Err(Replay::Stale));
        // Long after, "a" is forgotten: and it could not pass the age check anyway.
        let later = now + 3 * window;
        assert_eq!(guard.admit("a", now, later), Err(Replay::Stale));
        assert_eq!(guard.admit("d", later, later), Ok(()));
        let seen = guard.seen.lock().expect("lock");
        assert_eq!(seen.0.len(), 1, "old nonces are dropped");
    }

    #[test]
    fn a_restarted_owner_refuses_what_was_sent_before_it_started() {
        let now = 1_000_000;
        // Captured and served by the owner's previous process, 5 s before its restart.
        let before = ReplayGuard::new(now - 60_000);
        assert_eq!(before.admit("captured", now - 5_000, now - 5_000), Ok(()));
        let restarted = ReplayGuard::new(now);
        assert_eq!(
            restarted.admit("captured", now - 5_000, now + 1),
            Err(Replay::BeforeStart)
        );
        assert_eq!(restarted.admit("fresh", now + 1, now + 2), Ok(()));
    }

    #[test]
    fn a_full_guard_refuses_and_takes_requests_again_as_nonces_age_out() {
        let guard = ReplayGuard::default();
        let now = 1_000_000;
        for i in 0..MAX_NONCES {
            assert_eq!(guard.admit(&format!("n{i}"), now, now), Ok(()));
        }
        assert_eq!(guard.admit("one more", now, now), Err(Replay::Full));
        let window = FORWARD_MAX_AGE.as_millis() as i64;
        let later = now + 2 * window + 1;
        assert_eq!(guard.admit("one more", later, later), Ok(()));
    }
}
