//! The time expiry rules read: the system's monotonic clock, or a manual one that moves only
//! when told, so that tests of timeouts are exact and wait for nothing. Knows nothing of what
//! expires.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// A monotonic clock: the system's (the default), or a manual one.
#[derive(Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Manual>>,
}

struct Manual {
    start: Instant,
    /// How far the clock has been moved since `start`.
    elapsed: watch::Sender<Duration>,
}

impl Clock {
    /// The system's monotonic clock.
    #[must_use]
    pub fn system() -> Self {
        Self::default()
    }

    /// A clock that stands still until [`advance`](Self::advance)d. Clones share it.
    #[must_use]
    pub fn manual() -> Self {
        Self {
            manual: Some(Arc::new(Manual {
                start: Instant::now(),
                elapsed: watch::Sender::new(Duration::ZERO),
            })),
        }
    }

    /// The time now.
    #[must_use]
    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(manual) => manual.start + *manual.elapsed.borrow(),
        }
    }

    /// Moves a manual clock on by `by`, waking whatever [`sleep_until`](Self::sleep_until)s
    /// the time it reaches.
    ///
    /// # Panics
    /// On the system clock, which no one moves.
    pub fn advance(&self, by: Duration) {
        let Some(manual) = &self.manual else {
            panic!("the system clock cannot be advanced");
        };
        manual.elapsed.send_modify(|elapsed| *elapsed += by);
    }

    /// Resolves once this clock reads `deadline` or later.
    pub async fn sleep_until(&self, deadline: Instant) {
        match &self.manual {
            None => tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await,
            Some(manual) => {
                let mut moved = manual.elapsed.subscribe();
                // The sender lives as long as `manual`, which `self` holds.
                let _ = moved
                    .wait_for(|elapsed| manual.start + *elapsed >= deadline)
                    .await;
            }
        }
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.manual {
            None => f.write_str("Clock::system"),
            Some(manual) => write!(f, "Clock::manual(+{:?})", *manual.elapsed.borrow()),
        }
    }
}

/// Two clocks are equal when they are the system's, or the same manual one.
impl PartialEq for Clock {
    fn eq(&self, other: &Self) -> bool {
        match (&self.manual, &other.manual) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Clock {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_moves_only_when_advanced_and_wakes_its_sleepers() {
        let clock = Clock::manual();
        let before = clock.now();
        assert_eq!(clock.now(), before);
        let sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(before + Duration::from_mins(1)).await }
        });
        clock.advance(Duration::from_secs(59));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "woke before its time");
        clock.advance(Duration::from_secs(1));
        sleeper.await.expect("woke");
        assert_eq!(clock.now() - before, Duration::from_mins(1));
        assert_eq!(clock, clock.clone());
        assert_ne!(clock, Clock::manual());
        assert_eq!(Clock::system(), Clock::default());
    }
}
