//! The trace-replay report: job completion time, queueing delay, makespan and
//! GPU utilisation from per-job records, with time series for plotting.
//!
//! Definitions (all times in seconds on the one clock of the records):
//! - job completion time (JCT) = `finished − submitted`, over jobs that
//!   finished successfully (a job that failed early would otherwise look like
//!   a fast one);
//! - queueing delay = `started − submitted`, over jobs that started;
//! - makespan = last `finished` − first `submitted`, over all jobs; `None`
//!   when no job finished;
//! - overall GPU utilisation = GPU-seconds held by started jobs inside the
//!   makespan window ÷ (total GPUs × makespan); a job still running at the
//!   last finish counts until then; failed jobs count, they held the GPUs;
//! - time series, sampled at `t = first submit + k × step` for k = 0, 1, …
//!   while `t` ≤ the last event (submit, start or finish): GPU utilisation =
//!   Σ GPUs of jobs with `started ≤ t < finished` (or not finished) ÷ total
//!   GPUs, and queue depth = jobs with `submitted ≤ t < started` (or not
//!   started). An event at exactly `t` has happened at `t`.
//!
//! Percentiles are nearest-rank ([`crate::percentile`]).

use serde::Serialize;

use crate::Error;
use trainyard_stats::SortedSamples;

/// Most samples a time series may have; a smaller step is almost certainly
/// a unit mistake (milliseconds for seconds) and would build a huge report.
const MAX_SAMPLES: f64 = 1_000_000.0;

/// What happened to one job in a replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRecord {
    pub name: String,
    pub queue: String,
    pub gpus: u32,
    pub submitted: f64,
    pub started: Option<f64>,
    pub finished: Option<f64>,
    /// Meaningful only for finished jobs.
    pub succeeded: bool,
}

/// One time-series sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the first submission.
    pub t_seconds: f64,
    /// Fraction of the cluster's GPUs held by running jobs, 0 to 1.
    pub gpu_utilisation: f64,
    /// Jobs submitted and not yet started.
    pub queue_depth: u32,
}

/// The replay report; serialises to JSON as is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub jobs: usize,
    pub started: usize,
    pub finished: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub total_gpus: u32,
    pub avg_jct_seconds: Option<f64>,
    pub p95_jct_seconds: Option<f64>,
    pub avg_queueing_seconds: Option<f64>,
    pub p95_queueing_seconds: Option<f64>,
    pub makespan_seconds: Option<f64>,
    /// Fraction 0 to 1; `None` when the makespan is `None` or 0.
    pub gpu_utilisation: Option<f64>,
    pub step_seconds: f64,
    pub series: Vec<Sample>,
}

