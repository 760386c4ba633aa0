//! Suspension for idle GPUs, on the cost-optimizer's `cost.idlesuspend`:
//! the running job is told to checkpoint; once a checkpoint written since is
//! verified, `spec.suspend` is set and the job stops the way a user's suspend
//! stops it. Without a verified checkpoint by the stop grace period's end it
//! keeps running: an idle job is never stopped without one. Resuming is
//! setting `spec.suspend` back to false.

use trainyard_api::{ConditionStatus, TrainingJobState, find_condition};
use trainyard_contracts::commands::CheckpointRequested;

use super::{
    CONDITION_SUSPENDED, ConditionUpdate, Context, EventType, PlannerAction, PlannerCommand,
    Verdict, add_seconds,
};
use crate::cost::IdleSuspendSeen;
use crate::status::elapsed;

/// Suspended-condition reasons of an idle suspension.
pub const REASON_IDLE_CHECKPOINTING: &str = "IdleCheckpointing";
pub const REASON_IDLE_SUSPENDING: &str = "IdleSuspending";
pub const REASON_IDLE_SUSPENDED: &str = "IdleSuspended";
pub const REASON_IDLE_SUSPEND_SKIPPED: &str = "IdleSuspendSkipped";

impl Context<'_> {
    /// The one command that resumes the job.
    fn resume_command(&self) -> String {
        format!(
            "kubectl patch trainingjob {} -n {} --type merge -p '{{\"spec\":{{\"suspend\":false}}}}'",
            self.name(),
            self.job.metadata.namespace.as_deref().unwrap_or_default()
        )
    }

    /// What the cost-optimizer saw: utilisation and the idle window.
    fn idle_facts(idle: &IdleSuspendSeen) -> String {
        format!(
            "GPUs idle: mean utilisation {:.0}% from {} to {} ({})",
            idle.request.utilization * 100.0,
            idle.request.idle_since.to_rfc3339(),
            idle.at.to_rfc3339(),
            idle.request.message
        )
    }

    /// The verdict with the idle suspension of the current attempt, if one
    /// was asked for, carried a step further.
    pub(super) fn idle_suspension(&self, mut verdict: Verdict) -> Verdict {
        let Some(idle) = self.state.idle_suspend.as_ref() else {
            return verdict;
        };
        if idle.request.attempt != self.record().attempt {
            return verdict;
        }
        let facts = Self::idle_facts(idle);
        let suspended = self.spec().is_suspended();
        // The request lapses at its deadline: a checkpoint verified later
        // does not stop a job that was told it keeps running.
        let deadline = add_seconds(idle.at, u64::from(self.config.stop_grace_period_seconds));
        let checkpoint = idle
            .verified_checkpoint
            .as_ref()
            .filter(|(_, at)| *at <= deadline)
            .map(|(uri, _)| uri);
        let update = match (verdict.state, checkpoint) {
            (TrainingJobState::Suspended, Some(checkpoint)) if suspended => {
                let message = format!(
                    "suspended for idle GPUs. {facts}; checkpoint {checkpoint} verified. Resume from it with: {}",
                    self.resume_command()
                );
                verdict.reason = REASON_IDLE_SUSPENDED.to_owned();
                verdict.message = message.clone();
                verdict.admitted = ConditionUpdate::new(
                    ConditionStatus::False,
                    REASON_IDLE_SUSPENDED,
                    "suspended for idle GPUs; GPUs released",
                );
                if let Some((_, deadline)) = verdict.checkpoint_now.take() {
                    verdict.checkpoint_now = Some(("suspended for idle GPUs".to_owned(), deadline));
                }
                ConditionUpdate::new(ConditionStatus::True, REASON_IDLE_SUSPENDED, message)
            }
            (TrainingJobState::Running, Some(checkpoint)) if !suspended => {
                verdict.actions.push(PlannerAction::SuspendJob {
                    reason: format!("{facts}; checkpoint {checkpoint} verified"),
                });
                ConditionUpdate::new(
                    ConditionStatus::False,
                    REASON_IDLE_SUSPENDING,
                    format!("{facts}; checkpoint {checkpoint} verified; spec.suspend is being set"),
                )
            }
            (TrainingJobState::Running, None) if !suspended => {
                if self.now < deadline {
                    if self.previous_suspended_reason() != Some(REASON_IDLE_CHECKPOINTING) {
                        verdict.actions.push(PlannerAction::SendCommand {
                            command: PlannerCommand::CheckpointNow(CheckpointRequested {
                                reason: format!("idle GPUs: {}", idle.request.message),
                                deadline,
                            }),
                            dedup_key: format!(
                                "{}/a{}/idle-checkpoint",
                                self.uid(),
                                idle.request.attempt
                            ),
                        });
                    }
                    verdict.actions.push(PlannerAction::RecheckAfter {
                        delay: elapsed(self.now, deadline),
                        reason: "idle suspension checkpoint deadline".to_owned(),
                    });
                    ConditionUpdate::new(
                        ConditionStatus::False,
                        REASON_IDLE_CHECKPOINTING,
                        format!(
                            "{facts}; a checkpoint was requested and the job is suspended once one written since is verified (by {})",
                            deadline.to_rfc3339()
                        ),
                    )
                } else {
                    ConditionUpdate::new(
                        ConditionStatus::False,
                        REASON_IDLE_SUSPEND_SKIPPED,
                        format!(
                            "{facts}; no checkpoint was verified by {}, so the job keeps running (an idle job is never stopped without one)",
                            deadline.to_rfc3339()
                        ),
                    )
                }
            }
            _ => return verdict,
        };
        if verdict.state != TrainingJobState::Suspended
            && self.previous_suspended_reason() != Some(update.reason.as_str())
        {
            let event_type = if update.reason == REASON_IDLE_SUSPEND_SKIPPED {
                EventType::Warning
            } else {
                EventType::Normal
            };
            verdict.actions.push(PlannerAction::RecordEvent {
                event_type,
                reason: update.reason.clone(),
                message: update.message.clone(),
            });
        }
        verdict.suspended = Some(update);
        verdict
    }

    fn previous_suspended_reason(&self) -> Option<&str> {
        find_condition(&self.previous.conditions, CONDITION_SUSPENDED)
            .and_then(|c| c.reason.as_deref())
    }
}
