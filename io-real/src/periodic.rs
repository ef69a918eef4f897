//! Cron arithmetic for periodic jobs: the [`Calendar`] the core's dispatcher asks for "the
//! first time after t", and the validation of a `periodic` block, in Nomad's dialect.
//!
//! Nomad reads specs with cronexpr: 5 fields (minute first), 6 fields (a year appended), 7
//! fields (seconds first, year last), or a nickname (`@daily`). croner reads a 6-field spec
//! as seconds-first, so such a spec gets a zero seconds field in front. Days of month and of
//! week combine with OR when both are restricted, in both. The time zone is an IANA name from
//! the zone database compiled in (chrono-tz), so an agent needs no tzdata on its host.

use chrono::TimeZone;
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use drover_core::periodic::Calendar;
use drover_core::structs::{JobType, PERIODIC_SPEC_CRON, PeriodicConfig};

/// The production calendar (the simulation runs it too: it is pure arithmetic).
#[derive(Debug, Default, Clone, Copy)]
pub struct CronCalendar;

/// The spec as croner reads Nomad's meaning of it.
fn normalized(spec: &str) -> String {
    let spec = spec.trim();
    if !spec.starts_with('@') && spec.split_whitespace().count() == 6 {
        format!("0 {spec}")
    } else {
        spec.to_string()
    }
}

/// A cron spec, parsed; the error is croner's.
pub fn parse_spec(spec: &str) -> Result<Cron, String> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Optional)
        .build()
        .parse(&normalized(spec))
        .map_err(|error| error.to_string())
}

/// The IANA zone a spec is read in; empty is UTC.
pub fn zone(name: &str) -> Result<Tz, String> {
    if name.is_empty() {
        return Ok(Tz::UTC);
    }
    name.parse::<Tz>().map_err(|error| error.to_string())
}

impl Calendar for CronCalendar {
    fn next_after(&self, periodic: &PeriodicConfig, after_ms: u64) -> Option<u64> {
        let cron = parse_spec(&periodic.spec).ok()?;
        let tz = zone(&periodic.time_zone).ok()?;
        let after = tz.timestamp_millis_opt(i64::try_from(after_ms).ok()?).single()?;
        let next = cron.find_next_occurrence(&after, false).ok()?;
        u64::try_from(next.timestamp_millis()).ok()
    }
}

/// Nomad's `PeriodicConfig.Validate` and the job's rule that only batch jobs are periodic,
/// with its texts.
pub fn problems(periodic: &PeriodicConfig, job_type: JobType) -> Vec<String> {
    let mut problems = Vec::new();
    if !periodic.enabled {
        return problems;
    }
    if job_type != JobType::Batch {
        problems.push(format!(
            "Periodic can only be used with {:?} scheduler",
            JobType::Batch.as_str()
        ));
    }
    if periodic.spec.is_empty() {
        problems.push("Must specify a spec".into());
    }
    if !periodic.time_zone.is_empty()
        && let Err(error) = zone(&periodic.time_zone)
    {
        problems.push(format!("Invalid time zone {:?}: {error}", periodic.time_zone));
    }
    if periodic.spec_type != PERIODIC_SPEC_CRON {
        problems.push(format!("Unknown periodic specification type {:?}", periodic.spec_type));
    } else if !periodic.spec.is_empty()
        && let Err(error) = parse_spec(&periodic.spec)
    {
        problems.push(format!("Invalid cron spec {:?}: {error}", periodic.spec));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(spec: &str, time_zone: &str) -> PeriodicConfig {
        PeriodicConfig {
            spec: spec.into(),
            time_zone: time_zone.into(),
            ..PeriodicConfig::default()
        }
    }

    /// 2026-01-01T00:00:00Z.
    const NEW_YEAR_MS: u64 = 1_767_225_600_000;

    #[test]
    fn the_next_time_is_strictly_after_and_on_the_second() {
        let every_ten = spec("*/10 * * * * * *", "");
        let next = |after: u64| CronCalendar.next_after(&every_ten, NEW_YEAR_MS + after);
        assert_eq!(next(0), Some(NEW_YEAR_MS + 10_000));
        assert_eq!(next(9_999), Some(NEW_YEAR_MS + 10_000));
        assert_eq!(next(10_000), Some(NEW_YEAR_MS + 20_000));
        assert_eq!(next(10_500), Some(NEW_YEAR_MS + 20_000));
    }

    #[test]
    fn nomads_field_counts_and_nicknames() {
        // 5 fields: every 15 minutes; 6 fields: the same with a year; 7: seconds first.
        for text in ["*/15 * * * *", "*/15 * * * * *", "0 */15 * * * * *"] {
            let next = CronCalendar.next_after(&spec(text, ""), NEW_YEAR_MS);
            assert_eq!(next, Some(NEW_YEAR_MS + 15 * 60_000), "{text}");
        }
        let daily = CronCalendar.next_after(&spec("@daily", ""), NEW_YEAR_MS);
        assert_eq!(daily, Some(NEW_YEAR_MS + 24 * 3_600_000));
    }

    #[test]
    fn specs_are_read_in_their_time_zone() {
        // 09:00 in New York on 2026-01-01 is 14:00 UTC (EST, UTC-5).
        let nine = CronCalendar.next_after(&spec("0 9 * * *", "America/New_York"), NEW_YEAR_MS);
        assert_eq!(nine, Some(NEW_YEAR_MS + 14 * 3_600_000));
    }

    #[test]
    fn bad_blocks_are_named_with_nomads_texts() {
        let mut periodic = spec("not a cron", "Mars/Olympus");
        let found = problems(&periodic, JobType::Service);
        assert_eq!(found.len(), 3, "{found:?}");
        assert_eq!(found[0], "Periodic can only be used with \"batch\" scheduler");
        assert!(
            found[1].starts_with("Invalid time zone \"Mars/Olympus\": "),
            "{found:?}"
        );
        assert!(found[2].starts_with("Invalid cron spec \"not a cron\": "), "{found:?}");
        periodic.enabled = false;
        assert!(
            problems(&periodic, JobType::Service).is_empty(),
            "a disabled block is not checked"
        );
        assert_eq!(problems(&spec("", ""), JobType::Batch), ["Must specify a spec"]);
    }
}
