//! The tables' figures: the rates, their medians over the rounds, the ratios of the pump to
//! the direct consumer.

use std::collections::BTreeMap;

use crate::run::{Broker, Timing, Variant};

/// Rates by (broker, prefetch, variant), one per round.
pub(crate) type Rates = BTreeMap<(Broker, u16, Variant), Vec<f64>>;

pub(crate) fn rate(messages: usize, timing: Timing) -> f64 {
    messages as f64 / timing.consuming.as_secs_f64()
}

pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// `median (min–max)` of the per-round ratios `numerator / denominator`.
pub(crate) fn ratio(
    rates: &Rates,
    broker: Broker,
    prefetch: u16,
    over: (Variant, Variant),
) -> String {
    let (Some(top), Some(bottom)) = (
        rates.get(&(broker, prefetch, over.0)),
        rates.get(&(broker, prefetch, over.1)),
    ) else {
        return "–".into();
    };
    let ratios: Vec<f64> = top
        .iter()
        .zip(bottom)
        .map(|(top, bottom)| top / bottom)
        .filter(|r| r.is_finite())
        .collect();
    let Some(mid) = median(&ratios) else {
        return "–".into();
    };
    let low = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let high = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if ratios.len() > 1 {
        format!("{mid:.2} ({low:.2}–{high:.2})")
    } else {
        format!("{mid:.2}")
    }
}

pub(crate) fn cell(rates: &Rates, key: (Broker, u16, Variant)) -> String {
    rates
        .get(&key)
        .and_then(|values| median(values))
        .map_or_else(|| "–".into(), |rate| format!("{rate:.0}/s"))
}
