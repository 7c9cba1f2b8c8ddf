//! The replay guard of forwarded requests: an owner admits each forwarded request's nonce
//! once, and only within [`FORWARD_MAX_AGE`] of its send time.

/// Oldest (and furthest in the future, for clocks apart) a forwarded request may be when it
/// arrives: past it the owner drops it. Nodes' clocks must agree within this.
pub const FORWARD_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30);

/// Most nonces remembered: a node that has seen this many within [`FORWARD_MAX_AGE`] drops
/// further forwarded requests (the sender answers 503) until the oldest age out.
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
}

impl ReplayGuard {
    /// Admits a request sent at `sent_at_ms` with `nonce`, at `now_ms`, once.
    pub fn admit(&self, nonce: &str, sent_at_ms: i64, now_ms: i64) -> Result<(), Replay> {
        let window = FORWARD_MAX_AGE.as_millis() as i64;
        if nonce.is_empty() || (now_ms - sent_at_ms).abs() > window {
            return Err(Replay::Stale);
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
}
