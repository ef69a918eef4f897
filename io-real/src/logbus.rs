//! The agent's log lines for `GET /v1/agent/monitor` (Nomad's `agent monitor`): a tracing
//! layer that formats each event as Nomad's log line (`2026-11-30T13:00:00.000Z [INFO]
//! message: key=value`) and hands it to every monitor watching, at the level each asked for
//! — which may be more verbose than the agent's own `-log-level`.
//!
//! It costs nothing while nobody watches: the layer's filter asks for no event unless a
//! monitor is open, and then only down to the most verbose level one asked for. The
//! transports' frame-by-frame lines stay out at DEBUG and TRACE, as they do in the agent's
//! own log.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::broadcast;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Lines kept for a monitor that falls behind; beyond it the oldest are skipped.
const BACKLOG: usize = 1_024;

/// The libraries under the agent's transports: at DEBUG and TRACE they log every HTTP/2 frame
/// and TLS record (86 % of 463 MB in five minutes of a DEBUG agent under load, issue 54 §9),
/// so neither the agent's own log (the bin's `-log-level` filter) nor a monitor takes their
/// lines below INFO.
pub const TRANSPORT_LOG_TARGETS: &[&str] = &["h2", "hyper", "hyper_util", "tonic", "tower", "rustls", "tokio_rustls"];

/// Targets whose DEBUG and TRACE lines never reach a monitor: the transports, and openraft
/// (whose lines never do: the agent logs Raft's events itself).
fn quiet_targets() -> impl Iterator<Item = &'static str> {
    TRANSPORT_LOG_TARGETS.iter().copied().chain(["openraft"])
}

/// One formatted line and its level.
#[derive(Clone, Debug)]
pub struct LogLine {
    pub level: Level,
    pub text: String,
}

struct Bus {
    lines: broadcast::Sender<LogLine>,
    /// How many monitors want each level (index: TRACE 0 … ERROR 4).
    wanted: [AtomicUsize; 5],
}

fn bus() -> &'static Bus {
    static BUS: OnceLock<Bus> = OnceLock::new();
    BUS.get_or_init(|| Bus {
        lines: broadcast::channel(BACKLOG).0,
        wanted: Default::default(),
    })
}

fn rank(level: &Level) -> usize {
    match *level {
        Level::TRACE => 0,
        Level::DEBUG => 1,
        Level::INFO => 2,
        Level::WARN => 3,
        Level::ERROR => 4,
    }
}

/// Nomad's `-log-level` names (any case).
pub fn parse_level(text: &str) -> Option<Level> {
    match text.to_ascii_lowercase().as_str() {
        "trace" => Some(Level::TRACE),
        "debug" => Some(Level::DEBUG),
        "info" => Some(Level::INFO),
        "warn" => Some(Level::WARN),
        "error" => Some(Level::ERROR),
        _ => None,
    }
}

/// A monitor's view of the log: the lines at `level` or above from now on. Dropping it stops
/// them.
pub struct Watch {
    level: Level,
    lines: broadcast::Receiver<LogLine>,
}

impl Watch {
    pub fn new(level: Level) -> Self {
        let bus = bus();
        bus.wanted[rank(&level)].fetch_add(1, Ordering::SeqCst);
        Watch {
            level,
            lines: bus.lines.subscribe(),
        }
    }

    /// The next line at the watched level (lines missed while behind are skipped); `None`
    /// once the agent's log has ended.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            match self.lines.recv().await {
                Ok(line) if line.level <= self.level => return Some(line.text),
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        bus().wanted[rank(&self.level)].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether some monitor wants events like these.
fn wanted(metadata: &Metadata<'_>) -> bool {
    let level = rank(metadata.level());
    let wanted = &bus().wanted;
    // A monitor at level L wants every event at L or above: anyone at or below this rank.
    if !(0..=level).any(|at| wanted[at].load(Ordering::Relaxed) > 0) {
        return false;
    }
    !(is_quiet(metadata) && (metadata.target().starts_with("openraft") || level < rank(&Level::INFO)))
}

fn is_quiet(metadata: &Metadata<'_>) -> bool {
    quiet_targets().any(|target| {
        metadata
            .target()
            .strip_prefix(target)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// The layer to install beside the agent's own log output.
pub fn layer<S: Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>>() -> impl Layer<S> {
    Monitors.with_filter(Wanted)
}

/// [`wanted`], asked of every event: a callsite's interest must never be cached, for whether
/// anyone watches changes while the agent runs (the default would decide once, when the
/// callsite is first hit, usually before any monitor opened).
struct Wanted;

impl<S> tracing_subscriber::layer::Filter<S> for Wanted {
    fn enabled(&self, metadata: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        wanted(metadata)
    }

    fn callsite_enabled(&self, metadata: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        // What no monitor ever gets stays free: openraft's own lines (the agent logs Raft's
        // events itself) and the transports' fine ones.
        if is_quiet(metadata) && (metadata.target().starts_with("openraft") || *metadata.level() > Level::INFO) {
            tracing::subscriber::Interest::never()
        } else {
            tracing::subscriber::Interest::sometimes()
        }
    }
}

struct Monitors;

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            if !self.message.is_empty() {
                self.message.push_str(": ");
            }
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            if !self.message.is_empty() {
                self.message.push_str(": ");
            }
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for Monitors {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = *event.metadata().level();
        let text = format!(
            "{} [{}] {}:{}{}\n",
            chrono::DateTime::<chrono::Utc>::from_timestamp_millis(crate::clock::unix_millis() as i64)
                .unwrap_or_default()
                .format("%Y-%m-%dT%H:%M:%S%.3fZ"),
            level,
            event.metadata().target(),
            if fields.message.is_empty() {
                String::new()
            } else {
                format!(" {}", fields.message)
            },
            if fields.rest.is_empty() {
                String::new()
            } else {
                format!(":{}", fields.rest)
            },
        );
        let _ = bus().lines.send(LogLine { level, text });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[tokio::test]
    async fn a_watch_sees_lines_at_its_level_and_above_only_while_it_watches() {
        let subscriber = tracing_subscriber::registry().with(layer());
        let _guard = tracing::subscriber::set_default(subscriber);
        // The same callsites are hit before anyone watches and after: whether to log them is
        // decided each time.
        let log = |step: u32| {
            tracing::debug!(step, "fine detail");
            tracing::info!(alloc = "a1", step, "task started");
            tracing::warn!(step, "disk slow");
        };
        log(0);
        let mut watch = Watch::new(Level::INFO);
        log(1);
        let first = watch.next().await.unwrap();
        assert!(
            first.contains(" [INFO] ") && first.ends_with("task started: alloc=a1 step=1\n"),
            "{first}"
        );
        assert!(watch.next().await.unwrap().contains(" [WARN] "));
        drop(watch);
        let mut fine = Watch::new(Level::DEBUG);
        log(2);
        assert!(fine.next().await.unwrap().contains(" [DEBUG] "));
        drop(fine);
        let watching: usize = bus().wanted.iter().map(|count| count.load(Ordering::SeqCst)).sum();
        assert_eq!(watching, 0, "nobody watches once the watch is gone");
        assert_eq!(parse_level("DEBUG"), Some(Level::DEBUG));
        assert_eq!(parse_level("loud"), None);
    }
}
