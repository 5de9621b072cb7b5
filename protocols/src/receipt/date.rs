//! The `YYMMDDhhmm` dates of receipt text, in UTC.
//!
//! The civil-date arithmetic is done here (Howard Hinnant's `days_from_civil` /
//! `civil_from_days`) so that this crate needs no date library for two small conversions.

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // Both are small and in range by construction.
    (year, u32::try_from(month).unwrap_or(1), u32::try_from(day).unwrap_or(1))
}

/// (year, month, day) → days since 1970-01-01. `month` must be 1..=12.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400); // [0, 399]
    let month = i64::from(month);
    let mp = if month > 2 { month - 3 } else { month + 9 }; // [0, 11]
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// `unix_seconds` as `YYMMDDhhmm` in UTC, the date format of SMPP 3.4 Appendix B.
pub fn format_date(unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let fields = [
        year.rem_euclid(100),
        i64::from(month),
        i64::from(day),
        secs / 3_600,
        secs % 3_600 / 60,
    ];
    // Each field is below 100: two digits each, written without the formatting machinery
    // (two dates per receipt).
    let mut out = String::with_capacity(10);
    for field in fields {
        let field = u8::try_from(field).unwrap_or(0);
        out.push(char::from(b'0' + field / 10));
        out.push(char::from(b'0' + field % 10));
    }
    out
}

/// Parses a receipt date — `YYMMDDhhmm`, or `YYMMDDhhmmss` as many SMSCs send — as UTC
/// Unix seconds. Years are 2000-based (SMS receipts predate nothing earlier). `None` for
/// anything that is not a valid date of that shape.
pub fn parse_date(s: &str) -> Option<i64> {
    let s = s.trim();
    if !(s.len() == 10 || s.len() == 12) || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let field = |at: usize| s.get(at..at + 2).and_then(|v| v.parse::<u32>().ok());
    let (year, month, day) = (field(0)?, field(2)?, field(4)?);
    let (hour, minute) = (field(6)?, field(8)?);
    let second = if s.len() == 12 { field(10)? } else { 0 };
    let year = 2000 + i64::from(year);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    Some(
        days_from_civil(year, month, day) * 86_400
            + i64::from(hour) * 3_600
            + i64::from(minute) * 60
            + i64::from(second),
    )
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(format_date(0), "7001010000");
        // 2024-02-29 13:45:59 UTC
        assert_eq!(format_date(1_709_214_359), "2402291345");
        // 2000-03-01 00:00 UTC, just after a leap day in a century leap year.
        assert_eq!(format_date(951_868_800), "0003010000");
        // 1999-12-31 23:59 UTC
        assert_eq!(format_date(946_684_799), "9912312359");
        // Before the epoch: 1969-12-31 23:59.
        assert_eq!(format_date(-1), "6912312359");
        // Extremes do not panic.
        let _ = format_date(i64::MAX / 2);
        let _ = format_date(i64::MIN / 2);
    }

    #[test]
    fn civil_round_trip_over_centuries() {
        for days in (-800_000..800_000).step_by(7) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn parse_dates() {
        assert_eq!(parse_date("2402291345"), Some(1_709_214_300));
        assert_eq!(parse_date("240229134559"), Some(1_709_214_359));
        assert_eq!(parse_date(&format_date(1_700_000_000)), Some(1_699_999_980));
        assert_eq!(parse_date("2302291345"), None); // 2023 is not a leap year
        assert_eq!(parse_date("2413011200"), None);
        assert_eq!(parse_date("2401012400"), None);
        assert_eq!(parse_date("24010112"), None);
        assert_eq!(parse_date("24010112a0"), None);
        assert_eq!(parse_date(""), None);
        assert_eq!(parse_date("٢٤٠١٠١١٢٠٠"), None);
    }
}
