//! Durations in the routing config, written like Alertmanager's: `30s`, `5m`, `4h`, `250ms`, `1h30m`.

use std::time::Duration;

/// Parses `30s`, `5m`, `4h`, `2d`, `250ms` and sums like `1h30m`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; write e.g. 30s, 5m or 4h".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "{text:?} is not a duration; write e.g. 30s, 5m or 4h"
            ));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{text:?}: number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.chars().take_while(char::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value * 60),
            "h" => Duration::from_secs(value * 3600),
            "d" => Duration::from_secs(value * 86_400),
            _ => {
                return Err(format!("{text:?} has unit {unit:?}; use ms, s, m, h or d"));
            }
        };
        total += part;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_sums() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse("5 minutes").is_err());
        assert!(parse("m").is_err());
        assert!(parse("").is_err());
    }
}
