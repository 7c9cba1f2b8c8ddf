//! One sample of the server's figures per tick: rates from the counters' growth since the
//! previous tick, commit latency quantiles from the histogram's growth, gauges as they are,
//! and the busiest rooms with their own rates. Pure but for the metrics it reads: time and the
//! process's memory are passed in, so tests drive it tick by tick.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::core::Metric;
use serde::Serialize;

use crate::metrics::Metrics;
use crate::room::stats::{RoomFigures, RoomStats};
use crate::room::DocName;

/// The server's figures over one tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Sample {
    /// When the tick ended (ms since the epoch).
    pub t: i64,
    /// Updates committed, and update deliveries queued to connections, per second.
    pub updates_in: f64,
    pub updates_out: f64,
    /// Log appends committed per second, and their latency (ms) over the tick: `None` when
    /// nothing committed.
    pub commits: f64,
    pub commit_p50_ms: Option<f64>,
    pub commit_p99_ms: Option<f64>,
    /// WebSocket connections (both protocols) and rooms loaded, at the tick's end.
    pub connections: i64,
    pub rooms: i64,
    /// The process's resident memory (`None` where the system does not tell).
    pub memory_bytes: Option<u64>,
}

/// A loaded room in a tick.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveRoom {
    pub name: String,
    pub peers: u64,
    /// Per second over the tick.
    pub updates_in: f64,
    pub updates_out: f64,
    pub stored_bytes: u64,
    pub log_rows: u64,
    /// ms since the epoch; 0: not since the room loaded.
    pub last_commit: i64,
    pub last_snapshot: i64,
    pub loaded_at: i64,
    /// The lease epoch its writes carry (0: no leases).
    pub epoch: i64,
}

impl LiveRoom {
    /// Room `name` with its figures `f` and its rates over a tick.
    pub fn new(name: &str, f: &RoomFigures, updates_in: f64, updates_out: f64) -> LiveRoom {
        LiveRoom {
            name: name.to_owned(),
            peers: f.peers,
            updates_in,
            updates_out,
            stored_bytes: f.stored_bytes,
            log_rows: f.log_rows,
            last_commit: f.last_commit,
            last_snapshot: f.last_snapshot,
            loaded_at: f.loaded_at,
            epoch: f.epoch,
        }
    }
}

/// A sample and the busiest rooms ([`super::LIVE_ROOMS`] of `rooms_total`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tick {
    pub sample: Sample,
    pub rooms: Vec<LiveRoom>,
    pub rooms_total: usize,
}

/// The counters as the previous tick left them.
pub struct Sampler {
    at: i64,
    updates_in: u64,
    updates_out: u64,
    commits: u64,
    buckets: Vec<u64>,
    rooms: HashMap<DocName, (i64, u64, u64)>,
}

impl Sampler {
    pub fn new(metrics: &Metrics, now: i64) -> Sampler {
        Sampler {
            at: now,
            updates_in: metrics.updates_logged.get(),
            updates_out: metrics.updates_sent.get(),
            commits: metrics.commits.get(),
            buckets: commit_buckets(metrics)
                .into_iter()
                .map(|(_, c)| c)
                .collect(),
            rooms: HashMap::new(),
        }
    }

    /// The tick that ends at `now`.
    pub fn sample(
        &mut self,
        metrics: &Metrics,
        rooms: &[(DocName, Arc<RoomStats>)],
        now: i64,
        memory_bytes: Option<u64>,
    ) -> Tick {
        let secs = (now - self.at).max(1) as f64 / 1000.0;
        let rate = |new: u64, old: u64| new.saturating_sub(old) as f64 / secs;
        let (updates_in, updates_out, commits) = (
            metrics.updates_logged.get(),
            metrics.updates_sent.get(),
            metrics.commits.get(),
        );
        let buckets = commit_buckets(metrics);
        let grown: Vec<(f64, u64)> = buckets
            .iter()
            .enumerate()
            .map(|(i, (le, c))| {
                (
                    *le,
                    c.saturating_sub(self.buckets.get(i).copied().unwrap_or(0)),
                )
            })
            .collect();
        let sample = Sample {
            t: now,
            updates_in: rate(updates_in, self.updates_in),
            updates_out: rate(updates_out, self.updates_out),
            commits: rate(commits, self.commits),
            commit_p50_ms: quantile(&grown, 0.5).map(|s| s * 1000.0),
            commit_p99_ms: quantile(&grown, 0.99).map(|s| s * 1000.0),
            connections: metrics.connections.get() + metrics.hocuspocus_sockets.get(),
            rooms: metrics.rooms_loaded.get(),
            memory_bytes,
        };
        self.at = now;
        self.updates_in = updates_in;
        self.updates_out = updates_out;
        self.commits = commits;
        self.buckets = buckets.into_iter().map(|(_, c)| c).collect();

        // A room seen for the first time counts from when it loaded (its counters start at 0
        // then), or from the previous tick if it loaded before that.
        let mut seen = HashMap::with_capacity(rooms.len());
        let mut live: Vec<LiveRoom> = rooms
            .iter()
            .map(|(name, stats)| (name, stats.read()))
            // A room still loading, or refusing joins after a failed load or for a document
            // another node serves, has not started.
            .filter(|(_, f)| f.loaded_at > 0)
            .map(|(name, f)| {
                let (since, old_in, old_out) = self.rooms.get(name).copied().unwrap_or((
                    f.loaded_at.max(now - (secs * 1000.0) as i64),
                    0,
                    0,
                ));
                let room_secs = (now - since).max(1) as f64 / 1000.0;
                seen.insert(name.clone(), (now, f.updates_in, f.updates_out));
                LiveRoom::new(
                    name.as_str(),
                    &f,
                    f.updates_in.saturating_sub(old_in) as f64 / room_secs,
                    f.updates_out.saturating_sub(old_out) as f64 / room_secs,
                )
            })
            .collect();
        self.rooms = seen;
        let rooms_total = live.len();
        live.sort_by(|a, b| {
            (b.updates_in + b.updates_out)
                .total_cmp(&(a.updates_in + a.updates_out))
                .then(b.peers.cmp(&a.peers))
                .then_with(|| a.name.cmp(&b.name))
        });
        live.truncate(super::LIVE_ROOMS);
        Tick {
            sample,
            rooms: live,
            rooms_total,
        }
    }
}

