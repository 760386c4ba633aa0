//! Verifications waiting for their storage: which jobs wait on which
//! storage endpoint, and when each endpoint is tried next. The waiting
//! reports themselves are kept in the jobs' records (the
//! `trainyard_checkpoints` bucket); this index is rebuilt from them when a
//! replica takes the lease.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// A storage endpoint that did not answer, and the jobs waiting on it.
#[derive(Debug)]
struct Endpoint {
    jobs: BTreeSet<String>,
    /// Consecutive failed attempts since the endpoint last answered.
    failures: u32,
    next_attempt: Instant,
}

/// Jobs with verifications waiting, per storage endpoint.
#[derive(Debug, Default)]
pub struct Waiting {
    endpoints: HashMap<String, Endpoint>,
    /// Job key → the endpoint it waits on.
    jobs: HashMap<String, String>,
}

/// The wait before the next attempt after `failures` failed ones: 0.5 s
/// doubling to 15 s, jittered (the runtime's passing-failure backoff).
pub fn backoff(failures: u32) -> Duration {
    trainyard_runtime::consumer::transient_delay(failures, Duration::from_secs(30))
}

impl Waiting {
    /// True when verifications on `endpoint` are waiting: a new report for it
    /// waits behind them without trying the storage in the handler.
    pub fn is_down(&self, endpoint: &str) -> bool {
        self.endpoints.contains_key(endpoint)
    }

    /// Records that `job` waits on `endpoint`. A newly failing endpoint is
    /// tried again after the first backoff; a job that waited on another
    /// endpoint (its spec changed) moves, due at once.
    pub fn wait(&mut self, job: &str, endpoint: &str, now: Instant) {
        if let Some(previous) = self.jobs.get(job).cloned() {
            if previous == endpoint {
                return;
            }
            self.forget(job);
            let entry = self.entry(endpoint, now);
            entry.jobs.insert(job.to_string());
            entry.next_attempt = now;
        } else {
            self.entry(endpoint, now).jobs.insert(job.to_string());
        }
        self.jobs.insert(job.to_string(), endpoint.to_string());
    }

    fn entry(&mut self, endpoint: &str, now: Instant) -> &mut Endpoint {
        self.endpoints
            .entry(endpoint.to_string())
            .or_insert_with(|| Endpoint {
                jobs: BTreeSet::new(),
                failures: 1,
                next_attempt: now + backoff(1),
            })
    }

    /// `job` waits on nothing any more; an endpoint no job waits on is up.
    pub fn forget(&mut self, job: &str) {
        let Some(endpoint) = self.jobs.remove(job) else {
            return;
        };
        if let Some(entry) = self.endpoints.get_mut(&endpoint) {
            entry.jobs.remove(job);
            if entry.jobs.is_empty() {
                self.endpoints.remove(&endpoint);
            }
        }
    }

    /// The endpoint `job` waits on.
    pub fn endpoint_of(&self, job: &str) -> Option<&str> {
        self.jobs.get(job).map(String::as_str)
    }

    /// Endpoints due for an attempt, each with the jobs waiting on it.
    pub fn due(&self, now: Instant) -> Vec<(String, Vec<String>)> {
        self.endpoints
            .iter()
            .filter(|(_, entry)| entry.next_attempt <= now)
            .map(|(endpoint, entry)| (endpoint.clone(), entry.jobs.iter().cloned().collect()))
            .collect()
    }

    /// The endpoint answered: its next waiting job is tried without delay.
    pub fn answered(&mut self, endpoint: &str, now: Instant) {
        if let Some(entry) = self.endpoints.get_mut(endpoint) {
            entry.failures = 0;
            entry.next_attempt = now;
        }
    }

    /// The endpoint still does not answer: tried again after a longer wait.
    pub fn failed(&mut self, endpoint: &str, now: Instant) {
        if let Some(entry) = self.endpoints.get_mut(endpoint) {
            entry.failures = entry.failures.saturating_add(1);
            entry.next_attempt = now + backoff(entry.failures);
        }
    }

    /// Jobs with verifications waiting.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_endpoint_is_tried_later_and_later_up_to_fifteen_seconds() {
        let now = Instant::now();
        let mut waiting = Waiting::default();
        waiting.wait("ml/a", "http://dead:9000", now);
        assert!(waiting.is_down("http://dead:9000"));
        assert!(waiting.due(now).is_empty(), "not before the first backoff");
        assert_eq!(waiting.due(now + Duration::from_millis(501)).len(), 1);
        for _ in 0..12 {
            waiting.failed("http://dead:9000", now);
        }
        assert!(waiting.due(now + Duration::from_millis(7400)).is_empty());
        assert_eq!(waiting.due(now + Duration::from_secs(15)).len(), 1);
    }

    #[test]
    fn an_endpoint_is_up_once_no_job_waits_on_it() {
        let now = Instant::now();
        let mut waiting = Waiting::default();
        waiting.wait("ml/a", "http://dead:9000", now);
        waiting.wait("ml/b", "http://dead:9000", now);
        waiting.answered("http://dead:9000", now);
        assert_eq!(
            waiting.due(now),
            vec![(
                "http://dead:9000".to_string(),
                vec!["ml/a".to_string(), "ml/b".to_string()]
            )]
        );
        waiting.forget("ml/a");
        assert!(waiting.is_down("http://dead:9000"));
        waiting.forget("ml/b");
        assert!(!waiting.is_down("http://dead:9000"));
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_job_whose_endpoint_changed_waits_on_the_new_one_and_is_due_at_once() {
        let now = Instant::now();
        let mut waiting = Waiting::default();
        waiting.wait("ml/a", "http://dead:9000", now);
        waiting.wait("ml/a", "http://fixed:9000", now);
        assert!(!waiting.is_down("http://dead:9000"));
        assert_eq!(waiting.endpoint_of("ml/a"), Some("http://fixed:9000"));
        assert_eq!(waiting.due(now).len(), 1);
    }
}
