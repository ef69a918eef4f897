//! Go's duration syntax (`time.ParseDuration`), the one parser for every duration a user
//! writes: agent config, jobspecs, the HTTP API's `wait`, driver config.
//!
//! Integer arithmetic throughout, as Go's: a value that does not fit in an `i64` of
//! nanoseconds is an error, never a wrap or a panic, whatever the input.

#[allow(unused_imports)]
use crate::prelude::*;

use core::time::Duration;

/// Why a duration did not parse; the texts are Go's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    #[error("time: missing unit in duration {0:?}")]
    MissingUnit(String),
    #[error("time: unknown unit {unit:?} in duration {text:?}")]
    UnknownUnit { unit: String, text: String },
    #[error("time: negative duration {0:?} not allowed here")]
    Negative(String),
}

const NANOS_MAX: u64 = 1 << 63;

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Leading decimal digits as an integer; `None` when it overflows.
fn leading_int(text: &str) -> Option<(u64, &str)> {
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let mut value: u64 = 0;
    for digit in text[..end].bytes() {
        value = value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))?;
        if value > NANOS_MAX {
            return None;
        }
    }
    Some((value, &text[end..]))
}

/// Leading fraction digits as (value, scale); digits past what fits are dropped, as in Go.
fn leading_fraction(text: &str) -> (u64, f64, &str) {
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (mut value, mut scale, mut overflow) = (0u64, 1f64, false);
    for digit in text[..end].bytes() {
        if overflow {
            continue;
        }
        match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(digit - b'0')))
        {
            Some(next) if next <= NANOS_MAX => {
                value = next;
                scale *= 10.0;
            }
            _ => overflow = true,
        }
    }
    (value, scale, &text[end..])
}

/// Parses a Go duration into signed nanoseconds: `"300ms"`, `"-1.5h"`, `"2h45m"`, `"0"`.
pub fn parse_nanos(text: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError::Invalid(text.to_string());
    let mut rest = text;
    let negative = rest.starts_with('-');
    if rest.starts_with('-') || rest.starts_with('+') {
        rest = &rest[1..];
    }
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        if !rest.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
            return Err(invalid());
        }
        let before = rest.len();
        let (whole, after) = leading_int(rest).ok_or_else(invalid)?;
        let had_whole = after.len() != before;
        rest = after;
        let (mut fraction, mut scale, mut had_fraction) = (0, 1.0, false);
        if let Some(after_dot) = rest.strip_prefix('.') {
            let (value, value_scale, after) = leading_fraction(after_dot);
            had_fraction = after.len() != after_dot.len();
            (fraction, scale, rest) = (value, value_scale, after);
        }
        if !had_whole && !had_fraction {
            return Err(invalid());
        }
        let unit_end = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        if unit_end == 0 {
            return Err(DurationError::MissingUnit(text.to_string()));
        }
        let (unit, after) = rest.split_at(unit_end);
        rest = after;
        let nanos = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
            unit: unit.to_string(),
            text: text.to_string(),
        })?;
        let mut value = whole
            .checked_mul(nanos)
            .filter(|v| *v <= NANOS_MAX)
            .ok_or_else(invalid)?;
        if fraction > 0 {
            // Exact enough: the fraction has at most 19 significant digits.
            value = value
                .checked_add((fraction as f64 * (nanos as f64 / scale)) as u64)
                .filter(|v| *v <= NANOS_MAX)
                .ok_or_else(invalid)?;
        }
        total = total
            .checked_add(value)
            .filter(|v| *v <= NANOS_MAX)
            .ok_or_else(invalid)?;
    }
    if negative {
        // -(1 << 63) fits; as u64 → i64 it wraps to exactly i64::MIN.
        return Ok((total as i64).wrapping_neg());
    }
    i64::try_from(total).map_err(|_| invalid())
}

/// Parses a Go duration that must not be negative.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let nanos = parse_nanos(text)?;
    let nanos = u64::try_from(nanos).map_err(|_| DurationError::Negative(text.to_string()))?;
    Ok(Duration::from_nanos(nanos))
}

