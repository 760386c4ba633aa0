//! Faults of the simulated API server, for testing clients against an API
//! server that throttles, fails, conflicts and stalls: a configured fraction
//! of write requests is answered with an error status instead of being
//! carried out, and another fraction hangs before it is answered (504) the
//! same way. Reads and watches are not faulted, except in a full stall:
//! after the faults' window, every new request (reads and watches too) may
//! hang until the stall ends and then be answered 504, as an API server
//! that stopped answering does.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::Method;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The statuses a faulted write may get, and what a real API server means by them.
pub const FAULT_STATUSES: [u16; 4] = [409, 429, 500, 503];

/// `apiFaults` in the cluster config; all off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ApiFaultConfig {
    /// Fraction (0 to 1) of write requests (POST, PUT, PATCH, DELETE) answered
    /// with one of `statuses`, picked uniformly, without being carried out.
    pub write_error_rate: f64,
    /// The error statuses: any of 409 (Conflict), 429 (TooManyRequests, with
    /// `Retry-After: 1`), 500 (InternalError) and 503 (ServiceUnavailable).
    pub statuses: Vec<u16>,
    /// Fraction (0 to 1) of write requests that hang for `stallSeconds` (real
    /// time) and are then answered 504 without being carried out.
    pub write_stall_rate: f64,
    pub stall_seconds: f64,
    /// Seed of the fault draws, so a run can be repeated.
    pub seed: u64,
    /// Seconds (real time, from the API server's start) during which the
    /// faults above are drawn; forever when unset.
    pub fault_seconds: Option<f64>,
    /// Seconds of a full stall right after `faultSeconds`: every request
    /// arriving in it hangs until the stall ends and is then answered 504.
    pub full_stall_seconds: f64,
}

impl Default for ApiFaultConfig {
    fn default() -> Self {
        Self {
            write_error_rate: 0.0,
            statuses: FAULT_STATUSES.to_vec(),
            write_stall_rate: 0.0,
            stall_seconds: 60.0,
            seed: 0,
            fault_seconds: None,
            full_stall_seconds: 0.0,
        }
    }
}

impl ApiFaultConfig {
    /// Checks the values; errors name the key under `apiFaults`.
    pub fn check(&self) -> Result<(), String> {
        for (key, rate) in [
            ("writeErrorRate", self.write_error_rate),
            ("writeStallRate", self.write_stall_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("apiFaults.{key}: {rate} must be between 0 and 1"));
            }
        }
        if self.write_error_rate + self.write_stall_rate > 1.0 {
            return Err("apiFaults: writeErrorRate + writeStallRate must be at most 1".into());
        }
        if self.write_error_rate > 0.0 && self.statuses.is_empty() {
            return Err(
                "apiFaults.statuses: give at least one status when writeErrorRate > 0".into(),
            );
        }
        if let Some(status) = self.statuses.iter().find(|s| !FAULT_STATUSES.contains(s)) {
            return Err(format!(
                "apiFaults.statuses: {status} is not simulated; use {FAULT_STATUSES:?}"
            ));
        }
        for (key, seconds) in [
            ("stallSeconds", Some(self.stall_seconds)),
            ("faultSeconds", self.fault_seconds),
            ("fullStallSeconds", Some(self.full_stall_seconds)),
        ] {
            if let Some(seconds) = seconds
                && !(seconds.is_finite() && seconds >= 0.0)
            {
                return Err(format!(
                    "apiFaults.{key}: {seconds} must be a number of seconds"
                ));
            }
        }
        if self.full_stall_seconds > 0.0 && self.fault_seconds.is_none() {
            return Err(
                "apiFaults.fullStallSeconds: the stall follows the faults' window; set faultSeconds too (0 for a stall at start)".into(),
            );
        }
        Ok(())
    }
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Answer with this status, do nothing.
    Fail(u16),
    /// Hang this long, then answer 504, do nothing.
    Stall(Duration),
}

/// The fault draws of a running API server.
#[derive(Debug)]
pub struct ApiFaults {
    config: ApiFaultConfig,
    rng: Mutex<StdRng>,
    started: Instant,
}

