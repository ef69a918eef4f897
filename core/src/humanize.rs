//! Sizes as go-humanize writes them, for texts that quote Nomad's: `Bytes` (SI: `1.1 GB`)
//! and `IBytes` (binary: `2.0 GiB`, `10 GiB`). Integer arithmetic only, so results are the
//! same everywhere.

#[allow(unused_imports)]
use crate::prelude::*;

const SI: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
const IEC: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// go-humanize's `Bytes`: powers of 1000.
pub fn bytes(size: u64) -> String {
    humanate(size, 1000, &SI)
}

/// go-humanize's `IBytes`: powers of 1024.
pub fn ibytes(size: u64) -> String {
    humanate(size, 1024, &IEC)
}

/// Below 10 units: bytes as they are. Otherwise the largest unit not above the size, the
/// value rounded half up to a tenth, shown with one decimal below 10 and none above.
fn humanate(size: u64, base: u64, units: &[&str; 7]) -> String {
    if size < 10 {
        return format!("{size} B");
    }
    let mut exponent = 0;
    let mut unit: u128 = 1;
    while exponent + 1 < units.len() && unit * u128::from(base) <= u128::from(size) {
        unit *= u128::from(base);
        exponent += 1;
    }
    let tenths = (u128::from(size) * 20 + unit) / (unit * 2);
    if tenths < 100 {
        format!("{}.{} {}", tenths / 10, tenths % 10, units[exponent])
    } else {
        // Whole units, rounded as Go's %.0f rounds the tenth-rounded value (half to even).
        let (whole, tenth) = (tenths / 10, tenths % 10);
        let whole = if tenth > 5 || (tenth == 5 && whole % 2 == 1) {
            whole + 1
        } else {
            whole
        };
        format!("{whole} {}", units[exponent])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_go_humanize_writes_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(9), "9 B");
        assert_eq!(bytes(82_854_982), "83 MB");
        assert_eq!(bytes(1_100_000_000), "1.1 GB");
        assert_eq!(bytes(1 << 30), "1.1 GB");
        assert_eq!(ibytes(1 << 30), "1.0 GiB");
        assert_eq!(ibytes(2 << 30), "2.0 GiB");
        assert_eq!(ibytes(10 << 30), "10 GiB");
        assert_eq!(ibytes(4096), "4.0 KiB");
        assert_eq!(ibytes(12), "12 B");
        assert_eq!(ibytes(1536), "1.5 KiB");
        assert_eq!(ibytes(1000), "1000 B");
    }
}
