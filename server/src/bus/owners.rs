//! Who owns the documents this node relays connections to (`crate::socket::relay`): the
//! owners read from the leases for all of them at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::debug;

use super::ALIVE_EVERY;
use crate::storage::DocId;

/// The owners of the documents this node relays connections to, read for all of them with
/// one statement every [`ALIVE_EVERY`] (not one per relayed connection), so a thousand
/// relayed connections cost this node one lease statement a second.
#[derive(Default)]
pub struct LeaseWatch {
    docs: Mutex<HashMap<DocId, Watched>>,
}

/// One watched document.
#[derive(Default)]
struct Watched {
    /// Relayed connections watching it.
    count: usize,
    /// Its owner as last read: `None` until read (again), `Some(None)`: no unexpired lease.
    owner: Option<Option<String>>,
    /// Bumped when a new connection found another owner than the one last read: a read
    /// begun before that is not taken.
    resets: u64,
}

impl LeaseWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<DocId, Watched>> {
        self.docs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One more relayed connection to `doc`, whose owner it found to be `owner`. An owner
    /// read before that (for the other connections) may be out of date: it is read again
    /// before this connection is judged by it.
    fn watch(&self, doc: DocId, owner: &str) {
        let mut docs = self.lock();
        let entry = docs.entry(doc).or_default();
        entry.count += 1;
        if entry
            .owner
            .as_ref()
            .is_some_and(|read| read.as_deref() != Some(owner))
        {
            entry.owner = None;
            entry.resets += 1;
        }
    }

    fn unwatch(&self, doc: DocId) {
        let mut docs = self.lock();
        if let Some(entry) = docs.get_mut(&doc) {
            entry.count -= 1;
            if entry.count == 0 {
                docs.remove(&doc);
            }
        }
    }

    /// The document's owner as last read (`None`: not read yet).
    pub(crate) fn owner(&self, doc: DocId) -> Option<Option<String>> {
        self.lock().get(&doc).and_then(|entry| entry.owner.clone())
    }

    /// The documents to read the owners of, each with its reset count as the read begins.
    fn begin_read(&self) -> HashMap<DocId, u64> {
        self.lock()
            .iter()
            .map(|(doc, entry)| (*doc, entry.resets))
            .collect()
    }

    /// Takes what a read begun with `asked` found: for each document still watched and not
    /// reset since, its owner (`owners` lists the unexpired leases).
    fn finish_read(&self, asked: &HashMap<DocId, u64>, owners: &HashMap<DocId, String>) {
        for (doc, entry) in self.lock().iter_mut() {
            if asked.get(doc) == Some(&entry.resets) {
                entry.owner = Some(owners.get(doc).cloned());
            }
        }
    }

    /// Reads the owners of every watched document every [`ALIVE_EVERY`] until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        store: Arc<dyn crate::storage::DocStore>,
        metrics: Arc<crate::metrics::Metrics>,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(ALIVE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let asked = self.begin_read();
            if asked.is_empty() {
                continue;
            }
            let docs: Vec<DocId> = asked.keys().copied().collect();
            metrics.relay_lease_checks.inc();
            match store.lease_owners(&docs).await {
                Ok(owners) => self.finish_read(&asked, &owners.into_iter().collect()),
                Err(e) => debug!(error = %e, "lease check failed; still relaying"),
            }
        }
    }
}

/// A relayed connection's interest in its document's owner, dropped with the connection
/// (its future included, at shutdown).
pub(crate) struct Watching<'a> {
    leases: &'a LeaseWatch,
    doc: DocId,
}

impl<'a> Watching<'a> {
    pub(crate) fn new(leases: &'a LeaseWatch, doc: DocId, owner: &str) -> Watching<'a> {
        leases.watch(doc, owner);
        Watching { leases, doc }
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        self.leases.unwatch(self.doc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_begun_before_a_connection_found_a_new_owner_is_not_taken() {
        let watch = LeaseWatch::default();
        let owners = |o: &str| HashMap::from([(7, o.to_owned())]);
        watch.watch(7, "a");
        let asked = watch.begin_read();
        watch.finish_read(&asked, &owners("a"));
        assert_eq!(watch.owner(7), Some(Some("a".into())));
        // A read begins; meanwhile the lease moved and a new connection found owner b.
        let asked = watch.begin_read();
        watch.watch(7, "b");
        assert_eq!(watch.owner(7), None, "unknown until read again");
        watch.finish_read(&asked, &owners("a"));
        assert_eq!(watch.owner(7), None, "the older read is not taken");
        let asked = watch.begin_read();
        watch.finish_read(&asked, &owners("b"));
        assert_eq!(watch.owner(7), Some(Some("b".into())));
        // No lease at all: known to be nobody's.
        let asked = watch.begin_read();
        watch.finish_read(&asked, &HashMap::new());
        assert_eq!(watch.owner(7), Some(None));
        watch.unwatch(7);
        watch.unwatch(7);
        assert!(
            watch.begin_read().is_empty(),
            "forgotten with its last connection"
        );
    }
}
