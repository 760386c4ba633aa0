//! Standard optimisation test functions with known optima, shared by the core's
//! tests and the `hpo_*` benchmark binaries.

use crate::error::SpecError;
use crate::space::{ParamSpec, Params, SearchSpace};

/// Global minimum of Branin.
pub const BRANIN_MIN: f64 = 0.397_887_357_729_738;
/// Global minimum of Hartmann6.
pub const HARTMANN6_MIN: f64 = -3.322_368_011_415_51;

/// Branin on `x1 in [-5, 10]`, `x2 in [0, 15]` (three global minima).
pub fn branin(x1: f64, x2: f64) -> f64 {
    let pi = std::f64::consts::PI;
    let b = 5.1 / (4.0 * pi * pi);
    let c = 5.0 / pi;
    let t = 1.0 / (8.0 * pi);
    (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

const H6_ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
const H6_A: [[f64; 6]; 4] = [
    [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
    [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
    [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
    [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
];
const H6_P: [[f64; 6]; 4] = [
    [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
    [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
    [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
    [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
];

/// Hartmann6 on `[0, 1]^6`.
pub fn hartmann6(x: &[f64; 6]) -> f64 {
    let mut total = 0.0;
    for i in 0..4 {
        let inner: f64 = (0..6)
            .map(|j| H6_A[i][j] * (x[j] - H6_P[i][j]).powi(2))
            .sum();
        total += H6_ALPHA[i] * (-inner).exp();
    }
    -total
}

/// `x1`, `x2` floats with Branin's bounds.
pub fn branin_space() -> Result<SearchSpace, SpecError> {
    SearchSpace::new(vec![
        ParamSpec::float("x1", -5.0, 10.0),
        ParamSpec::float("x2", 0.0, 15.0),
    ])
}

/// `x0..x5` floats in `[0, 1]`.
pub fn hartmann6_space() -> Result<SearchSpace, SpecError> {
    SearchSpace::new(
        (0..6)
            .map(|i| ParamSpec::float(format!("x{i}"), 0.0, 1.0))
            .collect(),
    )
}

/// Branin of a parameter set from [`branin_space`] (`NaN` if a value is missing).
pub fn branin_params(p: &Params) -> f64 {
    match (p.f64("x1"), p.f64("x2")) {
        (Some(a), Some(b)) => branin(a, b),
        _ => f64::NAN,
    }
}

/// Hartmann6 of a parameter set from [`hartmann6_space`] (`NaN` if a value is missing).
pub fn hartmann6_params(p: &Params) -> f64 {
    let mut x = [0.0; 6];
    for (i, xi) in x.iter_mut().enumerate() {
        match p.f64(&format!("x{i}")) {
            Some(v) => *xi = v,
            None => return f64::NAN,
        }
    }
    hartmann6(&x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_minima() {
        let pi = std::f64::consts::PI;
        for (a, b) in [(-pi, 12.275), (pi, 2.275), (9.42478, 2.475)] {
            assert!((branin(a, b) - BRANIN_MIN).abs() < 1e-5);
        }
        let xh = [0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573];
        assert!((hartmann6(&xh) - HARTMANN6_MIN).abs() < 1e-5);
    }
}
