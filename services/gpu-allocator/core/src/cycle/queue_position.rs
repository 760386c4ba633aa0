//! Queue position: a pending job's 1-based place among the jobs of its
//! queue still waiting after this cycle (admitted jobs left the line), and
//! the queue's length, known once every job was seen.

use crate::ids::QueueIdx;
use crate::pending::Pending;

/// Jobs found waiting so far, per queue slot.
#[derive(Default)]
pub(crate) struct QueuePositions {
    waiting: Vec<u32>,
}

impl QueuePositions {
    /// Positions for `queues` queue slots, none waiting yet.
    pub(crate) fn new(queues: usize) -> Self {
        QueuePositions {
            waiting: vec![0; queues],
        }
    }

    /// The position of the next job of `queue` found waiting; `None` for a
    /// slot outside the queue table.
    pub(crate) fn next(&mut self, queue: QueueIdx) -> Option<u32> {
        let waiting = self.waiting.get_mut(queue.slot())?;
        *waiting += 1;
        Some(*waiting)
    }

    /// Sets every entry's queue length: its queue's count of jobs waiting.
    pub(crate) fn set_lengths(&self, pending: &mut [Pending]) {
        for p in pending {
            p.queue_length = self.waiting.get(p.queue.slot()).copied().unwrap_or(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{JobIdx, ReasonIdx};

    fn entry(queue: u32, position: u32) -> Pending {
        Pending {
            job: JobIdx::from(position),
            seq: u64::from(position),
            queue: QueueIdx::from(queue),
            position,
            queue_length: 0,
            effective_priority: 0,
            reason: ReasonIdx::from(0),
        }
    }

    #[test]
    fn positions_count_per_queue_and_lengths_are_the_final_counts() {
        let mut positions = QueuePositions::new(2);
        let seen: Vec<Option<u32>> = [0, 1, 0, 0, 1, 2]
            .into_iter()
            .map(|q| positions.next(QueueIdx::from(q)))
            .collect();
        assert_eq!(seen, [Some(1), Some(1), Some(2), Some(3), Some(2), None]);
        let mut pending = vec![entry(0, 1), entry(1, 1), entry(0, 2)];
        positions.set_lengths(&mut pending);
        let lengths: Vec<u32> = pending.iter().map(|p| p.queue_length).collect();
        assert_eq!(lengths, [3, 2, 3]);
    }
}
