//! GPU job traces in the Tiresias CSV layout, and the gang layout a trace job
//! gets on a cluster.
//!
//! The format is the one of the Tiresias simulator's traces
//! (`job_id,num_gpu,submit_time,iterations,model_name,duration,interval`):
//! a header line naming the columns, then one job per line. Columns are found
//! by name, so their order does not matter; unknown columns are ignored so
//! traces with more fields still load. Two optional columns extend it:
//! `num_workers` (the gang size, otherwise derived by [`gang_layout`]) and
//! `queue` (the TrainingQueue to submit to). An empty optional cell means
//! "not given".
//!
//! `interval` is accepted but not read: `submit_time` is the authority. In
//! the Tiresias file it is the gap from a job's submission to the *next*
//! job's submission, which is what [`to_csv`] writes (0 on the last row).
//!
//! Values are plain: no quoting, so no commas or quotes inside values.
//! Surrounding spaces and Windows line endings are tolerated (the Tiresias
//! file has CRLF endings). Rows must be in submission order, which a replay
//! relies on.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::Error;

/// The Tiresias columns, in the order [`to_csv`] writes them.
pub const TIRESIAS_COLUMNS: [&str; 7] = [
    "job_id",
    "num_gpu",
    "submit_time",
    "iterations",
    "model_name",
    "duration",
    "interval",
];

const HEADER_EXAMPLE: &str = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval";

/// One job of a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceJob {
    /// `job_id`: unique within the trace.
    pub id: String,
    /// `num_gpu`: GPUs the whole job uses, at least 1.
    pub gpus: u32,
    /// `submit_time`: seconds from the start of the trace.
    pub submit_seconds: f64,
    /// `iterations`: training iterations the job runs.
    pub iterations: u64,
    /// `model_name`.
    pub model: String,
    /// `duration`: seconds the job runs once started, greater than 0.
    pub duration_seconds: f64,
    /// `num_workers`: gang size, when the trace fixes it.
    pub workers: Option<u32>,
    /// `queue`: TrainingQueue, when the trace names one.
    pub queue: Option<String>,
}

/// How a job's GPUs are split into gang members (pods).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GangLayout {
    pub workers: u32,
    pub gpus_per_worker: u32,
}

/// Reads and parses a trace file; see [`parse_trace`].
pub fn read_trace(path: &Path) -> Result<Vec<TraceJob>, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_trace(&text)
}

/// Where each known column sits in a row.
struct Columns {
    id: usize,
    gpus: usize,
    submit: usize,
    iterations: usize,
    model: usize,
    duration: usize,
    workers: Option<usize>,
    queue: Option<usize>,
    count: usize,
}

impl Columns {
    fn from_header(header: &str) -> Result<Self, Error> {
        let mut index: HashMap<&str, usize> = HashMap::new();
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        for (i, name) in names.iter().enumerate() {
            if index.insert(name, i).is_some() {
                return Err(Error::DuplicateColumn {
                    column: (*name).to_string(),
                });
            }
        }
        let required = |column: &'static str| {
            index
                .get(column)
                .copied()
                .ok_or(Error::MissingColumn { column })
        };
        Ok(Self {
            id: required("job_id")?,
            gpus: required("num_gpu")?,
            submit: required("submit_time")?,
            iterations: required("iterations")?,
            model: required("model_name")?,
            duration: required("duration")?,
            workers: index.get("num_workers").copied(),
            queue: index.get("queue").copied(),
            count: names.len(),
        })
    }
}

/// Parses trace text: a header line, then one job per line. Blank lines are
/// skipped. Errors name the (1-based) line and the column and say how to fix
/// the value.
pub fn parse_trace(text: &str) -> Result<Vec<TraceJob>, Error> {
    // A UTF-8 byte-order mark would otherwise become part of the first
    // column's name.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty());
    let (_, header) = lines.next().ok_or(Error::MissingHeader {
        example: HEADER_EXAMPLE,
    })?;
    let columns = Columns::from_header(header)?;

    let mut jobs: Vec<TraceJob> = Vec::new();
    let mut first_line_of: HashMap<String, usize> = HashMap::new();
    for (line, row) in lines {
        let fields: Vec<&str> = row.split(',').map(str::trim).collect();
        if fields.len() != columns.count {
            return Err(Error::FieldCount {
                line,
                expected: columns.count,
                found: fields.len(),
            });
        }
        let job = parse_row(line, &fields, &columns)?;
        if let Some(&first_line) = first_line_of.get(&job.id) {
            return Err(Error::DuplicateJobId {
                line,
                id: job.id,
                first_line,
            });
        }
        if let Some(previous) = jobs.last()
            && job.submit_seconds < previous.submit_seconds
        {
            return Err(Error::Unsorted {
                line,
                submit: job.submit_seconds,
                previous: previous.submit_seconds,
            });
        }
        first_line_of.insert(job.id.clone(), line);
        jobs.push(job);
    }
    Ok(jobs)
}

