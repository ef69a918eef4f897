//! What the servers are told, one request at a time per subject (alloc status, CSI info,
//! drivers, node events), and failed store writes raised as `Storage` node events.

use super::*;
use crate::structs::AllocClientReport;

impl Client {
    pub(super) fn persist_failed(&mut self, now: Instant, record: String, error: String) {
        tracing::error!(%record, %error, "persisting client state failed");
        self.persist_failures_unreported += 1;
        let quiet = self
            .persist_event_at
            .is_none_or(|at| now.saturating_duration_since(at) >= PERSIST_EVENT_INTERVAL);
        if !quiet {
            return;
        }
        let mut details = BTreeMap::new();
        details.insert("record".to_string(), record);
        details.insert("failures".to_string(), self.persist_failures_unreported.to_string());
        self.persist_event_at = Some(now);
        self.persist_failures_unreported = 0;
        self.node_event(
            now,
            ClientNodeEvent {
                subsystem: "Storage".into(),
                message: format!("client state could not be persisted: {error}"),
                details,
            },
        );
    }

    /// What the servers should hear of one allocation now: its status and its tasks' states.
    fn alloc_report(&self, alloc_id: &str) -> Option<AllocClientReport> {
        let status = self.statuses.get(alloc_id)?;
        Some(AllocClientReport {
            alloc_id: alloc_id.to_string(),
            client_status: *status,
            task_states: self
                .allocs
                .get(alloc_id)
                .map(AllocRunner::task_states)
                .unwrap_or_default(),
            deployment_status: self.health.status(alloc_id, self.wall_epoch),
        })
    }

    /// The client stops tracking an allocation's status; a last report the servers have not
    /// accepted yet is kept until they do (an allocation stopped and collected within one
    /// batch interval must still be reported complete).
    pub(super) fn forget_status(&mut self, now: Instant, alloc_id: &str) {
        if let Some(last) = self.alloc_report(alloc_id)
            && self.allocs_acked.get(alloc_id) != Some(&last)
        {
            self.final_reports.insert(alloc_id.to_string(), last);
        }
        self.statuses.remove(alloc_id);
        self.report(now, Report::Allocs);
    }

    /// The request that reports `report`'s latest value.
    pub(super) fn report_request(&self, report: &Report) -> Option<ServerRequest> {
        match report {
            Report::Allocs => {
                let updates: Vec<AllocClientReport> = self
                    .statuses
                    .keys()
                    .filter_map(|alloc_id| self.alloc_report(alloc_id))
                    .chain(self.final_reports.values().cloned())
                    .filter(|update| self.allocs_acked.get(&update.alloc_id) != Some(update))
                    .collect();
                (!updates.is_empty()).then(|| ServerRequest::AllocClientUpdates {
                    node_id: self.settings.node_id.clone(),
                    secret_id: self.link.secret_id().to_string(),
                    updates,
                })
            }
            Report::CsiInfo => Some(ServerRequest::NodeUpdateCsiInfo {
                node_id: self.settings.node_id.clone(),
                secret_id: self.link.secret_id().to_string(),
                controllers: self.node_controllers.clone(),
                nodes: self.node_plugins.clone(),
            }),
            Report::Drivers => Some(ServerRequest::NodeUpdateDrivers {
                node_id: self.settings.node_id.clone(),
                secret_id: self.link.secret_id().to_string(),
                drivers: self.driver_infos.clone(),
            }),
            Report::NodeEvents => (!self.pending_events.is_empty()).then(|| ServerRequest::NodeEmitEvents {
                node_id: self.settings.node_id.clone(),
                secret_id: self.link.secret_id().to_string(),
                events: self
                    .pending_events
                    .iter()
                    .take(MAX_RETAINED_NODE_EVENTS)
                    .map(|event| NodeEvent {
                        message: event.message.clone(),
                        subsystem: event.subsystem.clone(),
                        details: event.details.clone(),
                        ..NodeEvent::default()
                    })
                    .collect(),
            }),
        }
    }

    /// Sends the latest value of `report` unless one is in flight, waiting to be retried, or
    /// already acknowledged.
    pub(super) fn report(&mut self, now: Instant, report: Report) {
        if self.reports_in_flight.contains_key(&report) || self.reports_retry.get(&report).is_some_and(|at| now < *at) {
            return;
        }
        if report == Report::Allocs {
            // Acknowledgements of allocations this client no longer reports are dropped.
            let (statuses, finals) = (&self.statuses, &self.final_reports);
            self.allocs_acked
                .retain(|id, _| statuses.contains_key(id) || finals.contains_key(id));
            if let Some(at) = self.allocs_batch_at.filter(|at| now < *at) {
                // Sent less than an interval ago: this change goes with the next batch.
                self.reports_retry.insert(report, at);
                return;
            }
        }
        self.reports_retry.remove(&report);
        let Some(request) = self.report_request(&report) else {
            return;
        };
        if report == Report::Allocs {
            self.allocs_batch_at = Some(now + ALLOC_UPDATE_INTERVAL);
        }
        if self.reports_acked.get(&report) == Some(&request) {
            return;
        }
        let op = self.ops.allocate();
        self.routes.insert(op, Route::Report(report.clone()));
        self.reports_in_flight.insert(report, (op, request.clone()));
        self.actions.push_back(ClientAction::Io {
            op,
            io: Io::Server(request),
        });
    }
}
