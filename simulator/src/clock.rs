//! The virtual clock: simulated seconds since the simulation began, running
//! `speed` times faster than the wall clock. Only the simulated cluster (pod start
//! delays, epochs, reclaims) follows it; the services keep the wall clock, so their
//! logic is unchanged.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    origin: Instant,
    speed: f64,
}

impl SimClock {
    /// A clock starting now; `speed` simulated seconds pass per real second.
    pub fn new(speed: f64) -> Self {
        Self::starting_at(Instant::now(), speed)
    }

    pub fn starting_at(origin: Instant, speed: f64) -> Self {
        Self {
            origin,
            speed: if speed.is_finite() && speed > 0.0 {
                speed
            } else {
                1.0
            },
        }
    }

    pub fn speed(&self) -> f64 {
        self.speed
    }

    /// Simulated seconds since the start.
    pub fn now(&self) -> f64 {
        self.at(Instant::now())
    }

    /// Simulated seconds at a wall-clock instant.
    pub fn at(&self, instant: Instant) -> f64 {
        instant.saturating_duration_since(self.origin).as_secs_f64() * self.speed
    }

    /// Wall-clock time that `simulated` seconds take.
    pub fn real(&self, simulated: f64) -> Duration {
        Duration::from_secs_f64((simulated / self.speed).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_hour_at_speed_3600_is_one_real_second() {
        let origin = Instant::now();
        let clock = SimClock::starting_at(origin, 3600.0);
        assert_eq!(clock.at(origin + Duration::from_secs(1)), 3600.0);
        assert_eq!(clock.real(3600.0), Duration::from_secs(1));
        assert_eq!(clock.at(origin + Duration::from_millis(500)), 1800.0);
    }

    #[test]
    fn a_nonsensical_speed_means_real_time() {
        let origin = Instant::now();
        for speed in [0.0, -2.0, f64::NAN, f64::INFINITY] {
            let clock = SimClock::starting_at(origin, speed);
            assert_eq!(clock.at(origin + Duration::from_secs(2)), 2.0);
        }
    }
}