fn parse_row(line: usize, fields: &[&str], c: &Columns) -> Result<TraceJob, Error> {
    let bad = |column: &'static str, value: &str, fix: &'static str| Error::BadValue {
        line,
        column,
        value: value.to_string(),
        fix,
    };
    let text = |column: &'static str, i: usize| -> Result<String, Error> {
        let v = fields[i];
        if v.is_empty() || v.contains('"') {
            return Err(bad(column, v, "give a non-empty value without quotes"));
        }
        Ok(v.to_string())
    };
    let count = |column: &'static str, i: usize| -> Result<u32, Error> {
        let v = fields[i];
        match v.parse::<u32>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(bad(column, v, "give a whole number of at least 1")),
        }
    };
    let seconds = |column: &'static str, i: usize, fix: &'static str| -> Result<f64, Error> {
        let v = fields[i];
        v.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite())
            .ok_or_else(|| bad(column, v, fix))
    };

    let submit_seconds = seconds(
        "submit_time",
        c.submit,
        "give seconds since the trace start as a number of at least 0",
    )?;
    if submit_seconds < 0.0 {
        return Err(bad(
            "submit_time",
            fields[c.submit],
            "give seconds since the trace start as a number of at least 0",
        ));
    }
    let duration_fix = "give the run time in seconds as a number greater than 0";
    let duration_seconds = seconds("duration", c.duration, duration_fix)?;
    if duration_seconds <= 0.0 {
        return Err(bad("duration", fields[c.duration], duration_fix));
    }
    let iterations = fields[c.iterations].parse::<u64>().map_err(|_| {
        bad(
            "iterations",
            fields[c.iterations],
            "give a whole number of at least 0",
        )
    })?;
    let workers = match c.workers {
        Some(i) if !fields[i].is_empty() => Some(count("num_workers", i)?),
        _ => None,
    };
    let queue = match c.queue {
        Some(i) if !fields[i].is_empty() => Some(text("queue", i)?),
        _ => None,
    };
    Ok(TraceJob {
        id: text("job_id", c.id)?,
        gpus: count("num_gpu", c.gpus)?,
        submit_seconds,
        iterations,
        model: text("model_name", c.model)?,
        duration_seconds,
        workers,
        queue,
    })
}

/// Writes jobs as trace CSV with `\n` line endings: the Tiresias columns,
/// then `num_workers` and `queue` only if some job has a value for them (so a
/// plain trace stays in exactly the Tiresias columns). `interval` is the gap
/// to the next job's submission, 0 on the last row. Numbers use Rust's
/// shortest round-trip formatting, so whole seconds are written without a
/// decimal point and [`parse_trace`] reads back the same values.
pub fn to_csv(jobs: &[TraceJob]) -> Result<String, Error> {
    let with_workers = jobs.iter().any(|j| j.workers.is_some());
    let with_queue = jobs.iter().any(|j| j.queue.is_some());
    let mut out = TIRESIAS_COLUMNS.join(",");
    if with_workers {
        out.push_str(",num_workers");
    }
    if with_queue {
        out.push_str(",queue");
    }
    out.push('\n');

    for (i, job) in jobs.iter().enumerate() {
        check_writable(job, "job_id", &job.id)?;
        check_writable(job, "model_name", &job.model)?;
        if let Some(queue) = &job.queue {
            check_writable(job, "queue", queue)?;
        }
        let interval = match jobs.get(i + 1) {
            Some(next) if next.submit_seconds < job.submit_seconds => {
                return Err(Error::Unsorted {
                    line: i + 3,
                    submit: next.submit_seconds,
                    previous: job.submit_seconds,
                });
            }
            Some(next) => next.submit_seconds - job.submit_seconds,
            None => 0.0,
        };
        out.push_str(&format!(
            "{},{},{},{},{},{},{}",
            job.id,
            job.gpus,
            job.submit_seconds,
            job.iterations,
            job.model,
            job.duration_seconds,
            interval
        ));
        if with_workers {
            out.push(',');
            if let Some(w) = job.workers {
                out.push_str(&w.to_string());
            }
        }
        if with_queue {
            out.push(',');
            if let Some(q) = &job.queue {
                out.push_str(q);
            }
        }
        out.push('\n');
    }
    Ok(out)
}

