//! Snapshots held for the endpoints of a whole-table read.
//!
//! A `FlightInfo` for a whole table lists several endpoints, each a range of table ids, that
//! clients read in parallel, on any connection, in any order. They all read one snapshot:
//! the server holds it from the `GetFlightInfo` until every endpoint has been read to its
//! end, or until its lifetime passes, whichever comes first. A later `GetFlightInfo` may read
//! other tables at the same held snapshot (a whole-catalog export does), adding its endpoints
//! to those the snapshot waits for; it does not extend the lifetime.
//!
//! What a held snapshot pins is bounded by the number held at once and their lifetime: on
//! redb a read transaction (pages it reads are not reused), on TiKV a timestamp below which
//! GC does not collect.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::catalog::CatalogSnapshot;
use crate::clock::Clock;
use crate::error::{Error, Limit, Named, Result};
use crate::kv::Division;

/// How whole-table reads are divided, and how long and how many of their snapshots are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartLimits {
    /// How long a snapshot is held after the `GetFlightInfo` that took it.
    pub lifetime: Duration,
    /// Most snapshots held at once.
    pub max_held: usize,
    /// How finely a table's rows are divided into endpoints.
    pub division: Division,
}

impl Default for PartLimits {
    fn default() -> Self {
        Self {
            lifetime: Duration::from_mins(5),
            max_held: 256,
            division: Division {
                span_bytes: 16 << 20,
                max_spans: 64,
            },
        }
    }
}

/// A held snapshot's id: 128 random bits, as in tickets.
pub type HeldId = [u8; 16];

struct Held {
    snapshot: CatalogSnapshot,
    expires: Instant,
    /// The session whose transaction's view this is; `None` for a committed snapshot, which
    /// every caller allowed to read may read.
    owner: Option<String>,
    /// Endpoints issued and not yet read to their end.
    pending: BTreeSet<u32>,
    next: u32,
}

/// The held snapshots of one server.
pub(crate) struct HeldSnapshots {
    limits: PartLimits,
    clock: Clock,
    held: Arc<Mutex<HashMap<HeldId, Held>>>,
}

impl HeldSnapshots {
    pub(crate) fn new(limits: PartLimits, clock: Clock) -> Self {
        Self {
            limits,
            clock,
            held: Arc::default(),
        }
    }

    pub(crate) fn limits(&self) -> PartLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<HeldId, Held>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.clock.now();
        held.retain(|_, snapshot| snapshot.expires > now);
        held
    }

    /// Holds `snapshot` for `endpoints` endpoints; returns its id and the endpoints' serials.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when as many snapshots as allowed are held.
    pub(crate) fn hold(
        &self,
        snapshot: CatalogSnapshot,
        owner: Option<String>,
        endpoints: usize,
    ) -> Result<(HeldId, Vec<u32>)> {
        let id = crate::auth::random_bytes::<16>()?;
        let mut held = self.lock();
        if held.len() >= self.limits.max_held {
            return Err(Error::LimitExceeded {
                limit: Limit::HeldSnapshots,
                max: u64::try_from(self.limits.max_held).unwrap_or(u64::MAX),
            });
        }
        let mut entry = Held {
            snapshot,
            expires: self.clock.now() + self.limits.lifetime,
            owner,
            pending: BTreeSet::new(),
            next: 0,
        };
        let serials = issue(&mut entry, endpoints);
        held.insert(id, entry);
        Ok((id, serials))
    }

    /// The snapshot held as `id`, for `endpoints` more endpoints asked for by `owner`.
    ///
    /// # Errors
    /// [`Error::SnapshotGone`] when it is not held (or not `owner`'s to read).
    pub(crate) fn extend(
        &self,
        id: &HeldId,
        owner: Option<&str>,
        endpoints: usize,
    ) -> Result<(CatalogSnapshot, Vec<u32>)> {
        let mut held = self.lock();
        let entry = readable(&mut held, id, owner, || self.gone())?;
        let serials = issue(entry, endpoints);
        Ok((entry.snapshot.clone(), serials))
    }

    /// The snapshot endpoint `serial` of `id` reads, for `owner`.
    ///
    /// # Errors
    /// [`Error::SnapshotGone`] when it is not held, not `owner`'s to read, or this endpoint
    /// was read to its end already.
    pub(crate) fn snapshot(
        &self,
        id: &HeldId,
        serial: u32,
        owner: Option<&str>,
    ) -> Result<CatalogSnapshot> {
        let mut held = self.lock();
        let entry = readable(&mut held, id, owner, || self.gone())?;
        if entry.pending.contains(&serial) {
            Ok(entry.snapshot.clone())
        } else {
            Err(self.gone())
        }
    }

    /// Endpoint `serial` of `id` has been read to its end; the snapshot goes once every
    /// endpoint of it has.
    pub(crate) fn read(&self, id: &HeldId, serial: u32) {
        let mut held = self.lock();
        if let Some(entry) = held.get_mut(id) {
            entry.pending.remove(&serial);
            if entry.pending.is_empty() {
                held.remove(id);
            }
        }
    }

    /// How long `id` is still held, if it is.
    pub(crate) fn remaining(&self, id: &HeldId) -> Option<Duration> {
        let now = self.clock.now();
        self.lock()
            .get(id)
            .map(|entry| entry.expires.saturating_duration_since(now))
    }

    /// Snapshots held now.
    #[cfg(test)]
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// Drops expired snapshots every `lifetime / 4` (at least every 10 s), so that an idle
    /// server does not keep them past their time. Ends with the registry.
    pub(crate) fn spawn_reaper(&self) {
        let held: Weak<Mutex<HashMap<HeldId, Held>>> = Arc::downgrade(&self.held);
        let period =
            (self.limits.lifetime / 4).clamp(Duration::from_millis(50), Duration::from_secs(10));
        let clock = self.clock.clone();
        let mut next = clock.now() + period;
        tokio::spawn(async move {
            loop {
                clock.sleep_until(next).await;
                next = (next + period).max(clock.now());
                let Some(held) = held.upgrade() else {
                    return;
                };
                let now = clock.now();
                held.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .retain(|_, snapshot| snapshot.expires > now);
            }
        });
    }

    fn gone(&self) -> Error {
        Error::SnapshotGone {
            lifetime: self.limits.lifetime,
        }
    }
}