/// The commit histogram's buckets: (upper bound in seconds, cumulative count), the last one
/// `+Inf` with every observation.
fn commit_buckets(metrics: &Metrics) -> Vec<(f64, u64)> {
    let m = metrics.commit_seconds.metric();
    let h = m.get_histogram();
    let mut buckets: Vec<(f64, u64)> = h
        .get_bucket()
        .iter()
        .map(|b| (b.upper_bound(), b.cumulative_count()))
        .collect();
    buckets.push((f64::INFINITY, h.get_sample_count()));
    buckets
}

/// The `q` quantile of observations counted in cumulative `buckets` (upper bound, count),
/// interpolated linearly within its bucket as Prometheus's `histogram_quantile` does; above
/// the last bound, the last bound. `None` without observations.
pub fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for &(upper, count) in buckets {
        if count as f64 >= rank {
            if upper.is_infinite() {
                return Some(lower);
            }
            let inside = (count - below) as f64;
            let within = if inside > 0.0 {
                (rank - below as f64) / inside
            } else {
                1.0
            };
            return Some(lower + (upper - lower) * within);
        }
        lower = upper;
        below = count;
    }
    Some(lower)
}

/// The process's resident memory, from `/proc/self/status` (Linux); `None` elsewhere.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        // 10 under 1 ms, 80 between 1 and 2 ms, 10 between 2 and 5 ms.
        let b = [(0.001, 10), (0.002, 90), (0.005, 100)];
        assert_eq!(quantile(&b, 0.5), Some(0.001 + 0.001 * 0.5));
        let p99 = quantile(&b, 0.99).expect("p99");
        assert!((p99 - (0.002 + 0.003 * 0.9)).abs() < 1e-12, "{p99}");
        assert_eq!(quantile(&[(0.001, 0), (0.002, 0)], 0.5), None);
        // Above the last finite bound: that bound.
        let slow = [(0.001, 0), (0.002, 1), (f64::INFINITY, 10)];
        assert_eq!(quantile(&slow, 0.99), Some(0.002));
    }

    #[test]
    fn a_tick_reports_what_grew_since_the_last_one() {
        let metrics = Metrics::new();
        let mut sampler = Sampler::new(&metrics, 10_000);
        metrics.updates_logged.inc_by(50);
        metrics.updates_sent.inc_by(150);
        metrics.commits.inc_by(10);
        for _ in 0..10 {
            metrics.commit_seconds.observe(0.0015);
        }
        metrics.connections.set(3);
        metrics.hocuspocus_sockets.set(1);
        let busy = Arc::new(RoomStats::default());
        busy.loaded_at.store(5_000, Relaxed);
        busy.updates_in.store(40, Relaxed);
        busy.peers.store(3, Relaxed);
        let quiet = Arc::new(RoomStats::default());
        quiet.loaded_at.store(5_000, Relaxed);
        quiet.peers.store(1, Relaxed);
        // Still loading (or refusing joins): not listed.
        let loading = Arc::new(RoomStats::default());
        let rooms = vec![
            (DocName::parse("quiet").expect("name"), quiet),
            (DocName::parse("busy").expect("name"), busy.clone()),
            (DocName::parse("loading").expect("name"), loading),
        ];
        let tick = sampler.sample(&metrics, &rooms, 12_000, Some(1 << 20));
        assert_eq!(tick.sample.t, 12_000);
        assert_eq!(tick.sample.updates_in, 25.0);
        assert_eq!(tick.sample.updates_out, 75.0);
        assert_eq!(tick.sample.commits, 5.0);
        let p50 = tick.sample.commit_p50_ms.expect("commits observed");
        assert!((1.0..=2.0).contains(&p50), "{p50}");
        assert_eq!(tick.sample.connections, 4);
        assert_eq!(tick.sample.memory_bytes, Some(1 << 20));
        assert_eq!(tick.rooms_total, 2);
        assert_eq!(tick.rooms[0].name, "busy", "the busiest first");
        // The room loaded before the previous tick: counted over the tick, 2 s.
        assert_eq!(tick.rooms[0].updates_in, 20.0);

        // Nothing new: rates fall to zero and no latency is made up.
        busy.updates_in.store(40, Relaxed);
        let tick = sampler.sample(&metrics, &rooms, 13_000, None);
        assert_eq!(tick.sample.updates_in, 0.0);
        assert_eq!(tick.sample.commit_p50_ms, None);
        assert_eq!(tick.rooms.iter().map(|r| r.updates_in).sum::<f64>(), 0.0);
    }

    #[test]
    fn the_history_keeps_the_newest_samples_up_to_its_length() {
        let admin = super::super::Admin::new(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(3),
        );
        for t in 1..=5 {
            admin.record(Tick {
                sample: Sample {
                    t,
                    ..Sample::default()
                },
                ..Tick::default()
            });
        }
        let (kept, newest, _) = admin.subscribe();
        assert_eq!(kept.iter().map(|s| s.t).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert_eq!(newest.sample.t, 5);
    }
}
