//! The SMPP 3.4 time format (§7.1.1) of `validity_period` (and `schedule_delivery_time`):
//! sixteen characters `YYMMDDhhmmsstnnp`.
//!
//! - `p` = `+` or `-`: an absolute time. The date and time are local time, `nn` quarter-hours
//!   ahead of (`+`) or behind (`-`) UTC; `t` is tenths of a second. Years 00-99 are
//!   2000-2099.
//! - `p` = `R`: a time relative to now: `YY` years, `MM` months, `DD` days, `hh` hours, `mm`
//!   minutes and `ss` seconds; `t` and `nn` must be `0`. The fields are not limited to their
//!   calendar ranges (`000000480000000R` is 48 hours). A calendar-exact reading would depend
//!   on which month "now" is in, so a year counts as 365 days and a month as 30 days, as
//!   SMSCs commonly do.
//!
//! Only ASCII is valid; anything that does not fit the format is an error rather than a
//! guess, so the ESME learns its value was not understood.

/// Milliseconds in a second, minute, hour and day.
const SECOND_MS: u64 = 1_000;
const MINUTE_MS: u64 = 60 * SECOND_MS;
const HOUR_MS: u64 = 60 * MINUTE_MS;
const DAY_MS: u64 = 24 * HOUR_MS;
/// One `nn` step: a quarter of an hour.
const QUARTER_HOUR_MS: u64 = 15 * MINUTE_MS;

/// The largest UTC offset in quarter-hours (±12 hours).
const MAX_OFFSET_QUARTERS: u64 = 48;

/// Length of the time format, without the C-string NUL.
const LEN: usize = 16;

/// Why a field is not an SMPP 3.4 time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmppTimeError {
    #[error("SMPP time must be 16 characters (YYMMDDhhmmsstnnp), got {0}")]
    Length(usize),
    #[error("SMPP time must be ASCII")]
    NotAscii,
    #[error("SMPP time character {position} must be a digit, got {found:?}")]
    NotDigit { position: usize, found: char },
    #[error("SMPP time must end in '+', '-' (absolute) or 'R' (relative), got {0:?}")]
    Indicator(char),
    #[error("SMPP time {field} {value} is out of range")]
    OutOfRange { field: &'static str, value: u64 },
    #[error("relative SMPP time must have tenths and UTC offset 0, got tenths {tenths} and offset {offset}")]
    RelativeOffset { tenths: u64, offset: u64 },
}

/// Parses a `validity_period` or `schedule_delivery_time` into an absolute time in
/// milliseconds since the Unix epoch; relative values are added to `now_ms` (saturating).
/// An empty field is `None`: the ESME gave none.
pub fn parse(field: &str, now_ms: u64) -> Result<Option<u64>, SmppTimeError> {
    if field.is_empty() {
        return Ok(None);
    }
    if !field.is_ascii() {
        return Err(SmppTimeError::NotAscii);
    }
    let bytes: &[u8; LEN] = field
        .as_bytes()
        .try_into()
        .map_err(|_| SmppTimeError::Length(field.len()))?;
    let [y1, y2, mo1, mo2, d1, d2, h1, h2, mi1, mi2, s1, s2, t, n1, n2, p] = *bytes;

    if !matches!(p, b'+' | b'-' | b'R') {
        return Err(SmppTimeError::Indicator(char::from(p)));
    }
    if let Some(position) = bytes.iter().take(LEN - 1).position(|b| !b.is_ascii_digit()) {
        let found = bytes.get(position).copied().map_or('?', char::from);
        return Err(SmppTimeError::NotDigit { position, found });
    }

    let year = number(y1, y2);
    let month = number(mo1, mo2);
    let day = number(d1, d2);
    let hour = number(h1, h2);
    let minute = number(mi1, mi2);
    let second = number(s1, s2);
    let tenths = digit(t);
    let offset = number(n1, n2);

    if p == b'R' {
        if tenths != 0 || offset != 0 {
            return Err(SmppTimeError::RelativeOffset { tenths, offset });
        }
        let days = year * 365 + month * 30 + day;
        let duration = days * DAY_MS + hour * HOUR_MS + minute * MINUTE_MS + second * SECOND_MS;
        return Ok(Some(now_ms.saturating_add(duration)));
    }

    let year = 2000 + year;
    check("month", month, (1..=12).contains(&month))?;
    check("day", day, day >= 1 && day <= days_in_month(year, month))?;
    check("hour", hour, hour < 24)?;
    check("minute", minute, minute < 60)?;
    check("second", second, second < 60)?;
    check("UTC offset (quarter-hours)", offset, offset <= MAX_OFFSET_QUARTERS)?;

    let local_ms = days_from_civil(year, month, day) * DAY_MS
        + hour * HOUR_MS
        + minute * MINUTE_MS
        + second * SECOND_MS
        + tenths * 100;
    let offset_ms = offset * QUARTER_HOUR_MS;
    // Local time ahead of UTC (+) means UTC is earlier. 2000-01-01 is ~30 years after the
    // epoch, so subtracting at most 12 hours cannot reach below zero.
    let utc_ms = if p == b'+' {
        local_ms.saturating_sub(offset_ms)
    } else {
        local_ms + offset_ms
    };
    Ok(Some(utc_ms))
}