/// Go's `time.Duration` rendering (`String()`), to the millisecond (`30m0s`, `15s`, `24h0m0s`).
pub fn format(duration: Duration) -> String {
    if duration.is_zero() {
        return "0s".into();
    }
    if duration < Duration::from_secs(1) {
        // Go writes what is under a second in its own unit: `1ms`, `1.5ms`, `250µs`.
        let micros = duration.as_micros();
        return if micros >= 1_000 {
            let text = format!("{}.{:03}", micros / 1_000, micros % 1_000);
            format!("{}ms", text.trim_end_matches('0').trim_end_matches('.'))
        } else {
            format!("{micros}µs")
        };
    }
    let total = duration.as_secs();
    let millis = duration.subsec_millis();
    let (h, m, s) = (total / 3600, (total / 60) % 60, total % 60);
    let seconds = if millis > 0 {
        format!("{s}.{millis:03}").trim_end_matches('0').to_string()
    } else {
        format!("{s}")
    };
    if h > 0 {
        format!("{h}h{m}m{seconds}s")
    } else if m > 0 {
        format!("{m}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_examples() {
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("5s", 5_000_000_000),
            ("30s", 30_000_000_000),
            ("1478s", 1_478_000_000_000),
            ("-5s", -5_000_000_000),
            ("+5s", 5_000_000_000),
            ("-0", 0),
            ("5.0s", 5_000_000_000),
            ("5.6s", 5_600_000_000),
            ("5.s", 5_000_000_000),
            (".5s", 500_000_000),
            ("1.004s", 1_004_000_000),
            ("100.00100s", 100_001_000_000),
            ("10ns", 10),
            ("11us", 11_000),
            ("12\u{b5}s", 12_000),
            ("12\u{3bc}s", 12_000),
            ("13ms", 13_000_000),
            ("14s", 14_000_000_000),
            ("15m", 900_000_000_000),
            ("16h", 57_600_000_000_000),
            ("3h30m", 12_600_000_000_000),
            ("10.5s4m", 250_500_000_000),
            ("-2m3.4s", -123_400_000_000),
            ("1h2m3s4ms5us6ns", 3_723_004_005_006),
            ("39h9m14.425s", 140_954_425_000_000),
            ("52763797000ns", 52_763_797_000),
            ("0.3333333333333333333h", 1_200_000_000_000),
            ("9007199254740993ns", 9_007_199_254_740_993),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("0.100000000000000000000h", 360_000_000_000),
            ("0.830103483285477580700h", 2_988_372_539_827),
        ];
        for (text, nanos) in cases {
            assert_eq!(parse_nanos(text), Ok(*nanos), "{text}");
        }
    }

    #[test]
    fn bad_input_is_an_error_never_a_panic() {
        let long_digits = "9".repeat(10_000) + "s";
        let long_units = "1s".repeat(5_000);
        let long_garbage = "x".repeat(10_000);
        let bad = [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "NaN",
            "NaNs",
            "infs",
            "-inf h",
            "1e9s",
            "9223372036854775808ns",
            "9223372036854775.808us",
            "9223372036854ms775us808ns",
            "-9223372036854775809ns",
            "3000000h",
            "106751991167h",
            "2562047h48m",
            long_digits.as_str(),
            long_garbage.as_str(),
        ];
        for text in bad {
            assert!(parse_nanos(text).is_err(), "{:.40}", text);
            assert!(parse(text).is_err(), "{:.40}", text);
        }
        // 5,000 seconds written out 10 kB long is still fine.
        assert_eq!(parse(&long_units), Ok(Duration::from_secs(5_000)));
        assert_eq!(parse("-1s"), Err(DurationError::Negative("-1s".into())));
        assert_eq!(
            parse("1d").unwrap_err().to_string(),
            "time: unknown unit \"d\" in duration \"1d\""
        );
        assert_eq!(
            parse("3").unwrap_err().to_string(),
            "time: missing unit in duration \"3\""
        );
    }
}
