//! The group-commit window of both stores' writers: how long to hold a commit open for other
//! documents' writes, from the load the writers have seen.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::storage::DocId;

/// A writer's group-commit window (SQLite's writer; PostgreSQL's writers share one): when
/// writes of other documents are expected soon (judged from the recent rate of writes and how
/// many documents made them), the writer holds a commit open until `siblings` of them are
/// expected (those already waiting count), at most `delay`, so they share the transaction and
/// its fsync (on PostgreSQL also its statement). It does not wait when not even one is
/// expected within `delay`; a busy document never waits for itself (its next write cannot come
/// before this commit answers; the others' rate leaves out the busiest document's), nor does a
/// quiet store. The busier the store, the shorter the wait: at 800 writes/s over
/// 200 documents the default holds a commit 10 ms, at 4,000 writes/s 2 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitWindowSettings {
    pub delay: Duration,
    pub siblings: u32,
}

impl Default for CommitWindowSettings {
    fn default() -> Self {
        CommitWindowSettings {
            delay: Duration::from_millis(10),
            siblings: 8,
        }
    }
}

/// How often the writer measures its load for the group-commit window.
const LOAD_PERIOD: Duration = Duration::from_millis(100);

/// The writer's recent load, from which it decides whether to hold a commit open for other
/// documents' writes ([`CommitWindowSettings`]). Pure bookkeeping over the instants it is
/// given, so the rule is tested without a clock.
pub(crate) struct CommitWindow {
    settings: CommitWindowSettings,
    /// Start of the period being counted and its requests by document.
    since: Instant,
    requests: HashMap<DocId, u32>,
    /// The last complete period's requests per second, leaving out its busiest document's.
    others_rate: f64,
}

impl CommitWindow {
    pub(crate) fn new(settings: CommitWindowSettings, now: Instant) -> CommitWindow {
        CommitWindow {
            settings,
            since: now,
            requests: HashMap::new(),
            others_rate: 0.0,
        }
    }

    /// Counts the requests of a batch about to commit.
    pub(crate) fn record(&mut self, now: Instant, docs: impl Iterator<Item = DocId>) {
        for doc in docs {
            *self.requests.entry(doc).or_default() += 1;
        }
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= LOAD_PERIOD {
            self.others_rate = others_rate(&self.requests, elapsed);
            self.since = now;
            self.requests.clear();
        }
    }

    /// How long to hold the commit of a batch whose first request arrived at `now`, with
    /// `queued` more requests already waiting: until `siblings` writes of documents other
    /// than one in flight are expected (those waiting count), at most the delay; not at all
    /// if fewer than one is expected within the delay. Each document has one write in flight
    /// at a time, so a write's own document cannot add to the batch: only the others can. The
    /// rate of the others leaves out the busiest document's, so a busy document beside quiet
    /// ones (a bulk import) is not held for writes that will not come.
    pub(crate) fn wait(&self, now: Instant, queued: usize) -> Option<Duration> {
        let delay = self.settings.delay;
        if delay.is_zero() {
            return None;
        }
        let missing = (self.settings.siblings.max(1) as usize).checked_sub(queued)?;
        if missing == 0 {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.since);
        // After a quiet spell the last period's rate is stale: judge by what came since.
        let others = if elapsed >= LOAD_PERIOD {
            others_rate(&self.requests, elapsed)
        } else {
            self.others_rate
        };
        if others * delay.as_secs_f64() < 1.0 {
            return None;
        }
        let wanted = missing as f64 / others;
        Some(Duration::from_secs_f64(wanted).min(delay))
    }
}

/// Requests per second over `elapsed`, but for the busiest document's.
fn others_rate(requests: &HashMap<DocId, u32>, elapsed: Duration) -> f64 {
    let all: u32 = requests.values().sum();
    let busiest = requests.values().copied().max().unwrap_or(0);
    f64::from(all - busiest) / elapsed.as_secs_f64()
}

