//! Text formatting shared by the tables: ages, durations, numbers, column alignment.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Placeholder for a value that is not known (yet), as kubectl's `<none>` but shorter.
pub const NONE: &str = "-";

/// Spaces between columns; kubectl's tabwriter uses three.
const COLUMN_GAP: usize = 3;

/// Seconds from `earlier` to `later`, negative when the clocks disagree.
pub fn seconds_between(earlier: &Time, later: &Time) -> f64 {
    later.0.duration_since(earlier.0).as_secs_f64()
}

/// The AGE column: kubectl's rounding (`45s`, `2m30s`, `3h`, `5d`), so the table reads
/// like `kubectl get`.
pub fn age(created: Option<&Time>, now: Timestamp) -> String {
    match created {
        Some(created) => human_duration(now.duration_since(created.0).as_secs_f64()),
        None => "<unknown>".to_owned(),
    }
}

/// kubectl's `duration.HumanDuration`: coarser the older it gets.
pub fn human_duration(seconds: f64) -> String {
    // Up to two seconds in the future count as now: the client's clock may lag the server's.
    if seconds < -1.0 {
        return "<invalid>".to_owned();
    }
    if seconds < 0.0 {
        return "0s".to_owned();
    }
    // Truncation toward zero is what kubectl does with whole seconds.
    let seconds = seconds as u64;
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

/// A precise duration for the summary, where seconds matter (`12.3s`, `4m05s`, `2h03m`).
pub fn precise_duration(seconds: f64) -> String {
    if seconds < 0.0 {
        return format!("-{}", precise_duration(-seconds));
    }
    if seconds < 60.0 {
        return format!("{seconds:.1}s");
    }
    // Whole seconds are precise enough beyond a minute.
    let whole = seconds.round() as u64;
    if whole < 3600 {
        format!("{}m{:02}s", whole / 60, whole % 60)
    } else {
        format!("{}h{:02}m", whole / 3600, (whole % 3600) / 60)
    }
}

/// A metric value with at most four decimals and no trailing zeros (`0.231`, `12`).
pub fn number(value: f64) -> String {
    let text = format!("{value:.4}");
    let trimmed = text.trim_end_matches('0').trim_end_matches('.');
    match trimmed {
        "" | "-" | "-0" => "0".to_owned(),
        other => other.to_owned(),
    }
}

/// Column widths that fit every row (header included), counted in characters.
pub fn column_widths(rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (index, cell) in row.iter().enumerate() {
            let width = cell.chars().count();
            match widths.get_mut(index) {
                Some(existing) => *existing = (*existing).max(width),
                None => widths.push(width),
            }
        }
    }
    widths
}

/// One table line: every cell but the last padded to its column width plus the gap.
/// A cell wider than its column (a watch row that arrives after the header) still
/// keeps the gap, so columns never run together.
pub fn table_line(cells: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    let last = cells.len().saturating_sub(1);
    for (index, cell) in cells.iter().enumerate() {
        line.push_str(cell);
        if index < last {
            let width = widths.get(index).copied().unwrap_or(0);
            let padding = width.saturating_sub(cell.chars().count()) + COLUMN_GAP;
            line.push_str(&" ".repeat(padding));
        }
    }
    line
}

/// A whole table, widths fitted to its rows.
pub fn table(rows: &[Vec<String>]) -> String {
    let widths = column_widths(rows);
    rows.iter()
        .map(|row| table_line(row, &widths) + "\n")
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_round_like_kubectl() {
        let cases = [
            (-5.0, "<invalid>"),
            (-0.5, "0s"),
            (0.0, "0s"),
            (59.9, "59s"),
            (119.0, "119s"),
            (120.0, "2m"),
            (150.0, "2m30s"),
            (600.0, "10m"),
            (179.0 * 60.0, "179m"),
            (3.0 * 3600.0, "3h"),
            (3.0 * 3600.0 + 300.0, "3h5m"),
            (47.0 * 3600.0, "47h"),
            (50.0 * 3600.0, "2d2h"),
            (72.0 * 3600.0, "3d"),
            (30.0 * 86400.0, "30d"),
            (800.0 * 86400.0, "2y70d"),
            (730.0 * 86400.0, "2y"),
            (4000.0 * 86400.0, "10y"),
        ];
        for (seconds, expected) in cases {
            assert_eq!(human_duration(seconds), expected, "{seconds}");
        }
    }

    #[test]
    fn ages_come_from_the_creation_timestamp() {
        let created = Time(Timestamp::from_second(1_000).expect("valid"));
        let now = Timestamp::from_second(1_150).expect("valid");
        assert_eq!(age(Some(&created), now), "2m30s");
        assert_eq!(age(None, now), "<unknown>");
        let later = Time(now);
        assert_eq!(seconds_between(&created, &later), 150.0);
        assert_eq!(seconds_between(&later, &created), -150.0);
    }

    #[test]
    fn precise_durations_keep_seconds() {
        assert_eq!(precise_duration(0.0), "0.0s");
        assert_eq!(precise_duration(12.34), "12.3s");
        assert_eq!(precise_duration(245.0), "4m05s");
        assert_eq!(precise_duration(3600.0 * 2.0 + 180.0), "2h03m");
        assert_eq!(precise_duration(-3.0), "-3.0s");
    }

    #[test]
    fn numbers_drop_trailing_zeros() {
        assert_eq!(number(0.231), "0.231");
        assert_eq!(number(12.0), "12");
        assert_eq!(number(0.123456), "0.1235");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(-0.00001), "0");
        assert_eq!(number(-1.5), "-1.5");
    }

    #[test]
    fn tables_align_columns_with_three_spaces() {
        let rows = vec![
            vec!["NAME".to_owned(), "STATE".to_owned(), "AGE".to_owned()],
            vec![
                "a-long-name".to_owned(),
                "Running".to_owned(),
                "5s".to_owned(),
            ],
        ];
        assert_eq!(
            table(&rows),
            "NAME          STATE     AGE\na-long-name   Running   5s\n"
        );
    }

    #[test]
    fn wide_cells_keep_the_gap_and_unicode_counts_as_one() {
        let widths = [2, 2];
        let cells = ["abcdef".to_owned(), "×".to_owned(), "z".to_owned()];
        assert_eq!(table_line(&cells, &widths), "abcdef   ×    z");
        assert_eq!(column_widths(&[vec!["×2".to_owned()]]), [2]);
    }
}
