//! Linearizability of the client-visible history of variables (the simulation's workload):
//! each path is written once (so its register goes from absent to present) and read with
//! consistent reads through random servers, each operation recorded with its invocation and
//! completion time. For such write-once registers a history is linearizable exactly when no
//! read returned "absent" after the write had completed (a stale read: the write was
//! acknowledged before the read began) and no read returned "present" before the write was
//! invoked (a read from the future). Failed or timed-out operations are left out, as
//! Knossos/Jepsen leave out indeterminate reads (a timed-out write stays possible at any
//! time after its invocation).

use std::collections::BTreeMap;
use std::time::Duration;

/// One operation of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A write of `path`, invoked at `invoked`; `completed` when it was acknowledged.
    Write {
        path: String,
        invoked: Duration,
        completed: Option<Duration>,
    },
    /// A consistent read of `path` through `server` that completed and found it or not.
    Read {
        path: String,
        server: String,
        invoked: Duration,
        completed: Duration,
        present: bool,
    },
}

/// The violations of the history, one line each.
pub fn check(history: &[Op]) -> Vec<String> {
    let writes: BTreeMap<&str, (Duration, Option<Duration>)> = history
        .iter()
        .filter_map(|op| match op {
            Op::Write {
                path,
                invoked,
                completed,
            } => Some((path.as_str(), (*invoked, *completed))),
            Op::Read { .. } => None,
        })
        .collect();
    let mut violations = Vec::new();
    for op in history {
        let Op::Read {
            path,
            server,
            invoked,
            completed,
            present,
        } = op
        else {
            continue;
        };
        let write = writes.get(path.as_str());
        match (present, write) {
            (false, Some((_, Some(acked)))) if acked <= invoked => violations.push(format!(
                "stale read of {path} through {server} at {invoked:?}..{completed:?}: absent, but its write was \
                 acknowledged at {acked:?}"
            )),
            (true, None) => violations.push(format!("read of {path} through {server} found a value nobody wrote")),
            (true, Some((write_invoked, _))) if write_invoked > completed => violations.push(format!(
                "read of {path} through {server} at {invoked:?}..{completed:?} found the value of a write invoked \
                 later, at {write_invoked:?}"
            )),
            _ => {}
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn write(path: &str, invoked: u64, completed: Option<u64>) -> Op {
        Op::Write {
            path: path.into(),
            invoked: ms(invoked),
            completed: completed.map(ms),
        }
    }

    fn read(path: &str, invoked: u64, completed: u64, present: bool) -> Op {
        Op::Read {
            path: path.into(),
            server: "s2".into(),
            invoked: ms(invoked),
            completed: ms(completed),
            present,
        }
    }

    #[test]
    fn reads_concurrent_with_the_write_may_go_either_way() {
        let history = [
            write("w/0", 10, Some(20)),
            read("w/0", 12, 18, false),
            read("w/0", 15, 25, true),
            read("w/0", 21, 30, true),
        ];
        assert!(check(&history).is_empty());
    }

    #[test]
    fn absent_after_the_acknowledgement_is_a_stale_read() {
        let violations = check(&[write("w/0", 10, Some(20)), read("w/0", 21, 30, false)]);
        assert_eq!(violations.len(), 1);
        // Invoked the instant the acknowledgement arrived (virtual time stands still between
        // them): still after it.
        assert_eq!(
            check(&[write("w/0", 10, Some(20)), read("w/0", 20, 30, false)]).len(),
            1
        );
        assert!(violations[0].starts_with("stale read of w/0"), "{violations:?}");
    }

    #[test]
    fn a_timed_out_write_may_land_at_any_later_time() {
        assert!(
            check(&[
                write("w/0", 10, None),
                read("w/0", 50, 60, false),
                read("w/0", 70, 80, true)
            ])
            .is_empty()
        );
    }

    #[test]
    fn a_value_from_the_future_or_from_nowhere_is_refused() {
        assert_eq!(check(&[write("w/0", 40, Some(50)), read("w/0", 10, 20, true)]).len(), 1);
        assert_eq!(check(&[read("w/9", 10, 20, true)]).len(), 1);
    }
}
