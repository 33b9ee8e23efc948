//! Durations and byte sizes as people write and read them: `500ms`, `30s`, `1h`, `7d`; `64MiB`,
//! `1GB`; and `none` for a limit that is not set. The command line reads its flags with these and
//! writes durations and sizes with them, so nothing is printed to the nanosecond.
//!
//! Owns: the spelling of durations (humantime) and sizes (bytesize) on the command line and in
//! error messages. Must never: change what travels on the wire (the HTTP API keeps integer ms
//! and bytes).

use std::time::Duration;

use bytesize::ByteSize;

/// The word that clears a limit: `--max-age none`.
pub const NONE: &str = "none";

/// A limit given on the command line: a value, or [`NONE`] (no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit<T> {
    /// No limit (`none`).
    Unset,
    /// This limit.
    Set(T),
}

impl<T> Limit<T> {
    /// The limit as an option: `None` for [`Limit::Unset`].
    pub fn into_option(self) -> Option<T> {
        match self {
            Limit::Unset => None,
            Limit::Set(v) => Some(v),
        }
    }
}

/// Parses a duration: a number and a unit, several pieces allowed (`500ms`, `30s`, `1h 30m`,
/// `7d`, `2w`), as humantime reads them.
///
/// Errors: a text saying what is wrong and what is accepted, for a plain number too (`60` is
/// refused: seconds or milliseconds?), and for a duration past `u64::MAX` ms (about 584
/// million years: every duration of the API is whole ms in a `u64`), which would otherwise be
/// taken as that maximum.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("{t:?} has no unit: write {t}ms, {t}s, {t}m, {t}h or {t}d"));
    }
    let d = humantime::parse_duration(t)
        .map_err(|e| format!("{t:?} is not a duration ({e}); write e.g. 500ms, 30s, 15m, 1h, 7d"))?;
    if u64::try_from(d.as_millis()).is_err() {
        return Err(format!("{t:?} is longer than the longest duration, {} ms", u64::MAX));
    }
    Ok(d)
}

/// Parses a size in bytes: a plain number of bytes, or a number with a unit (`K`/`KiB`,
/// `M`/`MiB`, `G`/`GiB` are 1024-based here, as `KiB`…; `KB`, `MB`, `GB` are 1000-based).
///
/// Errors: a text saying what is wrong and what is accepted; a size of `u64::MAX` bytes or more
/// (16 EiB), which would otherwise be taken as that maximum.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("{t:?} is not a size; write bytes (1048576) or with a unit: 64KiB, 16MiB, 1GiB, 500MB");
    // bytesize reads a bare K, M, G as 1000-based; the rest of Runnev (the benchmark's flags,
    // the docs) reads them as 1024-based, so they are spelled out here first.
    let digits = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let unit = match unit.trim() {
        u if u.eq_ignore_ascii_case("k") => "KiB",
        u if u.eq_ignore_ascii_case("m") => "MiB",
        u if u.eq_ignore_ascii_case("g") => "GiB",
        u if u.eq_ignore_ascii_case("t") => "TiB",
        u => u,
    };
    if number.is_empty() {
        return Err(bad());
    }
    let too_large = || format!("{t:?} is larger than the largest size, {} bytes", u64::MAX - 1);
    if unit.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) {
        return match number.parse::<u64>() {
            Ok(n) if n < u64::MAX => Ok(n),
            _ => Err(too_large()),
        };
    }
    let size: ByteSize = format!("{number}{unit}").parse().map_err(|_| bad())?;
    // bytesize saturates what does not fit in a u64.
    if size.as_u64() == u64::MAX {
        return Err(too_large());
    }
    Ok(size.as_u64())
}

/// Parses a duration limit: [`parse_duration`], or `none`.
///
/// Errors: as [`parse_duration`].
pub fn parse_duration_limit(s: &str) -> Result<Limit<Duration>, String> {
    if s.trim().eq_ignore_ascii_case(NONE) {
        return Ok(Limit::Unset);
    }
    parse_duration(s).map(Limit::Set)
}

/// Parses a size limit: [`parse_bytes`], or `none`.
///
/// Errors: as [`parse_bytes`].
pub fn parse_bytes_limit(s: &str) -> Result<Limit<u64>, String> {
    if s.trim().eq_ignore_ascii_case(NONE) {
        return Ok(Limit::Unset);
    }
    parse_bytes(s).map(Limit::Set)
}

/// Parses a count limit: a non-negative integer, or `none`.
///
/// Errors: neither.
pub fn parse_count_limit(s: &str) -> Result<Limit<u64>, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case(NONE) {
        return Ok(Limit::Unset);
    }
    t.parse().map(Limit::Set).map_err(|_| format!("{t:?} is not a count; write a whole number, or {NONE}"))
}

/// A duration for people: whole milliseconds under 10 s (`752ms`, `2s 5ms`), whole seconds
/// above (`29s`, `1h 30m`, `7days`).
pub fn format_duration(d: Duration) -> String {
    let rounded = if d < Duration::from_secs(10) {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    } else {
        Duration::from_secs(d.as_secs())
    };
    humantime::format_duration(rounded).to_string()
}

/// A size for people, in 1024-based units: `512 B`, `64.0 MiB`, `1.5 GiB`.
pub fn format_bytes(n: u64) -> String {
    ByteSize(n).display().iec().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("60").unwrap_err().contains("has no unit"));
        assert!(parse_duration("soon").unwrap_err().contains("not a duration"));
        // Past u64::MAX ms: refused, not taken as the largest (found by a fresh user's trial).
        assert!(parse_duration("99999999999999d").unwrap_err().contains("longer than the longest"));
        assert_eq!(parse_duration("213503982334d"), Ok(Duration::from_secs(213_503_982_334 * 86_400)));
        assert_eq!(parse_duration_limit("none"), Ok(Limit::Unset));
        assert_eq!(parse_duration_limit("2s"), Ok(Limit::Set(Duration::from_secs(2))));
    }

    #[test]
    fn sizes_read_in_bytes_or_units() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("512k"), Ok(512 << 10));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("-5").is_err());
        assert!(parse_bytes("5 furlongs").is_err());
        // Sizes that do not fit in a u64 are refused, not taken as the largest.
        assert!(parse_bytes("99999999999999999999G").unwrap_err().contains("larger than the largest"));
        assert!(parse_bytes("99999999999999999999").unwrap_err().contains("larger than the largest"));
        assert_eq!(parse_bytes("1000PB"), Ok(1_000_000_000_000_000_000));
        assert_eq!(parse_bytes_limit("NONE"), Ok(Limit::Unset));
        assert_eq!(parse_count_limit("none"), Ok(Limit::Unset));
        assert_eq!(parse_count_limit("10"), Ok(Limit::Set(10)));
        assert!(parse_count_limit("-1").is_err());
    }

    #[test]
    fn durations_and_sizes_print_without_noise() {
        assert_eq!(format_duration(Duration::from_nanos(29_179_123_238)), "29s");
        assert_eq!(format_duration(Duration::from_nanos(752_123_456)), "752ms");
        assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7days");
        assert_eq!(format_bytes(64 << 20), "64.0 MiB");
        assert_eq!(format_bytes(512), "512 B");
    }
}
