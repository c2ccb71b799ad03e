//! Durations in the humantime style the config and the command line use: `90s`, `30m`,
//! `4h`, `2d`, and sums of them such as `1h30m`.

use std::time::Duration;

/// Parse `90s`, `30m`, `4h`, `2d`, `1w`, `500ms` or a sum such as `1h30m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "'{text}' is not a duration (try 90s, 30m, 4h or 2d)"
            ));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("'{text}' is too large"))?;
        rest = &rest[digits..];
        if rest.starts_with(['.', ',']) {
            return Err(format!(
                "'{text}': whole numbers only (for 1.5h write 1h30m)"
            ));
        }
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = rest[unit_len..].trim_start();
        let scale = match unit {
            "ms" => Duration::from_millis(1),
            "s" | "sec" | "secs" => Duration::from_secs(1),
            "m" | "min" | "mins" => Duration::from_secs(60),
            "h" | "hr" | "hrs" => Duration::from_secs(3600),
            "d" | "day" | "days" => Duration::from_secs(86_400),
            "w" => Duration::from_secs(7 * 86_400),
            "" => return Err(format!("'{text}' needs a unit (s, m, h or d)")),
            other => {
                return Err(format!(
                    "'{text}' has an unknown unit '{other}' (use s, m, h or d)"
                ))
            }
        };
        let part = scale
            .checked_mul(u32::try_from(number).map_err(|_| format!("'{text}' is too large"))?)
            .ok_or_else(|| format!("'{text}' is too large"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("'{text}' is too large"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("4h"), Ok(Duration::from_secs(14_400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn refuses_nonsense() {
        for bad in ["", "h", "10", "10x", "-5s", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        // A fraction is told how to write it, not that it has no unit.
        let fraction = parse_duration("1.5h").unwrap_err();
        assert!(fraction.contains("whole numbers only"), "{fraction}");
    }
}