fn issue(entry: &mut Held, endpoints: usize) -> Vec<u32> {
    (0..endpoints)
        .map(|_| {
            let serial = entry.next;
            entry.next = entry.next.wrapping_add(1);
            entry.pending.insert(serial);
            serial
        })
        .collect()
}

/// The entry `id`, when `owner` may read it: a committed snapshot anyone may, a
/// transaction's view only its session (to any other, `NOT_FOUND`, as everything a session
/// makes is its own).
fn readable<'a>(
    held: &'a mut HashMap<HeldId, Held>,
    id: &HeldId,
    owner: Option<&str>,
    gone: impl FnOnce() -> Error,
) -> Result<&'a mut Held> {
    match held.get_mut(id) {
        None => Err(gone()),
        Some(entry) if entry.owner.is_none() || entry.owner.as_deref() == owner => Ok(entry),
        Some(_) => Err(Error::NotFound {
            what: Named::HeldSnapshot(crate::key_range::hex(id)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::codec::Keyspace;
    use crate::kv::Store;

    async fn snapshot() -> CatalogSnapshot {
        Catalog::new(Store::memory(), Keyspace::default())
            .snapshot()
            .await
            .expect("snapshot")
    }

    fn registry(clock: &Clock, max_held: usize) -> HeldSnapshots {
        HeldSnapshots::new(
            PartLimits {
                lifetime: Duration::from_mins(1),
                max_held,
                ..PartLimits::default()
            },
            clock.clone(),
        )
    }

    #[tokio::test]
    async fn a_snapshot_is_held_until_every_endpoint_is_read() {
        let held = registry(&Clock::manual(), 8);
        let (id, serials) = held.hold(snapshot().await, None, 2).expect("held");
        let (_, more) = held.extend(&id, Some("someone"), 1).expect("extended");
        assert_eq!(serials.len() + more.len(), 3);
        for serial in serials.iter().chain(&more) {
            held.snapshot(&id, *serial, None).expect("readable");
        }
        held.read(&id, serials[0]);
        assert!(
            held.snapshot(&id, serials[0], None).is_err(),
            "read to its end"
        );
        held.read(&id, serials[1]);
        assert_eq!(held.count(), 1, "one endpoint still waits");
        held.read(&id, more[0]);
        assert_eq!(held.count(), 0);
        let err = held.snapshot(&id, more[0], None).expect_err("released");
        assert!(matches!(err, Error::SnapshotGone { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_snapshot_expires_after_its_lifetime() {
        let clock = Clock::manual();
        let held = registry(&clock, 8);
        let (id, serials) = held.hold(snapshot().await, None, 1).expect("held");
        clock.advance(Duration::from_secs(59));
        assert_eq!(held.remaining(&id), Some(Duration::from_secs(1)));
        held.snapshot(&id, serials[0], None).expect("still held");
        clock.advance(Duration::from_secs(1));
        let err = held.snapshot(&id, serials[0], None).expect_err("expired");
        assert!(err.to_string().contains("--snapshot-ttl"), "{err}");
        assert!(held.extend(&id, None, 1).is_err());
    }

    #[tokio::test]
    async fn held_snapshots_are_bounded_and_a_view_is_its_sessions_alone() {
        let held = registry(&Clock::manual(), 2);
        let (own, serials) = held
            .hold(snapshot().await, Some("alice".into()), 1)
            .expect("held");
        held.hold(snapshot().await, None, 1).expect("held");
        let err = held
            .hold(snapshot().await, None, 1)
            .expect_err("over the limit");
        assert!(err.to_string().contains("--max-held-snapshots"), "{err}");
        held.snapshot(&own, serials[0], Some("alice"))
            .expect("her own");
        for other in [Some("bob"), None] {
            let err = held
                .snapshot(&own, serials[0], other)
                .expect_err("not theirs");
            assert!(matches!(err, Error::NotFound { .. }), "{err}");
        }
        assert!(held.extend(&own, Some("bob"), 1).is_err());
    }
}
