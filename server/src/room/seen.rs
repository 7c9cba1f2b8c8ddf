//! Which role changes (`crate::changes`) this node has acted on, kept with the rooms'
//! registry so that each is acted on once, whichever way it arrives first.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Which role changes this node has acted on: every id up to `upto` (the rows the watcher
/// has read), and the later ones it acted on as they were announced.
#[derive(Debug, Default)]
pub struct Seen {
    inner: Mutex<SeenInner>,
}

#[derive(Debug, Default)]
struct SeenInner {
    upto: i64,
    ahead: BTreeSet<i64>,
}

impl Seen {
    fn lock(&self) -> std::sync::MutexGuard<'_, SeenInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True the first time `id` is offered (from the bus or the node's own API).
    pub fn first(&self, id: i64) -> bool {
        let mut seen = self.lock();
        id > seen.upto && seen.ahead.insert(id)
    }

    /// The watcher read row `id` (rows come in id order): true if nothing acted on it yet.
    pub(crate) fn reached(&self, id: i64) -> bool {
        let mut seen = self.lock();
        seen.upto = seen.upto.max(id);
        let acted = seen.ahead.remove(&id);
        // Announcements of rows the watcher has now passed can no longer be told apart.
        let upto = seen.upto;
        seen.ahead.retain(|&later| later > upto);
        !acted
    }

    /// Where the watcher starts (the newest row at start-up).
    pub(crate) fn start_at(&self, id: i64) {
        self.lock().upto = id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_change_is_acted_on_once_whichever_way_it_arrives_first() {
        let seen = Seen::default();
        seen.start_at(10);
        // Older than where the watcher started: never acted on.
        assert!(!seen.first(9));
        // Announced first, then read by the watcher: acted on once.
        assert!(seen.first(12));
        assert!(!seen.first(12));
        assert!(!seen.reached(12));
        // Read by the watcher first: a later announcement is a duplicate.
        assert!(seen.reached(13));
        assert!(!seen.first(13));
        // An announcement the watcher has passed without reading (it was older): dropped.
        assert!(seen.first(15));
        assert!(seen.reached(16));
        assert!(!seen.first(15));
        assert!(!seen.first(14));
    }
}
