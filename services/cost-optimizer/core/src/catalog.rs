//! The price catalog: what a GPU-hour costs per GPU product (and MIG
//! profile), location (zone or region) and capacity type, from an effective
//! date; discounts per provider; interruption priors per spot pool.
//!
//! ```yaml
//! currency: USD
//! products: [A100-SXM4-80GB, NVIDIA-A100-SXM4-80GB]
//! providers: [{name: aws, discount: 0.1}]
//! prices:
//!   - {product: A100-SXM4-80GB, capacityType: on-demand, pricePerGpuHour: 4.10,
//!      effectiveFrom: "2026-01-01T00:00:00Z", provider: aws}
//!   - {product: A100-SXM4-80GB, location: us-east-1a, capacityType: spot,
//!      pricePerGpuHour: 1.64, effectiveFrom: "2026-01-01T00:00:00Z"}
//! interruption:
//!   - {product: A100-SXM4-80GB, bucket: "5-10%"}
//! ```
//!
//! A price entry stays in force until the next entry of the same key takes
//! over (or its own `effectiveUntil`). Lookups take the most specific entry:
//! one naming the node's zone beats one naming its region, which beats one
//! naming no location.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::CostError;

/// The capacity types a price can be quoted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityKind {
    Spot,
    OnDemand,
    Reserved,
}

impl CapacityKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityKind::Spot => "spot",
            CapacityKind::OnDemand => "on-demand",
            CapacityKind::Reserved => "reserved",
        }
    }
}

/// AWS Spot Advisor's buckets: the share of instances of a pool interrupted
/// in a month.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SpotAdvisorBucket {
    #[serde(rename = "<5%")]
    Under5,
    #[serde(rename = "5-10%")]
    From5To10,
    #[serde(rename = "10-15%")]
    From10To15,
    #[serde(rename = "15-20%")]
    From15To20,
    #[serde(rename = ">20%")]
    Over20,
}

/// Hours in an average month, the period Spot Advisor's frequencies are over.
const HOURS_PER_MONTH: f64 = 730.0;

impl SpotAdvisorBucket {
    /// Reclaims per node-hour for the middle of the bucket: a monthly
    /// interruption share p is a Poisson rate of -ln(1 - p) per month.
    pub fn reclaims_per_node_hour(self) -> f64 {
        let monthly_share = match self {
            SpotAdvisorBucket::Under5 => 0.025,
            SpotAdvisorBucket::From5To10 => 0.075,
            SpotAdvisorBucket::From10To15 => 0.125,
            SpotAdvisorBucket::From15To20 => 0.175,
            SpotAdvisorBucket::Over20 => 0.25,
        };
        -(1.0_f64 - monthly_share).ln() / HOURS_PER_MONTH
    }
}

/// A provider's negotiated discount off list price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderEntry {
    pub name: String,
    /// Fraction off list, in [0, 1).
    #[serde(default)]
    pub discount: f64,
}

/// One price, in force from `effective_from`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriceEntry {
    pub product: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    /// Zone or region; absent: every location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Whose discount applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    pub capacity_type: CapacityKind,
    pub price_per_gpu_hour: f64,
    pub effective_from: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_until: Option<DateTime<Utc>>,
}

/// The interruption prior of the spot pools an entry matches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterruptionEntry {
    /// Absent: every product.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Zone or region; absent: every location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<SpotAdvisorBucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaims_per_node_hour: Option<f64>,
}

impl InterruptionEntry {
    fn rate(&self) -> f64 {
        self.reclaims_per_node_hour
            .or(self.bucket.map(SpotAdvisorBucket::reclaims_per_node_hour))
            .unwrap_or(0.0)
    }
}

fn default_currency() -> String {
    "USD".into()
}