fn check_writable(job: &TraceJob, column: &'static str, value: &str) -> Result<(), Error> {
    let plain =
        !value.is_empty() && value.trim() == value && !value.contains([',', '"', '\n', '\r']);
    if plain {
        Ok(())
    } else {
        Err(Error::Unwritable {
            job: job.id.clone(),
            column,
            value: value.to_string(),
        })
    }
}

/// The gang layout of `job` on nodes with `gpus_per_node` GPUs each.
///
/// If the trace gives `num_workers`, that count is used as is, and it is an
/// error if it does not divide the job's GPUs evenly or leaves a worker more
/// GPUs than a node has: the trace asked for something the cluster cannot
/// run, and silently changing it would replay a different workload.
///
/// Otherwise the minimum is `ceil(gpus / gpus_per_node)` workers (each worker
/// is one pod on one node). Gang members are uniform, so the worker count
/// must divide the GPUs; when the minimum does not, the smallest count above
/// it that does is chosen. For example 10 GPUs on 4-GPU nodes: the minimum 3
/// does not divide 10, 4 does not either, so 5 workers of 2 GPUs. Such a
/// count always exists because `gpus` workers of 1 GPU divides.
pub fn gang_layout(job: &TraceJob, gpus_per_node: u32) -> Result<GangLayout, Error> {
    if gpus_per_node == 0 {
        return Err(Error::InvalidArgument {
            name: "gpus_per_node",
            value: "0".to_string(),
            fix: "give the GPUs of one node, at least 1",
        });
    }
    let gpus = job.gpus;
    let layout_error = |workers: u32, fix: &'static str| Error::GangLayout {
        job: job.id.clone(),
        gpus,
        workers,
        gpus_per_node,
        fix,
    };
    if let Some(workers) = job.workers {
        if workers == 0 || workers > gpus || !gpus.is_multiple_of(workers) {
            return Err(layout_error(
                workers,
                "num_workers must divide num_gpu evenly; change num_workers or leave it empty to derive it",
            ));
        }
        if gpus / workers > gpus_per_node {
            return Err(layout_error(
                workers,
                "a worker would need more GPUs than a node has; raise num_workers or leave it empty to derive it",
            ));
        }
        return Ok(GangLayout {
            workers,
            gpus_per_worker: gpus / workers,
        });
    }
    if gpus == 0 {
        return Err(layout_error(0, "a job needs at least 1 GPU"));
    }
    let minimum = gpus.div_ceil(gpus_per_node);
    let workers = (minimum..=gpus)
        .find(|w| gpus.is_multiple_of(*w))
        .unwrap_or(gpus);
    Ok(GangLayout {
        workers,
        gpus_per_worker: gpus / workers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, gpus: u32, workers: Option<u32>) -> TraceJob {
        TraceJob {
            id: id.to_string(),
            gpus,
            submit_seconds: 0.0,
            iterations: 1,
            model: "resnet50".to_string(),
            duration_seconds: 1.0,
            workers,
            queue: None,
        }
    }

    #[test]
    fn parses_columns_by_name_in_any_order_with_optional_columns() -> Result<(), Error> {
        let text = "queue,duration,model_name,iterations,submit_time,num_gpu,job_id,num_workers,extra\r\n\
                    team-a,120,vgg16,500,0,8,a,2,x\r\n\
                    ,60.5,resnet50,10,3.25,1,b,,y\r\n\
                    \r\n";
        let jobs = parse_trace(text)?;
        assert_eq!(
            jobs,
            vec![
                TraceJob {
                    id: "a".to_string(),
                    gpus: 8,
                    submit_seconds: 0.0,
                    iterations: 500,
                    model: "vgg16".to_string(),
                    duration_seconds: 120.0,
                    workers: Some(2),
                    queue: Some("team-a".to_string()),
                },
                TraceJob {
                    id: "b".to_string(),
                    gpus: 1,
                    submit_seconds: 3.25,
                    iterations: 10,
                    model: "resnet50".to_string(),
                    duration_seconds: 60.5,
                    workers: None,
                    queue: None,
                },
            ]
        );
        Ok(())
    }

    #[test]
    fn bad_value_names_line_column_and_fix() {
        let text = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n\
                    0,1,0,10,vgg16,100,5\n\
                    1,two,5,10,vgg16,100,0\n";
        let err = parse_trace(text).err();
        assert!(
            matches!(
                &err,
                Some(Error::BadValue { line: 3, column: "num_gpu", value, .. }) if value == "two"
            ),
            "{err:?}"
        );
        let message = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("line 3"), "{message}");
        assert!(message.contains("num_gpu"), "{message}");
        assert!(message.contains("whole number"), "{message}");
    }

    #[test]
    fn rejects_structural_problems() {
        let header = "job_id,num_gpu,submit_time,iterations,model_name,duration";
        type Expected = fn(&Error) -> bool;
        let cases: Vec<(String, Expected)> = vec![
            ("\n\n".to_string(), |e| {
                matches!(e, Error::MissingHeader { .. })
            }),
            (
                "job_id,num_gpu,submit_time,iterations,model_name\n".to_string(),
                |e| matches!(e, Error::MissingColumn { column: "duration" }),
            ),
            (
                format!("{header},num_gpu\n"),
                |e| matches!(e, Error::DuplicateColumn { column } if column == "num_gpu"),
            ),
            (format!("{header}\n0,1,0,1,m\n"), |e| {
                matches!(
                    e,
                    Error::FieldCount {
                        line: 2,
                        expected: 6,
                        found: 5
                    }
                )
            }),
            (format!("{header}\n0,1,0,1,m,5\n0,1,1,1,m,5\n"), |e| {
                matches!(
                    e,
                    Error::DuplicateJobId {
                        line: 3,
                        first_line: 2,
                        ..
                    }
                )
            }),
            (format!("{header}\n0,1,9,1,m,5\n1,1,1,1,m,5\n"), |e| {
                matches!(e, Error::Unsorted { line: 3, .. })
            }),
            (format!("{header}\n0,1,0,1,m,0\n"), |e| {
                matches!(
                    e,
                    Error::BadValue {
                        column: "duration",
                        ..
                    }
                )
            }),
            (format!("{header}\n0,1,-1,1,m,5\n"), |e| {
                matches!(
                    e,
                    Error::BadValue {
                        column: "submit_time",
                        ..
                    }
                )
            }),
            (format!("{header}\n0,1,NaN,1,m,5\n"), |e| {
                matches!(
                    e,
                    Error::BadValue {
                        column: "submit_time",
                        ..
                    }
                )
            }),
            (format!("{header}\n0,0,0,1,m,5\n"), |e| {
                matches!(
                    e,
                    Error::BadValue {
                        column: "num_gpu",
                        ..
                    }
                )
            }),
            (format!("{header}\n\"0\",1,0,1,m,5\n"), |e| {
                matches!(
                    e,
                    Error::BadValue {
                        column: "job_id",
                        ..
                    }
                )
            }),
            (format!("{header},num_workers\n0,1,0,1,m,5,0\n"), |e| {
                matches!(
                    e,
                    Error::BadValue {
                        column: "num_workers",
                        ..
                    }
                )
            }),
        ];
        for (text, expected) in cases {
            match parse_trace(&text) {
                Err(e) => assert!(expected(&e), "{text:?} gave {e:?}"),
                Ok(jobs) => panic!("{text:?} parsed as {jobs:?}"),
            }
        }
    }

    #[test]
    fn csv_round_trips_and_writes_gap_to_next_as_interval() -> Result<(), Error> {
        let mut a = job("a", 4, Some(2));
        a.queue = Some("q1".to_string());
        let mut b = job("b", 1, None);
        b.submit_seconds = 12.5;
        b.duration_seconds = 99.75;
        let jobs = vec![a, b];
        let text = to_csv(&jobs)?;
        assert_eq!(
            text,
            "job_id,num_gpu,submit_time,iterations,model_name,duration,interval,num_workers,queue\n\
             a,4,0,1,resnet50,1,12.5,2,q1\n\
             b,1,12.5,1,resnet50,99.75,0,,\n"
        );
        assert_eq!(parse_trace(&text)?, jobs);
        Ok(())
    }

    #[test]
    fn plain_trace_is_written_in_exactly_the_tiresias_columns() -> Result<(), Error> {
        let text = to_csv(&[job("0", 1, None)])?;
        assert_eq!(
            text,
            "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n0,1,0,1,resnet50,1,0\n"
        );
        Ok(())
    }

    #[test]
    fn writer_rejects_values_it_cannot_represent() {
        let mut j = job("a,b", 1, None);
        assert!(matches!(
            to_csv(std::slice::from_ref(&j)),
            Err(Error::Unwritable {
                column: "job_id",
                ..
            })
        ));
        j.id = "a".to_string();
        j.queue = Some(" q".to_string());
        assert!(matches!(
            to_csv(&[j]),
            Err(Error::Unwritable {
                column: "queue",
                ..
            })
        ));
        let mut late = job("late", 1, None);
        late.submit_seconds = 10.0;
        assert!(matches!(
            to_csv(&[late, job("early", 1, None)]),
            Err(Error::Unsorted { .. })
        ));
    }

    #[test]
    fn gang_layout_derives_the_smallest_even_split() -> Result<(), Error> {
        let cases = [
            // (gpus, gpus_per_node, workers, gpus_per_worker)
            (1, 8, 1, 1),
            (8, 8, 1, 8),
            (16, 8, 2, 8),
            (12, 8, 2, 6),
            (10, 4, 5, 2),
            (7, 4, 7, 1),
            (16, 4, 4, 4),
            (6, 4, 2, 3),
        ];
        for (gpus, per_node, workers, gpus_per_worker) in cases {
            assert_eq!(
                gang_layout(&job("j", gpus, None), per_node)?,
                GangLayout {
                    workers,
                    gpus_per_worker
                },
                "{gpus} GPUs on {per_node}-GPU nodes"
            );
        }
        Ok(())
    }

    #[test]
    fn gang_layout_takes_given_workers_literally() -> Result<(), Error> {
        assert_eq!(
            gang_layout(&job("j", 8, Some(4)), 8)?,
            GangLayout {
                workers: 4,
                gpus_per_worker: 2
            }
        );
        assert!(matches!(
            gang_layout(&job("j", 8, Some(3)), 8),
            Err(Error::GangLayout { workers: 3, .. })
        ));
        assert!(matches!(
            gang_layout(&job("j", 16, Some(1)), 8),
            Err(Error::GangLayout { workers: 1, .. })
        ));
        assert!(matches!(
            gang_layout(&job("j", 1, None), 0),
            Err(Error::InvalidArgument { .. })
        ));
        Ok(())
    }

    #[test]
    fn reads_the_tiresias_trace() -> Result<(), Error> {
        let path = Path::new("../../shared/traces/tiresias-60.csv");
        if !path.exists() {
            println!(
                "skipped: {} is absent (it lives outside the project)",
                path.display()
            );
            return Ok(());
        }
        let jobs = read_trace(path)?;
        assert_eq!(jobs.len(), 60);
        assert_eq!(jobs[0].id, "0");
        assert_eq!(jobs[0].submit_seconds, 0.0);
        assert!(
            jobs.iter()
                .all(|j| j.workers.is_none() && j.queue.is_none())
        );
        // The Tiresias testbed: 4-GPU nodes, so 8-GPU jobs are 2 x 4.
        for j in &jobs {
            let layout = gang_layout(j, 4)?;
            assert_eq!(layout.workers * layout.gpus_per_worker, j.gpus);
            assert!(layout.gpus_per_worker <= 4);
        }
        assert_eq!(parse_trace(&to_csv(&jobs)?)?, jobs);
        Ok(())
    }
}
