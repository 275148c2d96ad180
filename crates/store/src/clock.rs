//! Timestamps as the database stores them: UTC ISO 8601 with milliseconds
//! (`2026-11-30T12:00:00.000Z`), the text `strftime('%Y-%m-%dT%H:%M:%fZ', 'now')` gives.
//!
//! An append formats its own, once, and binds it wherever it writes one: SQLite's `strftime`
//! costs some 5 k instructions a call (it formats through its own printf), and the append
//! wrote two (the message's `created_at`, the session's `updated_at`). Other writes keep
//! asking SQLite ([`super::sessions::NOW`]): both read the same system clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current time, as stored.
pub(super) fn now() -> String {
    stored(SystemTime::now())
}

/// `time`, as stored.
pub(super) fn stored(time: SystemTime) -> String {
    let since_epoch = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    stored_text(since_epoch)
}

/// Milliseconds since the Unix epoch as stored: the proleptic Gregorian calendar, as SQLite
/// counts it.
fn stored_text(millis: i64) -> String {
    const DAY: i64 = 86_400_000;
    let (days, of_day) = (millis.div_euclid(DAY), millis.rem_euclid(DAY));
    let (year, month, day) = civil_date(days);
    let seconds = of_day / 1000;
    // Written digit by digit: `format!` with seven padded numbers cost 3 k instructions.
    let mut text = *b"0000-00-00T00:00:00.000Z";
    for (at, width, value) in [
        (0, 4, year),
        (5, 2, month),
        (8, 2, day),
        (11, 2, seconds / 3600),
        (14, 2, seconds / 60 % 60),
        (17, 2, seconds % 60),
        (20, 3, of_day % 1000),
    ] {
        let mut rest = value;
        for digit in text[at..at + width].iter_mut().rev() {
            *digit = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// The (year, month, day) of a count of days since 1970-01-01: eras of 400 years (146,097
/// days) counted from March, so that the leap day ends a year (Howard Hinnant's algorithm).
fn civil_date(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468; // days since 0000-03-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What SQLite itself stores for the same instant (whole seconds through `unixepoch`,
    /// which it reads exactly, then the milliseconds).
    fn sqlite_text(conn: &rusqlite::Connection, millis: i64) -> String {
        conn.query_row(
            "SELECT strftime('%Y-%m-%dT%H:%M:%S', ?1, 'unixepoch') || printf('.%03dZ', ?2)",
            rusqlite::params![millis.div_euclid(1000), millis.rem_euclid(1000)],
            |r| r.get(0),
        )
        .unwrap()
    }

    #[test]
    fn known_instants_read_as_sqlite_writes_them() {
        assert_eq!(stored_text(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(stored_text(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(stored_text(1_796_040_000_123), "2026-11-30T12:00:00.123Z");
        // The daemon's own clock reads between two of SQLite's (stored times sort as text).
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let sqlite_now = || -> String {
            conn.query_row("SELECT strftime('%Y-%m-%dT%H:%M:%fZ', 'now')", [], |r| {
                r.get(0)
            })
            .unwrap()
        };
        let before = sqlite_now();
        let ours = now();
        let after = sqlite_now();
        assert!(before <= ours && ours <= after, "{before} {ours} {after}");
    }

    proptest! {
        /// Any instant from 1970 to 9999 is stored as SQLite's strftime would store it.
        #[test]
        fn every_instant_reads_as_sqlite_writes_it(millis in 0i64..253_402_300_800_000) {
            let conn = rusqlite::Connection::open_in_memory().unwrap();
            prop_assert_eq!(stored_text(millis), sqlite_text(&conn, millis));
        }
    }
}