fn default_prior_node_hours() -> f64 {
    200.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CatalogFile {
    #[serde(default = "default_currency")]
    currency: String,
    products: Vec<String>,
    #[serde(default)]
    providers: Vec<ProviderEntry>,
    prices: Vec<PriceEntry>,
    #[serde(default)]
    interruption: Vec<InterruptionEntry>,
    /// How many node-hours of observation the prior is worth.
    #[serde(default = "default_prior_node_hours")]
    prior_node_hours: f64,
}

/// What is priced: a GPU of a product (or a MIG slice) on a node in a zone
/// and region, of a capacity type.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PriceKey {
    pub product: String,
    pub mig_profile: Option<String>,
    pub zone: Option<String>,
    pub region: Option<String>,
    pub capacity: CapacityKind,
}

/// A stretch of time over which one price was in force.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceSpan {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// After the provider's discount.
    pub per_gpu_hour: f64,
}

/// A validated catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceCatalog {
    file: CatalogFile,
}

/// How well a location names a node's place: zone 2, region 1, unset 0.
fn location_rank(location: Option<&str>, zone: Option<&str>, region: Option<&str>) -> Option<u8> {
    match location {
        None => Some(0),
        Some(l) if Some(l) == zone => Some(2),
        Some(l) if Some(l) == region => Some(1),
        Some(_) => None,
    }
}

fn entry_error(entry: String, field: &'static str, reason: impl Into<String>) -> CostError {
    CostError::CatalogEntry {
        entry,
        field,
        reason: reason.into(),
    }
}

impl PriceCatalog {
    /// Parses and validates a catalog.
    pub fn parse(yaml: &str) -> Result<Self, CostError> {
        let file: CatalogFile =
            yaml_serde::from_str(yaml).map_err(|e| CostError::CatalogSyntax(e.to_string()))?;
        let catalog = PriceCatalog { file };
        catalog.validate()?;
        Ok(catalog)
    }

    /// Replaces this catalog with `yaml` if that is valid; otherwise keeps
    /// this one in force and says why.
    pub fn reload(&mut self, yaml: &str) -> Result<(), CostError> {
        *self = PriceCatalog::parse(yaml)?;
        Ok(())
    }

    pub fn currency(&self) -> &str {
        &self.file.currency
    }

    /// Node-hours of observation the interruption prior is worth.
    pub fn prior_node_hours(&self) -> f64 {
        self.file.prior_node_hours
    }