#[cfg(test)]
pub(crate) mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::storage::sql_api::EventSettings;
    use crate::storage::sqlite::SqliteStore;
    use crate::storage::DocStore;
    use sqlx::sqlite::SqliteSynchronous;

    fn window(delay_ms: u64, siblings: u32) -> CommitWindowSettings {
        CommitWindowSettings {
            delay: Duration::from_millis(delay_ms),
            siblings,
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// `per_period` requests spread over the documents `docs`, recorded in ten batches over
    /// one load period from `t0`.
    fn busy(w: &mut CommitWindow, t0: Instant, docs: std::ops::Range<DocId>, per_period: usize) {
        let all: Vec<DocId> = docs.cycle().take(per_period).collect();
        for (i, chunk) in all.chunks(per_period.div_ceil(10)).enumerate() {
            w.record(t0 + 10 * MS * (i as u32 + 1), chunk.iter().copied());
        }
    }

    /// `wait`'s answer in whole microseconds (the rates are measured, so not exact).
    fn wait_us(w: &CommitWindow, at: Instant) -> Option<u128> {
        w.wait(at, 0).map(|d| d.as_micros())
    }

    #[test]
    fn the_window_waits_for_the_siblings_expected_at_most_the_delay() {
        let t0 = Instant::now();
        // Before a full period has been measured: commit at once.
        let w = CommitWindow::new(window(10, 8), t0);
        assert_eq!(w.wait(t0 + 5 * MS, 0), None);

        // 4,000 writes/s from 200 documents: eight others are expected within about 2 ms.
        let mut w = CommitWindow::new(window(10, 8), t0);
        busy(&mut w, t0, 1..201, 400);
        assert_eq!(wait_us(&w, t0 + 101 * MS), Some(2010));
        // 800 writes/s: eight would take 10.05 ms, so the delay caps the wait.
        let mut w = CommitWindow::new(window(10, 8), t0);
        busy(&mut w, t0, 1..201, 80);
        assert_eq!(w.wait(t0 + 101 * MS, 0), Some(10 * MS));
        // 50 writes/s: not even one expected within 10 ms, so no wait at all.
        let mut w = CommitWindow::new(window(10, 8), t0);
        busy(&mut w, t0, 1..201, 5);
        assert_eq!(w.wait(t0 + 101 * MS, 0), None);
        // ... unless the window is wider.
        let mut w = CommitWindow::new(window(30, 8), t0);
        busy(&mut w, t0, 1..201, 5);
        assert_eq!(w.wait(t0 + 101 * MS, 0), Some(30 * MS));
        // Two documents at 3,000 writes/s: only the other one can join, 1,500 a second.
        let mut w = CommitWindow::new(window(10, 8), t0);
        busy(&mut w, t0, 1..3, 300);
        assert_eq!(wait_us(&w, t0 + 101 * MS), Some(5333));
    }

    #[test]
    fn writes_already_waiting_count_and_a_busy_document_beside_quiet_ones_is_not_held() {
        let t0 = Instant::now();
        // 4,000 writes/s from 200 documents: with three others already queued, five more are
        // awaited (1.26 ms); with eight queued, none.
        let mut w = CommitWindow::new(window(10, 8), t0);
        busy(&mut w, t0, 1..201, 400);
        assert_eq!(w.wait(t0 + 101 * MS, 3).map(|d| d.as_micros()), Some(1256));
        assert_eq!(w.wait(t0 + 101 * MS, 8), None);
        // A bulk import at 1,000 writes/s beside a document writing 10 times a second: the
        // others' rate is the quiet one's, not half the total, so the import is not held.
        let mut w = CommitWindow::new(window(10, 8), t0);
        let mut docs = vec![1; 100];
        docs.push(2);
        for (i, chunk) in docs.chunks(11).enumerate() {
            w.record(t0 + 10 * MS * (i as u32 + 1), chunk.iter().copied());
        }
        assert_eq!(w.wait(t0 + 101 * MS, 0), None);
    }

    #[test]
    fn a_lone_document_a_quiet_store_and_a_zero_delay_never_wait() {
        let t0 = Instant::now();
        // One document at 10,000 writes/s: its next write cannot come before this commit.
        let mut w = CommitWindow::new(window(10, 1), t0);
        busy(&mut w, t0, 7..8, 1000);
        assert_eq!(w.wait(t0 + 101 * MS, 0), None);
        // A busy store that went quiet: the last period's rate is stale.
        let mut w = CommitWindow::new(window(10, 8), t0);
        busy(&mut w, t0, 1..201, 400);
        assert_eq!(wait_us(&w, t0 + 101 * MS), Some(2010));
        assert_eq!(w.wait(t0 + 1300 * MS, 0), None);
        // Delay 0 turns the window off.
        let mut w = CommitWindow::new(window(0, 8), t0);
        busy(&mut w, t0, 1..201, 400);
        assert_eq!(w.wait(t0 + 101 * MS, 0), None);
    }

    /// Appends to `doc` one after another until `until`; how long each took (both stores'
    /// writers are tested with it).
    pub(crate) async fn append_until(
        store: &dyn DocStore,
        doc: DocId,
        until: Instant,
    ) -> Vec<Duration> {
        let mut took = Vec::new();
        let mut seq = 1;
        while Instant::now() < until {
            let t = Instant::now();
            store
                .append(doc, None, seq, vec![Bytes::from_static(b"u")])
                .await
                .expect("append");
            took.push(t.elapsed());
            seq += 1;
        }
        took
    }

    async fn store_with(dir: &tempfile::TempDir, w: CommitWindowSettings) -> SqliteStore {
        let url = format!("sqlite://{}/q.db", dir.path().display());
        SqliteStore::connect_with_events(
            &url,
            SqliteSynchronous::Normal,
            EventSettings::default(),
            w,
        )
        .await
        .expect("open")
    }

    #[tokio::test]
    async fn a_busy_store_holds_its_commits_open_for_other_documents() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Siblings far beyond what four documents can send: every wait is the whole delay.
        let store = store_with(&dir, window(200, 1000)).await;
        let mut docs = Vec::new();
        for name in ["a", "b", "c", "d"] {
            docs.push(store.load(name).await.expect("load").id);
        }
        let until = Instant::now() + 1200 * MS;
        let took =
            futures_util::future::join_all(docs.iter().map(|d| append_until(&store, *d, until)))
                .await;
        // The first period (100 ms) runs unheld; once the writer has seen four documents
        // writing, each commit waits 200 ms for the others.
        for t in &took {
            let last = t.last().copied().unwrap_or_default();
            assert!(last >= 150 * MS, "the last append took {last:?}: {t:?}");
        }
        let requests: usize = took.iter().map(Vec::len).sum();
        assert!(
            store.transactions() < requests as u64,
            "some commits were shared"
        );
    }

    #[tokio::test]
    async fn a_lone_busy_document_is_never_held() {
        let dir = tempfile::tempdir().expect("temp dir");
        // The most eager window: any expected sibling would hold the commit for 10 s.
        let store = store_with(&dir, window(10_000, 0)).await;
        let doc = store.load("alone").await.expect("load").id;
        let took = append_until(&store, doc, Instant::now() + 400 * MS).await;
        let slowest = took.iter().max().copied().unwrap_or_default();
        assert!(took.len() > 10, "{took:?}");
        assert!(slowest < 5000 * MS, "an append was held for {slowest:?}");
        assert_eq!(
            store.transactions(),
            took.len() as u64,
            "one commit per append"
        );
    }
}