/// Builds the report for `records` on a cluster of `total_gpus` GPUs,
/// sampling the series every `step_seconds`. See the module docs for the
/// definitions. Errors on inconsistent records (a start before the submit, a
/// finish without a start, non-finite times, success without a finish) and
/// on a zero cluster or a step that is not a positive number.
pub fn build_report(
    records: &[JobRecord],
    total_gpus: u32,
    step_seconds: f64,
) -> Result<Report, Error> {
    if total_gpus == 0 {
        return Err(Error::InvalidArgument {
            name: "total_gpus",
            value: "0".to_string(),
            fix: "give the cluster's GPU count, at least 1",
        });
    }
    if !(step_seconds.is_finite() && step_seconds > 0.0) {
        return Err(Error::InvalidArgument {
            name: "step_seconds",
            value: step_seconds.to_string(),
            fix: "give the sampling step in seconds, greater than 0",
        });
    }
    for r in records {
        validate(r)?;
    }

    let started: Vec<&JobRecord> = records.iter().filter(|r| r.started.is_some()).collect();
    let finished: Vec<&JobRecord> = records.iter().filter(|r| r.finished.is_some()).collect();
    let succeeded: Vec<&JobRecord> = finished.iter().copied().filter(|r| r.succeeded).collect();

    let jct = SortedSamples::new(
        succeeded
            .iter()
            .filter_map(|r| r.finished.map(|f| f - r.submitted)),
    );
    let queueing = SortedSamples::new(
        started
            .iter()
            .filter_map(|r| r.started.map(|s| s - r.submitted)),
    );

    let first_submit = records.iter().map(|r| r.submitted).reduce(f64::min);
    let last_finish = records.iter().filter_map(|r| r.finished).reduce(f64::max);
    let makespan = first_submit.zip(last_finish).map(|(a, b)| b - a);
    let gpu_utilisation = match (first_submit, last_finish, makespan) {
        (Some(from), Some(to), Some(span)) if span > 0.0 => {
            let busy: f64 = started
                .iter()
                .filter_map(|r| {
                    let start = r.started?.max(from);
                    let end = r.finished.unwrap_or(to).min(to);
                    Some(f64::from(r.gpus) * (end - start).max(0.0))
                })
                .sum();
            Some(busy / (f64::from(total_gpus) * span))
        }
        _ => None,
    };

    let series = match first_submit {
        Some(from) => series(records, total_gpus, from, step_seconds)?,
        None => Vec::new(),
    };

    Ok(Report {
        jobs: records.len(),
        started: started.len(),
        finished: finished.len(),
        succeeded: succeeded.len(),
        failed: finished.len() - succeeded.len(),
        total_gpus,
        avg_jct_seconds: jct.mean(),
        p95_jct_seconds: jct.percentile(95.0),
        avg_queueing_seconds: queueing.mean(),
        p95_queueing_seconds: queueing.percentile(95.0),
        makespan_seconds: makespan,
        gpu_utilisation,
        step_seconds,
        series,
    })
}

fn validate(r: &JobRecord) -> Result<(), Error> {
    let bad = |problem: &'static str| {
        Err(Error::InvalidRecord {
            job: r.name.clone(),
            problem,
        })
    };
    let times = [Some(r.submitted), r.started, r.finished];
    if times.into_iter().flatten().any(|t| !t.is_finite()) {
        return bad("a time is not a finite number");
    }
    match (r.started, r.finished) {
        (Some(s), _) if s < r.submitted => bad("started is before submitted"),
        (Some(s), Some(f)) if f < s => bad("finished is before started"),
        (None, Some(_)) => bad("finished is set but started is not"),
        (_, None) if r.succeeded => bad("succeeded is true but finished is not set"),
        _ => Ok(()),
    }
}

/// One change to the running GPUs or the queue, at a time.
struct Event {
    at: f64,
    gpus: i64,
    queued: i64,
}

fn series(
    records: &[JobRecord],
    total_gpus: u32,
    from: f64,
    step: f64,
) -> Result<Vec<Sample>, Error> {
    let mut events: Vec<Event> = Vec::with_capacity(records.len() * 3);
    for r in records {
        let gpus = i64::from(r.gpus);
        events.push(Event {
            at: r.submitted,
            gpus: 0,
            queued: 1,
        });
        if let Some(s) = r.started {
            events.push(Event {
                at: s,
                gpus,
                queued: -1,
            });
        }
        if let Some(f) = r.finished {
            events.push(Event {
                at: f,
                gpus: -gpus,
                queued: 0,
            });
        }
    }
    events.sort_by(|a, b| a.at.total_cmp(&b.at));
    let last = events.last().map_or(from, |e| e.at);
    let count = ((last - from) / step).floor();
    if count >= MAX_SAMPLES {
        return Err(Error::InvalidArgument {
            name: "step_seconds",
            value: step.to_string(),
            fix: "the series would exceed a million samples; use a larger step (it is in seconds)",
        });
    }

    let mut out = Vec::with_capacity(count as usize + 1);
    let (mut running, mut queued, mut next) = (0i64, 0i64, 0usize);
    for k in 0..=count as u64 {
        // Multiplying rather than adding step each time keeps sample times
        // free of accumulated rounding.
        let t = from + k as f64 * step;
        while let Some(e) = events.get(next).filter(|e| e.at <= t) {
            running += e.gpus;
            queued += e.queued;
            next += 1;
        }
        out.push(Sample {
            t_seconds: t - from,
            gpu_utilisation: running as f64 / f64::from(total_gpus),
            queue_depth: u32::try_from(queued).unwrap_or(0),
        });
    }
    Ok(out)
}