impl ApiFaults {
    pub fn new(config: ApiFaultConfig) -> Self {
        Self {
            rng: Mutex::new(StdRng::seed_from_u64(config.seed)),
            config,
            started: Instant::now(),
        }
    }

    /// The fault for a request, if it gets one.
    pub fn draw(&self, method: &Method, watch: bool) -> Option<Fault> {
        self.draw_at(method, watch, self.started.elapsed())
    }

    /// The fault for a request arriving `elapsed` after the server started.
    fn draw_at(&self, method: &Method, watch: bool, elapsed: Duration) -> Option<Fault> {
        let config = &self.config;
        if let Some(window) = config.fault_seconds {
            let window = Duration::from_secs_f64(window);
            let stall_end = window + Duration::from_secs_f64(config.full_stall_seconds);
            if elapsed >= window {
                return (elapsed < stall_end).then(|| Fault::Stall(stall_end - elapsed));
            }
        }
        let write = matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        if !write || watch {
            return None;
        }
        if config.write_error_rate == 0.0 && config.write_stall_rate == 0.0 {
            return None;
        }
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let roll: f64 = rng.random();
        if roll < config.write_error_rate {
            let status = config.statuses[rng.random_range(0..config.statuses.len())];
            Some(Fault::Fail(status))
        } else if roll < config.write_error_rate + config.write_stall_rate {
            Some(Fault::Stall(Duration::from_secs_f64(config.stall_seconds)))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_are_faulted_at_about_the_configured_rate() {
        let faults = ApiFaults::new(ApiFaultConfig {
            write_error_rate: 0.5,
            statuses: vec![429, 503],
            ..Default::default()
        });
        assert!((0..100).all(|_| faults.draw(&Method::GET, false).is_none()));
        let drawn: Vec<Option<Fault>> = (0..1000)
            .map(|_| faults.draw(&Method::PATCH, false))
            .collect();
        let failed = drawn.iter().flatten().count();
        assert!((400..600).contains(&failed), "{failed} of 1000");
        assert!(
            drawn
                .iter()
                .flatten()
                .all(|f| matches!(f, Fault::Fail(429 | 503)))
        );
    }

    #[test]
    fn faults_end_after_their_window_and_a_full_stall_holds_every_request_until_it_ends() {
        let faults = ApiFaults::new(ApiFaultConfig {
            write_error_rate: 1.0,
            fault_seconds: Some(10.0),
            full_stall_seconds: 5.0,
            ..Default::default()
        });
        let at = Duration::from_secs;
        assert!(matches!(
            faults.draw_at(&Method::POST, false, at(9)),
            Some(Fault::Fail(_))
        ));
        assert_eq!(faults.draw_at(&Method::GET, false, at(9)), None);
        for (method, watch) in [
            (Method::GET, true),
            (Method::GET, false),
            (Method::POST, false),
        ] {
            assert_eq!(
                faults.draw_at(&method, watch, at(12)),
                Some(Fault::Stall(at(3))),
                "{method} watch={watch}"
            );
        }
        assert_eq!(faults.draw_at(&Method::POST, false, at(15)), None);
        let stall_without_window = ApiFaultConfig {
            full_stall_seconds: 5.0,
            ..Default::default()
        };
        assert!(
            stall_without_window
                .check()
                .expect_err("window")
                .contains("apiFaults.fullStallSeconds")
        );
    }

    #[test]
    fn bad_rates_and_statuses_name_their_key() {
        let bad = ApiFaultConfig {
            write_error_rate: 1.5,
            ..Default::default()
        };
        assert!(
            bad.check()
                .expect_err("rate")
                .contains("apiFaults.writeErrorRate")
        );
        let bad = ApiFaultConfig {
            statuses: vec![404],
            ..Default::default()
        };
        assert!(
            bad.check()
                .expect_err("status")
                .contains("apiFaults.statuses")
        );
        assert!(ApiFaultConfig::default().check().is_ok());
    }
}
