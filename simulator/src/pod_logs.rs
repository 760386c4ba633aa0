//! What the simulated workers write to standard output, per pod: the lines the
//! `pods/{name}/log` subresource serves. Kept in memory, the last
//! [`LINES_PER_POD`] lines of each pod, and dropped with the pod.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, SecondsFormat, Utc};
use tokio::sync::watch;

/// Lines kept per pod; older ones are dropped, as a kubelet rotates container logs.
pub const LINES_PER_POD: usize = 1000;

/// One line a worker wrote, with when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Counts every line of the pod from 1, kept or dropped: a follower asks for
    /// the lines after the last one it sent.
    pub sequence: u64,
    pub time: DateTime<Utc>,
    pub text: String,
}

impl LogLine {
    /// The line as the log endpoint sends it, with kubelet's RFC 3339 timestamp
    /// in front when `timestamps` is asked for.
    pub fn render(&self, timestamps: bool) -> String {
        if timestamps {
            format!(
                "{} {}\n",
                self.time.to_rfc3339_opts(SecondsFormat::Nanos, true),
                self.text
            )
        } else {
            format!("{}\n", self.text)
        }
    }
}

#[derive(Default)]
struct PodLog {
    lines: VecDeque<LogLine>,
    written: u64,
}

/// Every pod's log; followers are woken by [`PodLogs::changes`] on each write.
pub struct PodLogs {
    pods: Mutex<HashMap<(String, String), PodLog>>,
    written: watch::Sender<u64>,
}

impl Default for PodLogs {
    fn default() -> Self {
        Self {
            pods: Mutex::default(),
            written: watch::channel(0).0,
        }
    }
}

impl PodLogs {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), PodLog>> {
        // Every write appends or removes whole lines: usable after a panic.
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends a line to the log of pod `namespace/name`.
    pub fn append(&self, namespace: &str, name: &str, text: impl Into<String>) {
        {
            let mut pods = self.lock();
            let log = pods
                .entry((namespace.to_owned(), name.to_owned()))
                .or_default();
            log.written += 1;
            if log.lines.len() >= LINES_PER_POD {
                log.lines.pop_front();
            }
            log.lines.push_back(LogLine {
                sequence: log.written,
                time: Utc::now(),
                text: text.into(),
            });
        }
        self.written.send_modify(|count| *count += 1);
    }

    /// The kept lines of a pod after line `after` (0: all of them).
    pub fn lines_after(&self, namespace: &str, name: &str, after: u64) -> Vec<LogLine> {
        self.lock()
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(|log| {
                log.lines
                    .iter()
                    .filter(|line| line.sequence > after)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Forgets a deleted pod's log.
    pub fn remove(&self, namespace: &str, name: &str) {
        self.lock().remove(&(namespace.to_owned(), name.to_owned()));
        self.written.send_modify(|count| *count += 1);
    }

    /// Changes each time any pod's log is written or removed.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_keeps_its_last_lines_numbered_from_the_first() {
        let logs = PodLogs::default();
        for i in 0..LINES_PER_POD + 5 {
            logs.append("ml", "w-0", format!("line {i}"));
        }
        logs.append("ml", "w-1", "other pod");
        let kept = logs.lines_after("ml", "w-0", 0);
        assert_eq!(kept.len(), LINES_PER_POD);
        assert_eq!(kept[0].text, "line 5");
        assert_eq!(kept[0].sequence, 6);
        let after = logs.lines_after("ml", "w-0", (LINES_PER_POD + 3) as u64);
        let texts: Vec<_> = after.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                format!("line {}", LINES_PER_POD + 3),
                format!("line {}", LINES_PER_POD + 4)
            ]
        );
        logs.remove("ml", "w-0");
        assert!(logs.lines_after("ml", "w-0", 0).is_empty());
        assert_eq!(logs.lines_after("ml", "w-1", 0).len(), 1);
    }

    #[test]
    fn timestamps_come_first_in_rfc3339() {
        let line = LogLine {
            sequence: 1,
            time: DateTime::parse_from_rfc3339("2026-01-02T03:04:05.5Z")
                .expect("time")
                .with_timezone(&Utc),
            text: "epoch 1/3".into(),
        };
        assert_eq!(line.render(false), "epoch 1/3\n");
        assert_eq!(
            line.render(true),
            "2026-01-02T03:04:05.500000000Z epoch 1/3\n"
        );
    }
}
