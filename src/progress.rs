//! Progress of a long client command (`moraine export`, `moraine import --from`): a bar on
//! standard error when it is a terminal (rows, bytes, rate, ETA), else a `tracing` line every
//! [`LOG_EVERY`] and one at the end. It measures; it decides nothing.

use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{HumanBytes, HumanCount, HumanDuration, ProgressBar, ProgressStyle};

/// How often a log line reports progress when standard error is not a terminal.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// What the ETA is measured in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Total {
    /// Bytes, of which the whole is estimated up front.
    Bytes(u64),
    /// Steps (endpoints read, batches committed), of which the whole is known.
    Steps {
        /// How many.
        count: u64,
        /// What one is called, plural.
        unit: &'static str,
    },
}

/// The progress of one command.
#[derive(Debug)]
pub struct Progress {
    what: &'static str,
    total: Total,
    bar: Option<ProgressBar>,
    started: Instant,
    last_log: Mutex<Instant>,
    rows: AtomicU64,
    bytes: AtomicU64,
    steps: AtomicU64,
}

impl Progress {
    /// Progress of `what` (`"export"`) towards `total`: a bar when standard error is a
    /// terminal, log lines otherwise.
    #[must_use]
    pub fn new(what: &'static str, total: Total) -> Self {
        use std::io::IsTerminal as _;
        let bar = std::io::stderr().is_terminal().then(|| bar(what, total));
        let now = Instant::now();
        Self {
            what,
            total,
            bar,
            started: now,
            last_log: Mutex::new(now),
            rows: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            steps: AtomicU64::new(0),
        }
    }

    /// `rows` more rows done, and `bytes` more bytes.
    pub fn add(&self, rows: u64, bytes: u64) {
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.update();
    }

    /// One more step done.
    pub fn step(&self) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.update();
    }

    /// Rows done so far.
    #[must_use]
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }

    /// Ends the bar, and logs what was done.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        tracing::info!("{} finished: {}", self.what, self.summary());
    }

    /// Ends the bar where it stands, after a failure.
    pub fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }

    /// Rows, bytes and rate so far, as a phrase.
    fn summary(&self) -> String {
        let elapsed = self.started.elapsed();
        let bytes = self.bytes.load(Ordering::Relaxed);
        let rate = rate(bytes, elapsed);
        format!(
            "{} rows, {} in {} ({}/s)",
            HumanCount(self.rows()),
            HumanBytes(bytes),
            HumanDuration(elapsed),
            HumanBytes(rate)
        )
    }

    fn update(&self) {
        let rows = self.rows();
        let bytes = self.bytes.load(Ordering::Relaxed);
        let steps = self.steps.load(Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            match self.total {
                Total::Bytes(_) => {
                    bar.set_position(bytes);
                    bar.set_message(format!("{} rows", HumanCount(rows)));
                }
                Total::Steps { .. } => {
                    bar.set_position(steps);
                    bar.set_message(format!(
                        "{} rows, {} ({}/s)",
                        HumanCount(rows),
                        HumanBytes(bytes),
                        HumanBytes(rate(bytes, self.started.elapsed()))
                    ));
                }
            }
            return;
        }
        let now = Instant::now();
        {
            let mut last = self.last_log.lock().unwrap_or_else(PoisonError::into_inner);
            if now.duration_since(*last) < LOG_EVERY {
                return;
            }
            *last = now;
        }
        let (done, whole, unit) = match self.total {
            Total::Bytes(whole) => (bytes, whole, "bytes (estimated)"),
            Total::Steps { count, unit } => (steps, count, unit),
        };
        let eta = eta(done, whole, self.started.elapsed())
            .map(|eta| format!(", ETA {}", HumanDuration(eta)))
            .unwrap_or_default();
        tracing::info!(
            "{}: {}; {done} of {whole} {unit}{eta}",
            self.what,
            self.summary()
        );
    }
}

/// Bytes per second.
fn rate(bytes: u64, elapsed: Duration) -> u64 {
    let millis = u64::try_from(elapsed.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    bytes.saturating_mul(1000) / millis
}

/// Time left, at the pace so far.
fn eta(done: u64, whole: u64, elapsed: Duration) -> Option<Duration> {
    if done == 0 || done >= whole {
        return None;
    }
    let left = u32::try_from(whole - done).ok()?;
    let done = u32::try_from(done).ok()?;
    Some(elapsed * left / done)
}

fn bar(what: &'static str, total: Total) -> ProgressBar {
    let (length, template) = match total {
        Total::Bytes(bytes) => (
            bytes,
            "{prefix} [{wide_bar}] {bytes}/{total_bytes} ({binary_bytes_per_sec}, ETA {eta}) {msg}"
                .to_owned(),
        ),
        Total::Steps { count, unit } => (
            count,
            format!("{{prefix}} [{{wide_bar}}] {{pos}}/{{len}} {unit} (ETA {{eta}}) {{msg}}"),
        ),
    };
    let style = ProgressStyle::with_template(&template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    ProgressBar::new(length).with_style(style).with_prefix(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_is_the_pace_so_far() {
        assert_eq!(
            eta(1, 4, Duration::from_secs(10)),
            Some(Duration::from_secs(30))
        );
        assert_eq!(eta(0, 4, Duration::from_secs(10)), None);
        assert_eq!(eta(4, 4, Duration::from_secs(10)), None);
        assert_eq!(rate(3000, Duration::from_secs(3)), 1000);
        assert_eq!(rate(3000, Duration::ZERO), 3_000_000);
    }
}
