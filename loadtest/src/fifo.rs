//! A reference for trace replays: the same jobs under strict FIFO with
//! best-fit gang placement, computed as a discrete-event simulation (no
//! services, no delays). Head-of-line blocking is the point of comparison: the
//! first job in the queue that does not fit makes every later job wait.

use std::collections::VecDeque;

use crate::report::JobRecord;

/// One job as the reference sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct FifoJob {
    pub name: String,
    pub queue: String,
    pub submitted: f64,
    pub duration: f64,
    pub workers: u32,
    pub gpus_per_worker: u32,
}

struct Running {
    end: f64,
    placement: Vec<usize>,
    gpus_per_worker: u32,
}

/// Places every worker on the node with the fewest free GPUs that still has
/// enough (packing, as the simulated scheduler does); `None` if a worker
/// does not fit.
fn place(free: &[u32], job: &FifoJob) -> Option<Vec<usize>> {
    let mut left = free.to_vec();
    let mut placement = Vec::with_capacity(job.workers as usize);
    for _ in 0..job.workers {
        let node = (0..left.len())
            .filter(|&n| left[n] >= job.gpus_per_worker)
            .min_by_key(|&n| left[n])?;
        left[node] -= job.gpus_per_worker;
        placement.push(node);
    }
    Some(placement)
}

/// Job records of `jobs` (in submission order) under strict FIFO on `nodes`
/// nodes of `gpus_per_node` GPUs. A job that could not run even on an empty
/// cluster is left unstarted and no longer blocks the queue.
pub fn fifo_records(jobs: &[FifoJob], nodes: usize, gpus_per_node: u32) -> Vec<JobRecord> {
    let mut free = vec![gpus_per_node; nodes];
    let mut started: Vec<Option<f64>> = vec![None; jobs.len()];
    let mut running: Vec<Running> = Vec::new();
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut next_arrival = 0;
    let mut now = 0.0;
    loop {
        while let Some(i) = running.iter().position(|r| r.end <= now) {
            let done = running.swap_remove(i);
            for node in done.placement {
                free[node] += done.gpus_per_worker;
            }
        }
        while next_arrival < jobs.len() && jobs[next_arrival].submitted <= now {
            queue.push_back(next_arrival);
            next_arrival += 1;
        }
        while let Some(&head) = queue.front() {
            let job = &jobs[head];
            match place(&free, job) {
                Some(placement) => {
                    for &node in &placement {
                        free[node] -= job.gpus_per_worker;
                    }
                    started[head] = Some(now);
                    running.push(Running {
                        end: now + job.duration,
                        placement,
                        gpus_per_worker: job.gpus_per_worker,
                    });
                    queue.pop_front();
                }
                None if running.is_empty() => {
                    queue.pop_front();
                }
                None => break,
            }
        }
        let next_end = running.iter().map(|r| r.end).reduce(f64::min);
        let arrival = jobs.get(next_arrival).map(|j| j.submitted);
        now = match (next_end, arrival) {
            (Some(a), Some(b)) => a.min(b),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => break,
        };
    }
    jobs.iter()
        .zip(started)
        .map(|(job, started)| JobRecord {
            name: job.name.clone(),
            queue: job.queue.clone(),
            gpus: job.workers * job.gpus_per_worker,
            submitted: job.submitted,
            started,
            finished: started.map(|s| s + job.duration),
            succeeded: started.is_some(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, submitted: f64, duration: f64, workers: u32, gpus: u32) -> FifoJob {
        FifoJob {
            name: name.into(),
            queue: "default".into(),
            submitted,
            duration,
            workers,
            gpus_per_worker: gpus,
        }
    }

    #[test]
    fn the_head_of_the_queue_blocks_later_jobs() {
        // Two 4-GPU nodes. `a` takes one node; `big` needs both and waits for
        // `a`; `small` would fit beside `a` but waits behind `big`.
        let jobs = [
            job("a", 0.0, 100.0, 1, 4),
            job("big", 10.0, 50.0, 2, 4),
            job("small", 20.0, 10.0, 1, 1),
        ];
        let records = fifo_records(&jobs, 2, 4);
        let times: Vec<_> = records.iter().map(|r| (r.started, r.finished)).collect();
        assert_eq!(
            times,
            [
                (Some(0.0), Some(100.0)),
                (Some(100.0), Some(150.0)),
                (Some(150.0), Some(160.0)),
            ]
        );
    }

    #[test]
    fn a_job_larger_than_the_cluster_is_skipped() {
        let jobs = [job("huge", 0.0, 10.0, 3, 4), job("ok", 1.0, 10.0, 1, 2)];
        let records = fifo_records(&jobs, 2, 4);
        assert_eq!(records[0].started, None);
        assert_eq!(records[1].started, Some(1.0));
        assert!(records[1].succeeded && !records[0].succeeded);
    }

    #[test]
    fn workers_pack_onto_the_fullest_node_that_fits() {
        let free = [4, 1, 2];
        let placement = place(&free, &job("j", 0.0, 1.0, 2, 1)).expect("fits");
        assert_eq!(placement, vec![1, 2]);
    }
}
