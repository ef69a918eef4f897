//! An agent's metrics, as `/v1/metrics` shows them: counters, gauges and samples (timings,
//! in milliseconds) held in a metrics-util registry of this agent's own (not the process's
//! global recorder: the simulation runs many agents in one process), rendered in Nomad's JSON
//! (go-metrics' in-memory sink) or Prometheus' text.
//!
//! Unlike go-metrics' in-memory sink, which reports the last 10 s interval, counters and
//! samples are cumulative since the agent started (Prometheus' model); a sample keeps its
//! count, sum, minimum, maximum and a DDSketch for quantiles.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Key, Label};
use metrics_util::registry::{AtomicStorage, Registry};
use metrics_util::storage::Summary;
use serde_json::{Value, json};

/// The labels of one metric, in order.
pub type Labels = Vec<(String, String)>;

/// One sample series, cumulative.
#[derive(Clone)]
struct Series {
    count: u64,
    sum: f64,
    sum_squares: f64,
    min: f64,
    max: f64,
    sketch: Summary,
}

impl Series {
    fn new() -> Self {
        Series {
            count: 0,
            sum: 0.0,
            sum_squares: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            sketch: Summary::with_defaults(),
        }
    }

    fn add(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        self.sum_squares += value * value;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.sketch.add(value);
    }

    fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    fn stddev(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        ((self.sum_squares - self.sum * self.sum / n) / (n - 1.0))
            .max(0.0)
            .sqrt()
    }
}

/// A metric as rendered: its name, labels and value.
pub enum Reading {
    Counter(u64),
    Gauge(f64),
    Sample {
        count: u64,
        sum: f64,
        min: f64,
        max: f64,
        mean: f64,
        stddev: f64,
        quantiles: Vec<(f64, f64)>,
    },
}

pub struct Metrics {
    registry: Registry<Key, AtomicStorage>,
    samples: Mutex<BTreeMap<Key, Series>>,
}

fn key(name: &str, labels: &[(&str, &str)]) -> Key {
    let labels: Vec<Label> = labels
        .iter()
        .map(|(name, value)| Label::new(name.to_string(), value.to_string()))
        .collect();
    Key::from_parts(name.to_string(), labels)
}

fn labels_of(key: &Key) -> Labels {
    key.labels()
        .map(|label| (label.key().to_string(), label.value().to_string()))
        .collect()
}

impl Metrics {
    pub fn new() -> Arc<Metrics> {
        Arc::new(Metrics {
            registry: Registry::atomic(),
            samples: Mutex::new(BTreeMap::new()),
        })
    }

    fn registry(&self) -> &Registry<Key, AtomicStorage> {
        &self.registry
    }

    pub fn increment(&self, name: &str, labels: &[(&str, &str)]) {
        self.registry()
            .get_or_create_counter(&key(name, labels), |counter| counter.fetch_add(1, Ordering::Relaxed));
    }

    pub fn set_gauge(&self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.registry().get_or_create_gauge(&key(name, labels), |gauge| {
            gauge.store(value.to_bits(), Ordering::Relaxed)
        });
    }

    /// A timing, kept in milliseconds as go-metrics' `MeasureSince` keeps it.
    pub fn sample(&self, name: &str, labels: &[(&str, &str)], took: Duration) {
        self.registry()
            .get_or_create_histogram(&key(name, labels), |bucket| bucket.push(took.as_secs_f64() * 1000.0));
    }

    /// Every metric, by name and labels.
    pub fn readings(&self) -> Vec<(String, Labels, Reading)> {
        let mut out = Vec::new();
        self.registry().visit_counters(|key, counter| {
            let reading = Reading::Counter(counter.load(Ordering::Relaxed));
            out.push((key.name().to_string(), labels_of(key), reading));
        });
        self.registry().visit_gauges(|key, gauge| {
            let reading = Reading::Gauge(f64::from_bits(gauge.load(Ordering::Relaxed)));
            out.push((key.name().to_string(), labels_of(key), reading));
        });
        let mut samples = self.samples.lock().expect("samples lock");
        self.registry().visit_histograms(|key, bucket| {
            let series = samples.entry(key.clone()).or_insert_with(Series::new);
            bucket.clear_with(|values| values.iter().for_each(|value| series.add(*value)));
        });
        for (key, series) in samples.iter() {
            let quantiles = [0.5, 0.9, 0.99]
                .iter()
                .filter_map(|q| series.sketch.quantile(*q).map(|value| (*q, value)))
                .collect();
            let reading = Reading::Sample {
                count: series.count,
                sum: series.sum,
                min: if series.count == 0 { 0.0 } else { series.min },
                max: if series.count == 0 { 0.0 } else { series.max },
                mean: series.mean(),
                stddev: series.stddev(),
                quantiles,
            };
            out.push((key.name().to_string(), labels_of(key), reading));
        }
        out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        out
    }
}

fn labels_json(labels: &Labels) -> Value {
    Value::Object(
        labels
            .iter()
            .map(|(name, value)| (name.clone(), Value::String(value.clone())))
            .collect(),
    )
}

