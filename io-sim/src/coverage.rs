//! Per-run coverage of the core's state machines and rare paths: a `tracing` subscriber for
//! the simulation thread that counts the core's coverage events (`drover_core::cover`) and
//! nothing else. madsim runs a whole simulated cluster on one thread, so one subscriber set
//! as that thread's default sees every node's events.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Counts by key: `"<machine>: <from> -> <to>"` for a transition, `"point: <name>"`.
#[derive(Clone, Default)]
pub struct CoverageCounter {
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl CoverageCounter {
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.counts.lock().expect("coverage lock").clone()
    }
}

#[derive(Default)]
struct Fields {
    machine: Option<String>,
    from: Option<String>,
    to: Option<String>,
    point: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        let slot = match field.name() {
            "machine" => &mut self.machine,
            "from" => &mut self.from,
            "to" => &mut self.to,
            "point" => &mut self.point,
            _ => return,
        };
        *slot = Some(value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl Subscriber for CoverageCounter {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == drover_core::cover::TARGET
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let key = match fields {
            Fields {
                machine: Some(machine),
                from: Some(from),
                to: Some(to),
                ..
            } => format!("{machine}: {from} -> {to}"),
            Fields { point: Some(point), .. } => format!("point: {point}"),
            _ => return,
        };
        *self.counts.lock().expect("coverage lock").entry(key).or_default() += 1;
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}
