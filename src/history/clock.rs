//! The clock every time-dependent rule reads: version times, retention
//! ages, hourly/daily thinning, interval capture. Injected, so tests move
//! time forward instead of sleeping; the system clock by default.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub trait Clock: Send + Sync {
    /// Wall-clock time in nanoseconds since the Unix epoch (what versions
    /// are stamped with and retention ages are measured against).
    fn now_ns(&self) -> i64;
    /// Monotonic time since an arbitrary origin: for intervals, which a
    /// wall-clock step (NTP, an administrator) must not stretch or cut.
    fn monotonic(&self) -> Duration;
}

/// The real clocks: `SystemTime` and `Instant`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i64 {
        super::now_ns()
    }

    fn monotonic(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    wall_ns: AtomicI64,
    mono_ns: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ns: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            wall_ns: AtomicI64::new(start_ns),
            mono_ns: AtomicU64::new(0),
        })
    }

    /// Moves both clocks forward by `d`.
    pub fn advance(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.wall_ns
            .fetch_add(i64::try_from(ns).unwrap_or(i64::MAX), Ordering::SeqCst);
        self.mono_ns.fetch_add(ns, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> i64 {
        self.wall_ns.load(Ordering::SeqCst)
    }

    fn monotonic(&self) -> Duration {
        Duration::from_nanos(self.mono_ns.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ns(), 1_000);
        assert_eq!(c.monotonic(), Duration::ZERO);
        c.advance(Duration::from_secs(2));
        assert_eq!(c.now_ns(), 2_000_001_000);
        assert_eq!(c.monotonic(), Duration::from_secs(2));
    }

    #[test]
    fn system_clock_is_the_real_time() {
        let before = super::super::now_ns();
        let t = SystemClock.now_ns();
        assert!(t >= before && t - before < 60_000_000_000);
        let m1 = SystemClock.monotonic();
        assert!(SystemClock.monotonic() >= m1);
    }
}