/// Nomad's `/v1/metrics` JSON: `Gauges`, `Counters`, `Samples` and `Points`.
pub fn nomad_json(readings: &[(String, Labels, Reading)], timestamp: &str, uptime: Duration) -> Value {
    let (mut gauges, mut counters, mut samples) = (Vec::new(), Vec::new(), Vec::new());
    let seconds = uptime.as_secs_f64().max(1.0);
    for (name, labels, reading) in readings {
        match reading {
            Reading::Gauge(value) => gauges.push(json!({"Name": name, "Value": value, "Labels": labels_json(labels)})),
            Reading::Counter(total) => counters.push(json!({
                "Name": name, "Count": total, "Rate": *total as f64 / seconds, "Sum": total,
                "Min": 1, "Max": 1, "Mean": 1, "Stddev": 0, "Labels": labels_json(labels),
            })),
            Reading::Sample {
                count,
                sum,
                min,
                max,
                mean,
                stddev,
                ..
            } => samples.push(json!({
                "Name": name, "Count": count, "Rate": sum / seconds, "Sum": sum, "Min": min,
                "Max": max, "Mean": mean, "Stddev": stddev, "Labels": labels_json(labels),
            })),
        }
    }
    json!({
        "Timestamp": timestamp,
        "Gauges": gauges,
        "Points": [],
        "Counters": counters,
        "Samples": samples,
    })
}

/// A metric name as Prometheus allows it (go-metrics' prometheus sink: `.` and `-` become `_`).
fn prometheus_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn prometheus_labels(labels: &Labels, extra: Option<(&str, String)>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(name, value)| format!("{}=\"{}\"", prometheus_name(name), escape(value)))
        .collect();
    if let Some((name, value)) = extra {
        parts.push(format!("{name}=\"{value}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Prometheus' text exposition format (0.0.4).
pub fn prometheus_text(readings: &[(String, Labels, Reading)]) -> String {
    let mut out = String::new();
    let mut typed = std::collections::BTreeSet::new();
    for (name, labels, reading) in readings {
        let name = prometheus_name(name);
        let kind = match reading {
            Reading::Counter(_) => "counter",
            Reading::Gauge(_) => "gauge",
            Reading::Sample { .. } => "summary",
        };
        if typed.insert(name.clone()) {
            let _ = writeln!(out, "# TYPE {name} {kind}");
        }
        match reading {
            Reading::Counter(total) => {
                let _ = writeln!(out, "{name}{} {total}", prometheus_labels(labels, None));
            }
            Reading::Gauge(value) => {
                let _ = writeln!(out, "{name}{} {value}", prometheus_labels(labels, None));
            }
            Reading::Sample {
                count, sum, quantiles, ..
            } => {
                for (q, value) in quantiles {
                    let labels = prometheus_labels(labels, Some(("quantile", q.to_string())));
                    let _ = writeln!(out, "{name}{labels} {value}");
                }
                let plain = prometheus_labels(labels, None);
                let _ = writeln!(out, "{name}_sum{plain} {sum}");
                let _ = writeln!(out, "{name}_count{plain} {count}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_render_as_nomads_json_and_prometheus_text() {
        let metrics = Metrics::new();
        metrics.increment("nomad.raft.state.leader", &[]);
        metrics.increment("nomad.raft.state.leader", &[]);
        metrics.set_gauge("nomad.nomad.job_status.running", &[("namespace", "default")], 3.0);
        for ms in [1, 2, 3, 10] {
            metrics.sample("nomad.raft.fsm.apply", &[], Duration::from_millis(ms));
        }
        let readings = metrics.readings();
        let json = nomad_json(&readings, "now", Duration::from_secs(2));
        assert_eq!(json["Counters"][0]["Name"], "nomad.raft.state.leader");
        assert_eq!(json["Counters"][0]["Count"], 2);
        assert_eq!(json["Gauges"][0]["Value"], 3.0);
        assert_eq!(json["Gauges"][0]["Labels"]["namespace"], "default");
        let sample = &json["Samples"][0];
        assert_eq!(
            (sample["Count"].as_u64(), sample["Sum"].as_f64()),
            (Some(4), Some(16.0))
        );
        assert_eq!(
            (sample["Min"].as_f64(), sample["Max"].as_f64()),
            (Some(1.0), Some(10.0))
        );
        // Samples accumulate across reads.
        metrics.sample("nomad.raft.fsm.apply", &[], Duration::from_millis(4));
        let text = prometheus_text(&metrics.readings());
        assert!(
            text.contains("# TYPE nomad_raft_state_leader counter\nnomad_raft_state_leader 2\n"),
            "{text}"
        );
        assert!(
            text.contains("nomad_nomad_job_status_running{namespace=\"default\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("nomad_raft_fsm_apply_count 5\n"), "{text}");
        assert!(text.contains("nomad_raft_fsm_apply_sum 20\n"), "{text}");
        assert!(text.contains("nomad_raft_fsm_apply{quantile=\"0.5\"}"), "{text}");
    }
}