fn seconds(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |s| format!("{s:.1} s"))
}

fn percent(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), |u| format!("{:.1} %", u * 100.0))
}

/// The report as a plain two-column text table, labels left-aligned and
/// values right-aligned, one metric per line; `-` marks a metric with no
/// data. The time series is summarised by its peaks, not listed.
pub fn render_table(report: &Report) -> String {
    let peak_util = report
        .series
        .iter()
        .map(|s| s.gpu_utilisation)
        .reduce(f64::max);
    let peak_queue = report.series.iter().map(|s| s.queue_depth).max();
    let rows: Vec<(&str, String)> = vec![
        ("jobs", report.jobs.to_string()),
        ("started", report.started.to_string()),
        ("finished", report.finished.to_string()),
        ("succeeded", report.succeeded.to_string()),
        ("failed", report.failed.to_string()),
        ("cluster GPUs", report.total_gpus.to_string()),
        ("avg job completion time", seconds(report.avg_jct_seconds)),
        ("p95 job completion time", seconds(report.p95_jct_seconds)),
        ("avg queueing delay", seconds(report.avg_queueing_seconds)),
        ("p95 queueing delay", seconds(report.p95_queueing_seconds)),
        ("makespan", seconds(report.makespan_seconds)),
        ("GPU utilisation", percent(report.gpu_utilisation)),
        ("peak GPU utilisation", percent(peak_util)),
        (
            "peak queue depth",
            peak_queue.map_or_else(|| "-".to_string(), |q| q.to_string()),
        ),
    ];
    let label_width = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let value_width = rows
        .iter()
        .map(|(_, v)| v.chars().count())
        .max()
        .unwrap_or(0);
    rows.iter()
        .map(|(label, value)| format!("{label:<label_width$}  {value:>value_width$}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        name: &str,
        gpus: u32,
        submitted: f64,
        started: Option<f64>,
        finished: Option<f64>,
    ) -> JobRecord {
        JobRecord {
            name: name.to_string(),
            queue: "q".to_string(),
            gpus,
            submitted,
            started,
            finished,
            succeeded: finished.is_some(),
        }
    }

    /// Four jobs on 8 GPUs:
    /// a: 4 GPUs, submit 0, run 0–10
    /// b: 4 GPUs, submit 0, run 0–20
    /// c: 8 GPUs, submit 5, run 20–30 (waits 15)
    /// d: 2 GPUs, submit 10, failed, run 10–12
    fn four() -> Vec<JobRecord> {
        let mut d = rec("d", 2, 10.0, Some(10.0), Some(12.0));
        d.succeeded = false;
        vec![
            rec("a", 4, 0.0, Some(0.0), Some(10.0)),
            rec("b", 4, 0.0, Some(0.0), Some(20.0)),
            rec("c", 8, 5.0, Some(20.0), Some(30.0)),
            d,
        ]
    }

    #[test]
    fn summary_figures() -> Result<(), Error> {
        let r = build_report(&four(), 8, 5.0)?;
        assert_eq!(
            (r.jobs, r.started, r.finished, r.succeeded, r.failed),
            (4, 4, 4, 3, 1)
        );
        // JCT over succeeded jobs: 10, 20, 25.
        assert_eq!(r.avg_jct_seconds, Some(55.0 / 3.0));
        assert_eq!(r.p95_jct_seconds, Some(25.0));
        // Queueing over started jobs: 0, 0, 15, 0.
        assert_eq!(r.avg_queueing_seconds, Some(3.75));
        assert_eq!(r.p95_queueing_seconds, Some(15.0));
        assert_eq!(r.makespan_seconds, Some(30.0));
        // GPU-seconds: 40 + 80 + 80 + 4 = 204 of 8 × 30 = 240.
        assert_eq!(r.gpu_utilisation, Some(204.0 / 240.0));
        Ok(())
    }

    #[test]
    fn series_counts_events_at_the_sample_instant() -> Result<(), Error> {
        let r = build_report(&four(), 8, 5.0)?;
        let got: Vec<(f64, f64, u32)> = r
            .series
            .iter()
            .map(|s| (s.t_seconds, s.gpu_utilisation, s.queue_depth))
            .collect();
        assert_eq!(
            got,
            vec![
                (0.0, 1.0, 0),
                (5.0, 1.0, 1),
                // a finished at 10 (4 free), d started at 10 (2 taken).
                (10.0, 0.75, 1),
                (15.0, 0.5, 1),
                (20.0, 1.0, 0),
                (25.0, 1.0, 0),
                (30.0, 0.0, 0),
            ]
        );
        Ok(())
    }

    #[test]
    fn unstarted_and_running_jobs() -> Result<(), Error> {
        let records = vec![
            rec("done", 2, 100.0, Some(100.0), Some(110.0)),
            rec("running", 2, 100.0, Some(105.0), None),
            rec("waiting", 4, 101.0, None, None),
        ];
        let r = build_report(&records, 4, 10.0)?;
        assert_eq!((r.started, r.finished, r.succeeded), (2, 1, 1));
        assert_eq!(r.makespan_seconds, Some(10.0));
        // done: 2 × 10, running: 2 × 5 (clipped at the last finish).
        assert_eq!(r.gpu_utilisation, Some(30.0 / 40.0));
        assert_eq!(r.series.len(), 2);
        assert_eq!(r.series[1].gpu_utilisation, 0.5);
        assert_eq!(r.series[1].queue_depth, 1);
        Ok(())
    }

    #[test]
    fn empty_and_unfinished_give_none() -> Result<(), Error> {
        let r = build_report(&[], 8, 1.0)?;
        assert_eq!(r.makespan_seconds, None);
        assert!(r.series.is_empty());
        let r = build_report(&[rec("w", 1, 3.0, None, None)], 8, 1.0)?;
        assert_eq!(r.avg_jct_seconds, None);
        assert_eq!(r.avg_queueing_seconds, None);
        assert_eq!(r.gpu_utilisation, None);
        assert_eq!(r.series.len(), 1);
        assert_eq!(r.series[0].queue_depth, 1);
        Ok(())
    }

    #[test]
    fn rejects_inconsistent_input() {
        let bad_records = [
            rec("x", 1, 5.0, Some(4.0), None),
            rec("x", 1, 5.0, Some(6.0), Some(5.5)),
            rec("x", 1, 5.0, None, Some(6.0)),
            rec("x", 1, f64::NAN, None, None),
            JobRecord {
                succeeded: true,
                ..rec("x", 1, 5.0, Some(6.0), None)
            },
        ];
        for r in bad_records {
            assert!(
                matches!(
                    build_report(std::slice::from_ref(&r), 8, 1.0),
                    Err(Error::InvalidRecord { .. })
                ),
                "{r:?}"
            );
        }
        assert!(build_report(&four(), 0, 1.0).is_err());
        assert!(build_report(&four(), 8, 0.0).is_err());
        assert!(build_report(&four(), 8, f64::INFINITY).is_err());
        assert!(build_report(&four(), 8, 1e-6).is_err());
    }

    #[test]
    fn table_is_aligned_and_serialises() -> Result<(), Box<dyn std::error::Error>> {
        let r = build_report(&four(), 8, 5.0)?;
        let table = render_table(&r);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines.len() > 10);
        let width = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == width), "{table}");
        assert!(table.contains("makespan"));
        assert!(table.contains("30.0 s"));
        assert!(table.contains("85.0 %"));
        let json = serde_json::to_value(&r)?;
        assert_eq!(json["makespan_seconds"], 30.0);
        assert_eq!(json["series"][1]["queue_depth"], 1);
        Ok(())
    }
}
