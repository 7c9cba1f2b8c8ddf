//! Rate limits: per connection (sync requests, awareness updates) and per client address (new
//! connections, failed authentications).
//!
//! Both are token buckets: a burst of `burst` requests, refilled evenly at `per_sec`. Every
//! check takes the current time as an argument, so the tests drive the clock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::close;
use crate::config::Limits;
use crate::room::{CloseReason, PeerMsg};

/// A token bucket small enough to keep two in every connection (8 bytes each): tokens as
/// `f32`, the last refill in milliseconds since the connection opened.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    tokens: f32,
    last_ms: u32,
}

impl Bucket {
    pub fn full(burst: u32) -> Bucket {
        Bucket {
            tokens: burst as f32,
            last_ms: 0,
        }
    }

    /// Takes `n` tokens at `now_ms` if there are that many; refills first.
    pub fn take(&mut self, n: u32, now_ms: u32, per_sec: f32, burst: u32) -> bool {
        let elapsed = now_ms.saturating_sub(self.last_ms) as f32 / 1000.0;
        self.tokens = (self.tokens + elapsed * per_sec).min(burst as f32);
        self.last_ms = now_ms.max(self.last_ms);
        if self.tokens >= n as f32 {
            self.tokens -= n as f32;
            true
        } else {
            false
        }
    }
}

/// One connection's limits on the requests that make the server work for it: Sync Step 1
/// and QueryAwareness (each answered with an encoding of the document or the awareness
/// table) and awareness updates (each relayed to every other peer).
#[derive(Debug, Clone, Copy)]
pub struct PeerRates {
    sync: Bucket,
    awareness: Bucket,
}

impl PeerRates {
    pub fn new(limits: &Limits) -> PeerRates {
        PeerRates {
            sync: Bucket::full(limits.sync_requests_per_minute),
            awareness: Bucket::full(limits.awareness_per_second * 2),
        }
    }

    /// Counts a frame's messages at `now_ms` (since the connection opened); an error is the
    /// reason to close the connection with.
    pub fn check(
        &mut self,
        msgs: &[PeerMsg],
        now_ms: u32,
        limits: &Limits,
    ) -> Result<(), CloseReason> {
        let (mut sync, mut awareness) = (0u32, 0u32);
        for msg in msgs {
            match msg {
                PeerMsg::Step1(_) | PeerMsg::QueryAwareness => sync += 1,
                PeerMsg::Awareness { .. } => awareness += 1,
                _ => {}
            }
        }
        self.check_counts(sync, awareness, now_ms, limits)
    }

    /// [`PeerRates::check`] for messages already counted: `sync` Sync Step 1s and
    /// QueryAwareness, `awareness` awareness updates (a Hocuspocus socket counts its frames
    /// before they reach a document).
    pub fn check_counts(
        &mut self,
        sync: u32,
        awareness: u32,
        now_ms: u32,
        limits: &Limits,
    ) -> Result<(), CloseReason> {
        let per_minute = limits.sync_requests_per_minute;
        if sync > 0
            && !self
                .sync
                .take(sync, now_ms, per_minute as f32 / 60.0, per_minute)
        {
            return Err(CloseReason::new(
                close::POLICY,
                "too many sync requests; reconnect later",
            ));
        }
        let per_sec = limits.awareness_per_second;
        if awareness > 0
            && !self
                .awareness
                .take(awareness, now_ms, per_sec as f32, per_sec * 2)
        {
            return Err(CloseReason::new(
                close::POLICY,
                "too many awareness updates; reconnect later",
            ));
        }
        Ok(())
    }
}

/// Most addresses tracked by one per-address limit; past it, the addresses whose buckets are
/// full again are forgotten (they would start full anyway), and if that is not enough, half
/// of the others (their limits start afresh: memory and time stay bounded under a flood from
/// very many addresses, at the price of some leniency then).
const MAX_TRACKED: usize = 65_536;

/// A token bucket per client address. IPv6 addresses count by their /64 prefix (one host
/// usually holds a whole /64, so counting single addresses would not limit it).
pub struct PerAddress {
    per_sec: f64,
    burst: f64,
    loopback: bool,
    start: Instant,
    buckets: Mutex<HashMap<IpAddr, (f64, Duration)>>,
}