    fn validate(&self) -> Result<(), CostError> {
        let f = &self.file;
        if f.currency.trim().is_empty() {
            return Err(entry_error(
                "currency".into(),
                "currency",
                "must not be empty (e.g. USD)",
            ));
        }
        if !(f.prior_node_hours.is_finite() && f.prior_node_hours > 0.0) {
            return Err(entry_error(
                "priorNodeHours".into(),
                "priorNodeHours",
                format!("must be a positive number, got {}", f.prior_node_hours),
            ));
        }
        for (i, p) in f.providers.iter().enumerate() {
            if !(p.discount.is_finite() && (0.0..1.0).contains(&p.discount)) {
                return Err(entry_error(
                    format!("providers[{i}] ({})", p.name),
                    "discount",
                    format!("must be a fraction in [0, 1), got {}", p.discount),
                ));
            }
        }
        let known = |product: &str| f.products.iter().any(|p| p == product);
        for (i, p) in f.prices.iter().enumerate() {
            let entry = format!("prices[{i}] ({} {})", p.product, p.capacity_type.as_str());
            if !known(&p.product) {
                return Err(entry_error(
                    entry,
                    "product",
                    format!(
                        "unknown GPU product {:?}: add it to `products` or fix the name",
                        p.product
                    ),
                ));
            }
            if !(p.price_per_gpu_hour.is_finite() && p.price_per_gpu_hour >= 0.0) {
                return Err(entry_error(
                    entry,
                    "pricePerGpuHour",
                    format!("must be zero or more, got {}", p.price_per_gpu_hour),
                ));
            }
            if let Some(provider) = &p.provider
                && !f.providers.iter().any(|d| &d.name == provider)
            {
                return Err(entry_error(
                    entry,
                    "provider",
                    format!("unknown provider {provider:?}: add it to `providers`"),
                ));
            }
            if let Some(until) = p.effective_until
                && until <= p.effective_from
            {
                return Err(entry_error(
                    entry,
                    "effectiveUntil",
                    "must be after effectiveFrom",
                ));
            }
        }
        self.check_overlaps()?;
        for (i, e) in f.interruption.iter().enumerate() {
            let entry = format!("interruption[{i}]");
            if let Some(product) = &e.product
                && !known(product)
            {
                return Err(entry_error(
                    entry,
                    "product",
                    format!("unknown GPU product {product:?}: add it to `products`"),
                ));
            }
            match (e.bucket, e.reclaims_per_node_hour) {
                (Some(_), Some(_)) | (None, None) => {
                    return Err(entry_error(
                        entry,
                        "bucket",
                        "give exactly one of bucket and reclaimsPerNodeHour",
                    ));
                }
                (None, Some(rate)) if !(rate.is_finite() && rate >= 0.0) => {
                    return Err(entry_error(
                        entry,
                        "reclaimsPerNodeHour",
                        format!("must be zero or more, got {rate}"),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn check_overlaps(&self) -> Result<(), CostError> {
        type Key<'a> = (
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            CapacityKind,
        );
        let mut by_key: BTreeMap<Key<'_>, Vec<usize>> = BTreeMap::new();
        for (i, p) in self.file.prices.iter().enumerate() {
            by_key
                .entry((
                    &p.product,
                    p.mig_profile.as_deref(),
                    p.location.as_deref(),
                    p.provider.as_deref(),
                    p.capacity_type,
                ))
                .or_default()
                .push(i);
        }
        for indices in by_key.values_mut() {
            indices.sort_by_key(|i| self.file.prices[*i].effective_from);
            for pair in indices.windows(2) {
                let (a, b) = (&self.file.prices[pair[0]], &self.file.prices[pair[1]]);
                let overlaps = a.effective_from == b.effective_from
                    || a.effective_until.is_some_and(|u| u > b.effective_from);
                if overlaps {
                    return Err(entry_error(
                        format!(
                            "prices[{}] ({} {})",
                            pair[1],
                            b.product,
                            b.capacity_type.as_str()
                        ),
                        "effectiveFrom",
                        format!(
                            "overlaps prices[{}], in force from {}{}: end one before the other starts",
                            pair[0],
                            a.effective_from.to_rfc3339(),
                            a.effective_until
                                .map(|u| format!(" until {}", u.to_rfc3339()))
                                .unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn discount(&self, provider: Option<&str>) -> f64 {
        provider
            .and_then(|name| self.file.providers.iter().find(|p| p.name == name))
            .map_or(0.0, |p| p.discount)
    }

    /// Entries for `key`, the most specific location only, ordered by start.
    fn entries_for(&self, key: &PriceKey) -> Vec<&PriceEntry> {
        let candidates: Vec<(u8, &PriceEntry)> = self
            .file
            .prices
            .iter()
            .filter(|p| {
                p.product == key.product
                    && p.mig_profile == key.mig_profile
                    && p.capacity_type == key.capacity
            })
            .filter_map(|p| {
                location_rank(
                    p.location.as_deref(),
                    key.zone.as_deref(),
                    key.region.as_deref(),
                )
                .map(|rank| (rank, p))
            })
            .collect();
        let best = candidates.iter().map(|(rank, _)| *rank).max();
        let mut entries: Vec<&PriceEntry> = candidates
            .into_iter()
            .filter(|(rank, _)| Some(*rank) == best)
            .map(|(_, p)| p)
            .collect();
        entries.sort_by_key(|p| p.effective_from);
        entries
    }

    /// When each entry of `entries` stops being in force.
    fn entry_end(entries: &[&PriceEntry], i: usize) -> Option<DateTime<Utc>> {
        let next = entries.get(i + 1).map(|p| p.effective_from);
        match (entries[i].effective_until, next) {
            (Some(u), Some(n)) => Some(u.min(n)),
            (u, n) => u.or(n),
        }
    }

    /// The price per GPU-hour in force for `key` at `at`, after discount.
    pub fn price_at(&self, key: &PriceKey, at: DateTime<Utc>) -> Option<f64> {
        let entries = self.entries_for(key);
        (0..entries.len())
            .find(|&i| {
                entries[i].effective_from <= at
                    && Self::entry_end(&entries, i).is_none_or(|end| at < end)
            })
            .map(|i| {
                entries[i].price_per_gpu_hour
                    * (1.0 - self.discount(entries[i].provider.as_deref()))
            })
    }

    /// The prices in force over `[start, end)`, split where one entry hands
    /// over to the next. Stretches with no price in force are left out.
    pub fn spans(
        &self,
        key: &PriceKey,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Vec<PriceSpan> {
        let entries = self.entries_for(key);
        let mut spans = Vec::new();
        for i in 0..entries.len() {
            let from = entries[i].effective_from.max(start);
            let to = Self::entry_end(&entries, i).map_or(end, |e| e.min(end));
            if from < to {
                spans.push(PriceSpan {
                    start: from,
                    end: to,
                    per_gpu_hour: entries[i].price_per_gpu_hour
                        * (1.0 - self.discount(entries[i].provider.as_deref())),
                });
            }
        }
        spans
    }

    /// The catalog's interruption prior for spot nodes of `product` in
    /// `zone`/`region`: the most specific entry, else `fallback`.
    pub fn interruption_prior(
        &self,
        product: &str,
        zone: Option<&str>,
        region: Option<&str>,
        fallback: f64,
    ) -> f64 {
        self.file
            .interruption
            .iter()
            .filter(|e| e.product.as_deref().is_none_or(|p| p == product))
            .filter_map(|e| {
                let rank = location_rank(e.location.as_deref(), zone, region)?;
                Some((rank * 2 + u8::from(e.product.is_some()), e))
            })
            .max_by_key(|(rank, _)| *rank)
            .map_or(fallback, |(_, e)| e.rate())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
currency: USD
products: [A100-SXM4-80GB, H100-SXM5-80GB]
providers: [{name: aws, discount: 0.1}]
prices:
  - {product: A100-SXM4-80GB, capacityType: on-demand, pricePerGpuHour: 4.0, effectiveFrom: "2026-01-01T00:00:00Z"}
  - {product: A100-SXM4-80GB, capacityType: on-demand, pricePerGpuHour: 3.0, effectiveFrom: "2026-06-01T00:00:00Z"}
  - {product: A100-SXM4-80GB, capacityType: spot, pricePerGpuHour: 1.5, effectiveFrom: "2026-01-01T00:00:00Z"}
  - {product: A100-SXM4-80GB, location: zone-b, capacityType: spot, pricePerGpuHour: 1.0, effectiveFrom: "2026-01-01T00:00:00Z", provider: aws}
interruption:
  - {bucket: "10-15%"}
  - {product: A100-SXM4-80GB, location: zone-b, reclaimsPerNodeHour: 0.05}
"#;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().expect("time")
    }

    fn key(capacity: CapacityKind, zone: Option<&str>) -> PriceKey {
        PriceKey {
            product: "A100-SXM4-80GB".into(),
            mig_profile: None,
            zone: zone.map(String::from),
            region: None,
            capacity,
        }
    }

    #[test]
    fn the_price_in_force_follows_effective_dates_and_the_most_specific_location() {
        let c = PriceCatalog::parse(GOOD).expect("valid");
        let od = key(CapacityKind::OnDemand, Some("zone-a"));
        assert_eq!(c.price_at(&od, t("2026-03-01T00:00:00Z")), Some(4.0));
        assert_eq!(c.price_at(&od, t("2026-07-01T00:00:00Z")), Some(3.0));
        assert_eq!(c.price_at(&od, t("2025-07-01T00:00:00Z")), None);
        let spot_a = key(CapacityKind::Spot, Some("zone-a"));
        let spot_b = key(CapacityKind::Spot, Some("zone-b"));
        assert_eq!(c.price_at(&spot_a, t("2026-03-01T00:00:00Z")), Some(1.5));
        let discounted = c
            .price_at(&spot_b, t("2026-03-01T00:00:00Z"))
            .expect("price");
        assert!((discounted - 0.9).abs() < 1e-12, "{discounted}");
    }

    #[test]
    fn spans_split_at_a_price_change() {
        let c = PriceCatalog::parse(GOOD).expect("valid");
        let spans = c.spans(
            &key(CapacityKind::OnDemand, None),
            t("2026-05-31T23:00:00Z"),
            t("2026-06-01T01:00:00Z"),
        );
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].per_gpu_hour, 4.0);
        assert_eq!(spans[0].end, t("2026-06-01T00:00:00Z"));
        assert_eq!(spans[1].per_gpu_hour, 3.0);
    }

    #[test]
    fn interruption_priors_take_the_most_specific_entry() {
        let c = PriceCatalog::parse(GOOD).expect("valid");
        assert_eq!(
            c.interruption_prior("A100-SXM4-80GB", Some("zone-b"), None, 1.0),
            0.05
        );
        let bucket = c.interruption_prior("H100-SXM5-80GB", Some("zone-b"), None, 1.0);
        assert!((bucket - SpotAdvisorBucket::From10To15.reclaims_per_node_hour()).abs() < 1e-12);
    }

    fn error_of(yaml: &str) -> String {
        PriceCatalog::parse(yaml).expect_err("invalid").to_string()
    }

    #[test]
    fn bad_entries_are_named_with_the_fix() {
        let negative = GOOD.replace("pricePerGpuHour: 1.5", "pricePerGpuHour: -1.5");
        assert_eq!(
            error_of(&negative),
            "price catalog prices[2] (A100-SXM4-80GB spot).pricePerGpuHour: must be zero or more, got -1.5"
        );
        let unknown = GOOD.replace(
            "{product: A100-SXM4-80GB, capacityType: spot",
            "{product: A10G, capacityType: spot",
        );
        assert!(
            error_of(&unknown).starts_with(
                "price catalog prices[2] (A10G spot).product: unknown GPU product \"A10G\""
            ),
            "{}",
            error_of(&unknown)
        );
        let overlapping = GOOD.replace("2026-06-01T00:00:00Z", "2026-01-01T00:00:00Z");
        assert!(
            error_of(&overlapping).contains(".effectiveFrom: overlaps prices[0]"),
            "{}",
            error_of(&overlapping)
        );
        let until = GOOD.replace(
            "pricePerGpuHour: 4.0, effectiveFrom: \"2026-01-01T00:00:00Z\"",
            "pricePerGpuHour: 4.0, effectiveFrom: \"2026-01-01T00:00:00Z\", effectiveUntil: \"2026-07-01T00:00:00Z\"",
        );
        assert!(error_of(&until).contains("overlaps prices[0]"));
        let provider = GOOD.replace("provider: aws", "provider: gcp");
        assert!(error_of(&provider).contains("unknown provider \"gcp\""));
        let both = GOOD.replace(
            "{bucket: \"10-15%\"}",
            "{bucket: \"10-15%\", reclaimsPerNodeHour: 0.1}",
        );
        assert!(error_of(&both).contains("interruption[0].bucket"));
        assert!(error_of("prices: [").starts_with("price catalog: "));
    }

    #[test]
    fn a_bad_reload_keeps_the_last_good_catalog() {
        let mut c = PriceCatalog::parse(GOOD).expect("valid");
        let before = c.clone();
        let bad = GOOD.replace("pricePerGpuHour: 4.0", "pricePerGpuHour: -4.0");
        assert!(c.reload(&bad).is_err());
        assert_eq!(c, before);
        let cheaper = GOOD.replace("pricePerGpuHour: 4.0", "pricePerGpuHour: 3.5");
        c.reload(&cheaper).expect("valid");
        assert_eq!(
            c.price_at(
                &key(CapacityKind::OnDemand, None),
                t("2026-03-01T00:00:00Z")
            ),
            Some(3.5)
        );
    }
}