/// The system clock in ms since the Unix epoch (0 if it is set before the epoch).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// The first and the last instant (ms since the Unix epoch) an absolute SMPP time can
/// name: 2000-01-01T00:00:00Z and 2099-12-31T23:59:59.999Z. A scheduled delivery time past
/// the last cannot be passed on, and is refused when the message comes in.
pub const EARLIEST_MS: u64 = 946_684_800_000;
pub const LATEST_MS: u64 = 4_102_444_799_999;

/// `ms` as RFC 3339 in UTC to the second (`2026-12-24T09:00:00Z`); `None` outside the
/// years [`EARLIEST_MS`]..=[`LATEST_MS`] (so the formatter never meets a year it cannot
/// write).
pub fn rfc3339(ms: u64) -> Option<String> {
    if !(EARLIEST_MS..=LATEST_MS).contains(&ms) {
        return None;
    }
    let at = std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_millis(ms))?;
    let mut out = String::with_capacity(20);
    std::fmt::Write::write_fmt(&mut out, format_args!("{}", humantime::format_rfc3339_seconds(at))).ok()?;
    Some(out)
}

/// `ms` (since the Unix epoch) as an absolute SMPP time in UTC, `YYMMDDhhmmsst00+`:
/// what a `schedule_delivery_time` carries to a provider. Times outside 2000-2099, which
/// the format cannot hold, are `None`.
pub fn format_absolute(ms: u64) -> Option<String> {
    // "2026-12-08T01:23:45Z": the calendar fields, already in UTC.
    let iso = rfc3339(ms)?;
    if iso.len() != 20 {
        return None;
    }
    let field = |from: usize| &iso[from..from + 2];
    Some(format!(
        "{}{}{}{}{}{}{}00+",
        field(2),
        field(5),
        field(8),
        field(11),
        field(14),
        field(17),
        (ms % 1_000) / 100
    ))
}

/// The value of an ASCII digit (checked by the caller).
fn digit(b: u8) -> u64 {
    u64::from(b.saturating_sub(b'0'))
}

/// The value of two ASCII digits.
fn number(tens: u8, ones: u8) -> u64 {
    digit(tens) * 10 + digit(ones)
}

fn check(field: &'static str, value: u64, ok: bool) -> Result<(), SmppTimeError> {
    if ok {
        Ok(())
    } else {
        Err(SmppTimeError::OutOfRange { field, value })
    }
}

