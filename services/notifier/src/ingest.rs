//! Consuming: each message becomes events, each event is routed, and each
//! (event, destination) pair is written to the outbox before the message is acked;
//! what a message says about a queued job's wait is folded into it first.

use chrono::Utc;
use notifier_core::queued::observation_of;
use notifier_core::{CoreError, events_of};
use trainyard_contracts::Incoming;
use trainyard_runtime::{Delivery, HandleError, Handler};

use crate::live::LiveConfig;
use crate::metrics::NotifierMetrics;
use crate::outbox::{EntryState, Outbox, OutboxEntry, entry_key};
use crate::queued::Waits;

pub struct Ingest {
    pub config: LiveConfig,
    pub outbox: Outbox,
    pub metrics: NotifierMetrics,
    pub waits: Waits,
}

fn reject(err: CoreError) -> HandleError {
    HandleError::Reject {
        category: err.category(),
        reason: err.to_string(),
    }
}

impl Handler for Ingest {
    async fn handle(&self, message: Incoming, _delivery: Delivery) -> Result<(), HandleError> {
        let events = events_of(&message).map_err(reject)?;
        if let Some(observation) = observation_of(&message).map_err(reject)? {
            self.waits
                .observe(&message.header.entity, &observation, message.header.time)
                .await
                .map_err(HandleError::Retry)?;
        }
        let live = self.config.get();
        for event in events {
            let outcome = live.routing.route(&event);
            for refused in &outcome.refused {
                tracing::info!(%refused, "subscription refused");
            }
            if outcome.muted > 0 {
                self.metrics
                    .notifications
                    .with_label_values(&["", "muted"])
                    .inc_by(outcome.muted as u64);
            }
            for routed in outcome.routed {
                let key = entry_key(&routed, &event.id);
                let entry = OutboxEntry {
                    routed,
                    event: event.clone(),
                    state: EntryState::Pending,
                    stored_at: Utc::now(),
                };
                self.outbox
                    .create(&key, &entry)
                    .await
                    .map_err(HandleError::Retry)?;
            }
        }
        Ok(())
    }

    fn lanes(&self) -> usize {
        // Order across jobs does not matter; each event is its own entry.
        16
    }
}
