//! Kubernetes resource quantities (`500m`, `2`, `16Gi`, `1.5G`, `1e3`) as
//! whole numbers of a unit: CPU in millicores, memory in bytes.
//!
//! Rounded up, as the scheduler does (`MilliValue`, `Value`): a request of
//! `0.1m` CPU still asks for a millicore, so nothing that asks for something
//! is counted as asking for nothing.

use std::fmt;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Why a quantity did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityError {
    pub quantity: String,
    pub reason: &'static str,
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a Kubernetes quantity ({}): use e.g. 500m, 4, 16Gi or 1.5G",
            self.quantity, self.reason
        )
    }
}

impl std::error::Error for QuantityError {}

/// CPU in millicores (`500m` → 500, `2` → 2000, `0.25` → 250).
pub fn cpu_millis(quantity: &str) -> Result<u64, QuantityError> {
    scaled(quantity, 3)
}

/// Memory (or any count) in whole units (`16Gi` → 17179869184, `1k` → 1000).
pub fn bytes(quantity: &str) -> Result<u64, QuantityError> {
    scaled(quantity, 0)
}

/// What a container asks for of each resource, with the list it is stated
/// in (`requests` or `limits`): its request, or its limit where it states no
/// request, as the API server defaults a missing request to the limit.
pub fn requested(
    resources: &ResourceRequirements,
) -> impl Iterator<Item = (&'static str, &String, &Quantity)> {
    let requests = resources.requests.as_ref();
    let stated = requests
        .into_iter()
        .flatten()
        .map(|(name, quantity)| ("requests", name, quantity));
    let limits_alone = resources
        .limits
        .iter()
        .flatten()
        .filter(move |(name, _)| !requests.is_some_and(|r| r.contains_key(*name)))
        .map(|(name, quantity)| ("limits", name, quantity));
    stated.chain(limits_alone)
}

/// `quantity` times `10^decimal_scale`, rounded up.
fn scaled(quantity: &str, decimal_scale: u32) -> Result<u64, QuantityError> {
    let error = |reason| QuantityError {
        quantity: quantity.to_string(),
        reason,
    };
    let text = quantity.trim();
    let text = text.strip_prefix('+').unwrap_or(text);
    if text.starts_with('-') {
        return Err(error("negative"));
    }
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(error("no number"));
    }
    if fraction.contains('.') {
        return Err(error("two decimal points"));
    }
    // The number as an integer over 10^fraction digits.
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = digits.parse().map_err(|_| error("number too large"))?;
    let fraction_digits = i64::try_from(fraction.len()).map_err(|_| error("too many digits"))?;
    // (binary exponent, decimal exponent) of the suffix.
    let (binary, decimal): (u32, i64) = match suffix {
        "" => (0, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        other => match other.strip_prefix(['e', 'E']) {
            Some(exponent) => (
                0,
                exponent
                    .parse::<i64>()
                    .map_err(|_| error("unknown suffix"))?,
            ),
            None => return Err(error("unknown suffix")),
        },
    };
    let exponent = decimal + i64::from(decimal_scale) - fraction_digits;
    let too_large = || error("too large");
    let mut value = mantissa.checked_shl(binary).ok_or_else(too_large)?;
    if binary > 0 && value >> binary != mantissa {
        return Err(too_large());
    }
    if exponent >= 0 {
        let power = 10u128
            .checked_pow(u32::try_from(exponent).map_err(|_| too_large())?)
            .ok_or_else(too_large)?;
        value = value.checked_mul(power).ok_or_else(too_large)?;
    } else {
        let divisor = u32::try_from(-exponent)
            .ok()
            .and_then(|e| 10u128.checked_pow(e));
        value = match divisor {
            Some(d) => value.div_ceil(d),
            // Smaller than any unit, but more than nothing.
            None => u128::from(value > 0),
        };
    }
    u64::try_from(value).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_reads_cores_millicores_and_fractions() {
        assert_eq!(cpu_millis("500m"), Ok(500));
        assert_eq!(cpu_millis("2"), Ok(2000));
        assert_eq!(cpu_millis("0.25"), Ok(250));
        assert_eq!(cpu_millis("1.5"), Ok(1500));
        assert_eq!(cpu_millis(".5"), Ok(500));
        assert_eq!(cpu_millis("100u"), Ok(1), "rounded up, never to nothing");
        assert_eq!(cpu_millis("0"), Ok(0));
        assert_eq!(cpu_millis("1e3"), Ok(1_000_000));
    }

    #[test]
    fn memory_reads_binary_and_decimal_suffixes() {
        assert_eq!(bytes("16Gi"), Ok(16 << 30));
        assert_eq!(bytes("512Mi"), Ok(512 << 20));
        assert_eq!(bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(bytes("1G"), Ok(1_000_000_000));
        assert_eq!(bytes("128974848"), Ok(128_974_848));
        assert_eq!(bytes("129e6"), Ok(129_000_000));
        assert_eq!(bytes("2Ti"), Ok(2 << 40));
        assert_eq!(bytes("1500m"), Ok(2), "rounded up");
    }

    #[test]
    fn a_container_requests_its_requests_and_the_limits_it_states_no_request_for() {
        let resources: ResourceRequirements = serde_json::from_value(serde_json::json!({
            "requests": {"cpu": "2"},
            "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"},
        }))
        .expect("resources");
        let asked: Vec<(&str, &str, &str)> = requested(&resources)
            .map(|(list, name, quantity)| (list, name.as_str(), quantity.0.as_str()))
            .collect();
        assert_eq!(
            asked,
            [
                ("requests", "cpu", "2"),
                ("limits", "memory", "8Gi"),
                ("limits", "nvidia.com/gpu", "1")
            ]
        );
    }

    #[test]
    fn bad_quantities_say_why() {
        for (bad, reason) in [
            ("", "no number"),
            ("Gi", "no number"),
            ("-1", "negative"),
            ("4 cores", "unknown suffix"),
            ("1.2.3", "two decimal points"),
            ("16GB", "unknown suffix"),
            ("100Ei", "too large"),
        ] {
            let err = bytes(bad).expect_err(bad);
            assert_eq!(err.reason, reason, "{bad}");
        }
        let message = bytes("16GB").map_err(|e| e.to_string());
        assert!(
            message
                .as_ref()
                .is_err_and(|m| m.contains("use e.g. 500m, 4, 16Gi")),
            "{message:?}"
        );
    }
}