fn is_leap(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

/// Days in `month` (1-12) of `year`; 0 for any other month.
fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date `year`-`month`-`day` (Howard
/// Hinnant's `days_from_civil`, in unsigned arithmetic: valid for dates from 1970-01-01,
/// which covers the 2000-2099 of the time format; earlier dates saturate to 0).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    // Years start in March, so the leap day is the last day of the year.
    let year = if month <= 2 { year.saturating_sub(1) } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400; // [0, 399]
    let month_from_march = (month + 9) % 12; // March = 0 … February = 11
    let day_of_year = (153 * month_from_march + 2) / 5 + day.saturating_sub(1); // [0, 365]
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year; // [0, 146096]
    // 719468: days from 0000-03-01 to 1970-01-01.
    (era * 146_097 + day_of_era).saturating_sub(719_468)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn absolute_times_are_written_in_utc_and_read_back() {
        // 2023-11-14T22:13:20.000Z
        assert_eq!(format_absolute(NOW).as_deref(), Some("231114221320000+"));
        assert_eq!(format_absolute(NOW + 700).as_deref(), Some("231114221320700+"));
        for at in [NOW, NOW + 100, 946_684_800_000, 4_102_444_799_900] {
            let text = format_absolute(at).unwrap();
            assert_eq!(super::parse(&text, 0), Ok(Some(at)), "{text}");
        }
        // Outside 2000-2099 the format has no year for it; far beyond, no panic either.
        assert_eq!(format_absolute(0), None);
        assert_eq!(format_absolute(LATEST_MS + 1), None);
        assert_eq!(format_absolute(u64::MAX), None);
        assert_eq!(rfc3339(u64::MAX), None);
        assert_eq!(rfc3339(LATEST_MS).as_deref(), Some("2099-12-31T23:59:59Z"));
        assert_eq!(format_absolute(LATEST_MS).as_deref(), Some("991231235959900+"));
    }

    fn parse(field: &str) -> Result<Option<u64>, SmppTimeError> {
        super::parse(field, NOW)
    }

    #[test]
    fn empty_is_not_given() {
        assert_eq!(parse(""), Ok(None));
    }

    #[test]
    fn absolute_utc() {
        // 2025-01-01T00:00:00Z
        assert_eq!(parse("250101000000000+"), Ok(Some(1_735_689_600_000)));
        assert_eq!(parse("250101000000000-"), Ok(Some(1_735_689_600_000)));
        // 2000-01-01T00:00:00Z
        assert_eq!(parse("000101000000000+"), Ok(Some(946_684_800_000)));
        // 2099-12-31T23:59:59.9Z
        assert_eq!(parse("991231235959900+"), Ok(Some(4_102_444_799_900)));
        // 2024-02-29T12:34:56Z (leap day)
        assert_eq!(parse("240229123456000+"), Ok(Some(1_709_210_096_000)));
        // 2000 is a leap year (divisible by 400).
        assert_eq!(parse("000229000000000+"), Ok(Some(951_782_400_000)));
    }

    #[test]
    fn offsets_move_the_utc_instant() {
        let midnight = 1_735_689_600_000;
        // Local midnight one hour ahead of UTC is 23:00 UTC the day before.
        assert_eq!(parse("250101000000004+"), Ok(Some(midnight - 3_600_000)));
        // One hour behind UTC: 01:00 UTC.
        assert_eq!(parse("250101000000004-"), Ok(Some(midnight + 3_600_000)));
        // The largest offsets, ±12 hours.
        assert_eq!(parse("250101000000048+"), Ok(Some(midnight - 43_200_000)));
        assert_eq!(parse("250101000000048-"), Ok(Some(midnight + 43_200_000)));
        // India, +05:30 = 22 quarter-hours.
        assert_eq!(parse("250101053000022+"), Ok(Some(midnight)));
    }

    #[test]
    fn tenths_of_a_second() {
        assert_eq!(parse("250101000000700+"), Ok(Some(1_735_689_600_700)));
        assert_eq!(parse("250101000001900+"), Ok(Some(1_735_689_601_900)));
    }

    #[test]
    fn relative() {
        let day = 86_400_000;
        assert_eq!(parse("000001000000000R"), Ok(Some(NOW + day)));
        assert_eq!(parse("000000000000000R"), Ok(Some(NOW)));
        assert_eq!(parse("000000013045000R"), Ok(Some(NOW + 5_445_000)));
        // A month is 30 days, a year 365.
        assert_eq!(parse("000100000000000R"), Ok(Some(NOW + 30 * day)));
        assert_eq!(parse("010000000000000R"), Ok(Some(NOW + 365 * day)));
        // Fields beyond their calendar ranges are plain amounts.
        assert_eq!(parse("000000480000000R"), Ok(Some(NOW + 2 * day)));
        assert_eq!(parse("000000009999000R"), Ok(Some(NOW + 99 * 60_000 + 99_000)));
        // Saturates instead of overflowing.
        assert_eq!(super::parse("999999999999000R", u64::MAX - 5), Ok(Some(u64::MAX)));
    }

    #[test]
    fn wrong_length() {
        assert_eq!(parse("50101000000000+"), Err(SmppTimeError::Length(15)));
        assert_eq!(parse("250101000000000"), Err(SmppTimeError::Length(15)));
        assert_eq!(parse("2250101000000000+"), Err(SmppTimeError::Length(17)));
        assert_eq!(parse("000001000000000R\0"), Err(SmppTimeError::Length(17)));
        assert_eq!(parse("R"), Err(SmppTimeError::Length(1)));
    }

    #[test]
    fn not_digits() {
        assert_eq!(
            parse("25a101000000000+"),
            Err(SmppTimeError::NotDigit {
                position: 2,
                found: 'a'
            })
        );
        assert_eq!(
            parse("2501010000000 0+"),
            Err(SmppTimeError::NotDigit {
                position: 13,
                found: ' '
            })
        );
        assert_eq!(
            parse("-00001000000000R"),
            Err(SmppTimeError::NotDigit {
                position: 0,
                found: '-'
            })
        );
        // rusmpp's own example value is not an SMPP time.
        assert!(matches!(parse("2023-10-01T12:00"), Err(SmppTimeError::Indicator('0'))));
        assert_eq!(parse("250101000000000é"), Err(SmppTimeError::NotAscii));
    }

    #[test]
    fn wrong_indicator() {
        assert_eq!(parse("250101000000000r"), Err(SmppTimeError::Indicator('r')));
        assert_eq!(parse("2501010000000000"), Err(SmppTimeError::Indicator('0')));
        assert_eq!(parse("250101000000000 "), Err(SmppTimeError::Indicator(' ')));
    }

    #[test]
    fn out_of_range() {
        let range = |field, value| Err(SmppTimeError::OutOfRange { field, value });
        assert_eq!(parse("251301000000000+"), range("month", 13));
        assert_eq!(parse("250001000000000+"), range("month", 0));
        assert_eq!(parse("250100000000000+"), range("day", 0));
        assert_eq!(parse("250132000000000+"), range("day", 32));
        assert_eq!(parse("250230000000000+"), range("day", 30));
        assert_eq!(parse("250229000000000+"), range("day", 29), "2025 is not a leap year");
        assert_eq!(parse("250431000000000+"), range("day", 31));
        assert_eq!(parse("250101240000000+"), range("hour", 24));
        assert_eq!(parse("250101006000000+"), range("minute", 60));
        assert_eq!(parse("250101000060000+"), range("second", 60));
        assert_eq!(parse("250101000000049+"), range("UTC offset (quarter-hours)", 49));
        assert_eq!(parse("250101000000099-"), range("UTC offset (quarter-hours)", 99));
    }

    #[test]
    fn relative_needs_zero_tenths_and_offset() {
        assert_eq!(
            parse("000001000000100R"),
            Err(SmppTimeError::RelativeOffset { tenths: 1, offset: 0 })
        );
        assert_eq!(
            parse("000001000000004R"),
            Err(SmppTimeError::RelativeOffset { tenths: 0, offset: 4 })
        );
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            parse("251301000000000+").unwrap_err().to_string(),
            "SMPP time month 13 is out of range"
        );
        assert_eq!(
            parse("250101000000000").unwrap_err().to_string(),
            "SMPP time must be 16 characters (YYMMDDhhmmsstnnp), got 15"
        );
    }

    #[test]
    fn days_from_civil_matches_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(1970, 3, 1), 59);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2025, 1, 1), 20_089);
        assert_eq!(days_from_civil(2100, 3, 1), 47_541);
        // Consecutive days across every month boundary of 2000-2099.
        let mut expected = days_from_civil(2000, 1, 1);
        for year in 2000..2100 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    assert_eq!(days_from_civil(year, month, day), expected, "{year}-{month}-{day}");
                    expected += 1;
                }
            }
        }
        assert_eq!(expected, days_from_civil(2100, 1, 1));
    }

    /// A small deterministic generator (xorshift), so the test needs no dependency.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn never_panics_on_arbitrary_input() {
        let seeds = [
            "250101000000000+",
            "991231235959948-",
            "999999999999000R",
            "000229000000000+",
        ];
        let alphabet: Vec<u8> = (0x20..0x7f).collect();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut parsed = 0;
        for _ in 0..200_000 {
            let mut bytes = seeds[rng.below(seeds.len())].as_bytes().to_vec();
            for _ in 0..=rng.below(4) {
                let position = rng.below(LEN);
                bytes[position] = match rng.below(3) {
                    0 => b'0' + rng.below(10) as u8,
                    1 => alphabet[rng.below(alphabet.len())],
                    _ => *b"+-R".get(rng.below(3)).unwrap(),
                };
            }
            let field = std::str::from_utf8(&bytes).unwrap();
            for now in [0, NOW, u64::MAX] {
                if let Ok(Some(ms)) = super::parse(field, now) {
                    parsed += 1;
                    if field.ends_with('R') {
                        assert!(ms >= now, "{field}");
                    } else {
                        assert!((946_641_600_000..=4_102_487_999_900).contains(&ms), "{field}");
                    }
                }
            }
        }
        assert!(parsed > 0, "the mutations produced no valid time at all");
    }
}
