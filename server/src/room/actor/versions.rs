//! Automatic versions (docs/history.md): the room, which alone knows when editing stops, records
//! a version at the end of each editing session (no commit for `version_idle`), at least every
//! `version_every` during a long one, and before it unloads. A version is the whole document
//! (v2) at the last committed position, taken only when nothing is uncommitted, so it is
//! exactly the content of the log up to that position.

use std::sync::Arc;

use tokio::time::{Duration, Instant};
use tracing::warn;
use yrs::{ReadTxn, Transact};

use super::commit::within;
use super::Room;
use crate::storage::history::{NewVersion, VersionKind};

/// Commits since the last version: when editing started and last happened, and who edited last.
#[derive(Debug, Default)]
pub(super) struct VersionClock {
    /// The first commit since the last version; `None`: nothing to version.
    dirty_since: Option<Instant>,
    last_edit: Option<Instant>,
    last_author: Option<Arc<str>>,
    /// Not before this: the room was busy committing when the version fell due.
    not_before: Option<Instant>,
}

impl VersionClock {
    /// A commit at `now` by `author`.
    pub(super) fn edited(&mut self, now: Instant, author: Option<Arc<str>>) {
        self.dirty_since.get_or_insert(now);
        self.last_edit = Some(now);
        if author.is_some() {
            self.last_author = author;
        }
    }

    /// When the next automatic version is due: `idle` after the last edit, or `every` after
    /// the first edit since the last version, whichever comes first.
    pub(super) fn due_at(&self, idle: Duration, every: Duration) -> Option<Instant> {
        let since = self.dirty_since?;
        let last = self.last_edit.unwrap_or(since);
        let due = (last + idle).min(since + every);
        Some(self.not_before.map_or(due, |t| t.max(due)))
    }

    fn taken(&mut self) -> Option<Arc<str>> {
        self.dirty_since = None;
        self.last_edit = None;
        self.not_before = None;
        self.last_author.take()
    }
}

impl Room {
    /// When the next automatic version is due (`None`: no history kept, or nothing edited).
    pub(super) fn version_due_at(&self) -> Option<Instant> {
        let h = &self.registry.config.history;
        if !h.enabled() {
            return None;
        }
        self.versions.due_at(h.version_idle, h.version_every)
    }

    /// The version is due: taken now if everything applied is committed, else a little later
    /// (a commit in flight ends soon and is in the version then).
    pub(super) fn on_version_due(&mut self) {
        let idle = self.registry.config.history.version_idle;
        if self.has_uncommitted()
            || !self.pipeline.queued.is_empty()
            || self.pipeline.inflight.is_some()
        {
            // Looked at again shortly (commits take milliseconds), but not so often that a
            // room stalled on storage wakes up for nothing.
            let retry = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
            self.versions.not_before = Some(Instant::now() + retry);
            return;
        }
        let Some(version) = self.take_version() else {
            // Not encodable now (an update waits for missing dependencies): tried again after
            // another idle spell, never in a loop.
            self.versions.not_before = Some(Instant::now() + idle);
            return;
        };
        let store = self.registry.store.clone();
        let metrics = self.registry.metrics.clone();
        let limit = self.registry.config.storage_timeout;
        tokio::spawn(async move {
            match within(limit, &metrics, "version", store.add_version(version)).await {
                Ok(_) => metrics.versions_created.inc(),
                Err(e) => warn!(error = %e, "automatic version not recorded"),
            }
        });
    }

    /// The version of what the room holds now (committed), `None` if it cannot be encoded.
    fn take_version(&mut self) -> Option<NewVersion> {
        if self.doc.transact().has_missing_updates() {
            return None; // see `spawn_snapshot`: yrs may panic encoding it
        }
        let doc = &self.doc;
        let state = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::protocol::state::encode_state_v2(&doc.transact())
        }))
        .ok()?;
        let author = self.versions.taken();
        Some(NewVersion {
            doc: self.doc_id,
            seq: self.last_seq,
            kind: VersionKind::Auto,
            label: None,
            author: author.map(|a| a.to_string()),
            state,
            created_at: crate::storage::now_ms(),
        })
    }

    /// Before unloading or shutting down, with everything committed: the session's version.
    pub(super) async fn final_version(&mut self) {
        if !self.registry.config.history.enabled()
            || self.versions.dirty_since.is_none()
            || self.has_uncommitted()
        {
            return;
        }
        if let Some(version) = self.take_version() {
            let limit = self.registry.config.storage_timeout;
            let metrics = self.registry.metrics.clone();
            let added = within(
                limit,
                &metrics,
                "version",
                self.registry.store.add_version(version),
            )
            .await;
            match added {
                Ok(_) => metrics.versions_created.inc(),
                Err(e) => warn!(error = %e, "final automatic version not recorded"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_due_after_an_idle_spell_or_every_so_often() {
        let idle = Duration::from_secs(300);
        let every = Duration::from_secs(3600);
        let t0 = Instant::now();
        let mut clock = VersionClock::default();
        assert_eq!(clock.due_at(idle, every), None, "nothing edited");
        clock.edited(t0, Some("ann".into()));
        assert_eq!(clock.due_at(idle, every), Some(t0 + idle));
        // Editing goes on: the idle deadline moves, the hourly one does not.
        let mut t = t0;
        for _ in 0..20 {
            t += Duration::from_secs(240);
            clock.edited(t, None);
        }
        assert_eq!(clock.due_at(idle, every), Some(t0 + every));
        assert_eq!(
            clock.taken().as_deref(),
            Some("ann"),
            "the last named author"
        );
        assert_eq!(clock.due_at(idle, every), None);
    }
}