impl PerAddress {
    /// `per_minute` requests a minute, in a burst of as many. With `loopback` false, loopback
    /// addresses are never limited.
    pub fn new(per_minute: u32, loopback: bool) -> PerAddress {
        PerAddress {
            per_sec: f64::from(per_minute) / 60.0,
            burst: f64::from(per_minute),
            loopback,
            start: Instant::now(),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn key(&self, ip: IpAddr) -> Option<IpAddr> {
        let ip = ip.to_canonical();
        if ip.is_loopback() && !self.loopback {
            return None;
        }
        Some(match ip {
            IpAddr::V6(v6) => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
            v4 => v4,
        })
    }

    /// Takes a token for `ip` at `now`; `Err(wait)` if there is none, with the time until one
    /// is back (for `Retry-After`).
    pub fn take(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        self.update(ip, now, 1.0)
    }

    /// Whether `ip` has a token left at `now`, without taking it.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        self.update(ip, now, 0.0)
    }

    fn update(&self, ip: IpAddr, now: Instant, cost: f64) -> Result<(), Duration> {
        let Some(key) = self.key(ip) else {
            return Ok(());
        };
        let at = now.saturating_duration_since(self.start);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_TRACKED && !buckets.contains_key(&key) {
            let (per_sec, burst) = (self.per_sec, self.burst);
            buckets.retain(|_, (tokens, last)| {
                *tokens + (at.saturating_sub(*last)).as_secs_f64() * per_sec < burst
            });
            // Still full (many addresses busy at once): forget half of them, so the scan
            // above runs once per MAX_TRACKED / 2 new addresses, not once per address.
            if buckets.len() >= MAX_TRACKED {
                let mut n = 0;
                buckets.retain(|_, _| {
                    n += 1;
                    n % 2 == 0
                });
            }
        }
        let (tokens, last) = buckets.entry(key).or_insert((self.burst, at));
        *tokens = (*tokens + at.saturating_sub(*last).as_secs_f64() * self.per_sec).min(self.burst);
        *last = at;
        // Below one token the address is refused (`check` takes nothing but sees the same).
        if *tokens >= 1.0 {
            *tokens -= cost;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) / self.per_sec))
        }
    }
}

impl crate::auth::FailureLimit for PerAddress {
    fn check(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        PerAddress::check(self, ip, now)
    }

    fn take(&self, ip: IpAddr, now: Instant) -> Result<(), Duration> {
        PerAddress::take(self, ip, now)
    }
}

/// The server's per-address limits.
pub struct AddressLimits {
    /// New WebSocket connections.
    pub connections: PerAddress,
    /// Failed authentications: once an address has none left, all its requests are refused
    /// until one is back.
    pub auth_failures: PerAddress,
}

impl AddressLimits {
    pub fn new(limits: &Limits) -> AddressLimits {
        AddressLimits {
            connections: PerAddress::new(
                limits.connections_per_minute_per_addr,
                limits.rate_limit_loopback,
            ),
            auth_failures: PerAddress::new(
                limits.auth_failures_per_minute_per_addr,
                limits.rate_limit_loopback,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use yrs::StateVector;

    fn limits() -> Limits {
        let mut l = crate::config::Settings::default().resolve().limits;
        l.sync_requests_per_minute = 6;
        l.awareness_per_second = 2;
        l
    }

    #[test]
    fn a_connection_gets_a_burst_of_sync_requests_then_one_per_interval() {
        let l = limits();
        let mut r = PeerRates::new(&l);
        let step1 = || vec![PeerMsg::Step1(StateVector::default())];
        for _ in 0..6 {
            assert!(r.check(&step1(), 0, &l).is_ok());
        }
        let err = r.check(&step1(), 0, &l).expect_err("burst spent");
        assert_eq!(err.code, close::POLICY);
        // Six a minute: one more after ten seconds.
        let mut r2 = r;
        assert!(r2.check(&step1(), 9_000, &l).is_err());
        assert!(r.check(&step1(), 10_000, &l).is_ok());
        // Updates and acks are not counted.
        let ack = vec![PeerMsg::DurableAck(Bytes::from_static(&[102, 0]))];
        for _ in 0..100 {
            assert!(r.check(&ack, 10_000, &l).is_ok());
        }
    }

    #[test]
    fn several_requests_in_one_frame_count_each() {
        let l = limits();
        let mut r = PeerRates::new(&l);
        let seven: Vec<PeerMsg> = (0..7).map(|_| PeerMsg::QueryAwareness).collect();
        assert!(r.check(&seven, 0, &l).is_err());
    }

    #[test]
    fn an_address_is_limited_and_loopback_is_exempt_unless_asked() {
        let a = PerAddress::new(3, false);
        let t0 = a.start;
        let ip: IpAddr = "203.0.113.7".parse().expect("ip");
        for _ in 0..3 {
            assert!(a.take(ip, t0).is_ok());
        }
        let wait = a.take(ip, t0).expect_err("limited");
        assert!(
            wait <= Duration::from_secs(20) && wait > Duration::from_secs(19),
            "{wait:?}"
        );
        assert!(a.check(ip, t0).is_err());
        // Another address is not affected; one token is back after 20 s.
        assert!(a.take("203.0.113.8".parse().expect("ip"), t0).is_ok());
        assert!(a.take(ip, t0 + Duration::from_secs(20)).is_ok());
        // Loopback: exempt, unless configured otherwise.
        let lo: IpAddr = "127.0.0.1".parse().expect("ip");
        for _ in 0..10 {
            assert!(a.take(lo, t0).is_ok());
        }
        let strict = PerAddress::new(1, true);
        assert!(strict.take(lo, t0).is_ok());
        assert!(strict.take(lo, t0).is_err());
    }

    #[test]
    fn ipv6_addresses_count_by_their_64_prefix() {
        let t0 = Instant::now();
        let a = PerAddress::new(2, false);
        assert!(a.take("2001:db8:1:2::1".parse().expect("ip"), t0).is_ok());
        assert!(a
            .take("2001:db8:1:2::ffff".parse().expect("ip"), t0)
            .is_ok());
        assert!(a
            .take("2001:db8:1:2:abcd::1".parse().expect("ip"), t0)
            .is_err());
        assert!(a.take("2001:db8:1:3::1".parse().expect("ip"), t0).is_ok());
    }
}
