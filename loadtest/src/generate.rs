//! A seeded generator of sample GPU traces in the Tiresias columns
//! (`job_id,num_gpu,submit_time,iterations,model_name,duration,interval`),
//! so the project can ship a trace of its own rather than a copy of anyone's.
//!
//! The model, per job, all from one `StdRng::seed_from_u64(seed)` stream in
//! this order (arrival gap, GPUs, model, duration):
//! - **Arrivals**: a Poisson process; gaps between submissions are
//!   exponential with mean `mean_interval_seconds` (inverse-CDF sampling).
//!   The first job is submitted at 0 so a replay starts at once. Submit times
//!   are the running sums rounded to whole seconds, as in the Tiresias trace.
//! - **GPUs**: 1, 2, 4, 8 or 16 with probabilities 0.55, 0.15, 0.15, 0.10,
//!   0.05 ([`GPU_MIX`]). Most jobs are single-GPU with a long tail of large
//!   gangs, the shape reported for production GPU clusters such as
//!   Microsoft's Philly (Jeon et al., USENIX ATC 2019) and SenseTime's Helios
//!   (Hu et al., SC 2021). The weights are chosen to mirror that shape in
//!   spirit; they are not fitted to, or taken from, either trace.
//! - **Model**: uniform over [`MODELS`].
//! - **Duration**: log-normal, `exp(ln(median) + sigma × Z)` with `Z`
//!   standard normal (Box–Muller), rounded to whole seconds and clamped to
//!   [`MIN_DURATION_SECONDS`, `MAX_DURATION_SECONDS`] so one draw cannot
//!   dominate a short replay.
//! - **Iterations**: `duration ÷ seconds per iteration` of the model
//!   (nominal figures, see [`MODELS`]), at least 1, so a simulator can use
//!   either column.
//!
//! Determinism: the same configuration gives the same trace, byte for byte,
//! with the `rand` release in `Cargo.lock`. `StdRng` is not promised to stay
//! the same algorithm across `rand` releases; if an upgrade changes it, the
//! test comparing the shipped sample trace with a regeneration fails, and the
//! sample must be regenerated with the command in `loadtest/traces/README.md`.

use std::f64::consts::TAU;
use std::path::PathBuf;

use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Error;
use crate::trace::TraceJob;

/// GPU counts and their probabilities.
pub const GPU_MIX: [(u32, f64); 5] = [(1, 0.55), (2, 0.15), (4, 0.15), (8, 0.10), (16, 0.05)];

/// Model names and nominal seconds per training iteration, used only to turn
/// a duration into an iteration count.
pub const MODELS: [(&str, f64); 6] = [
    ("resnet50", 0.25),
    ("resnet152", 0.55),
    ("vgg16", 0.40),
    ("inception3", 0.35),
    ("bert-base", 0.30),
    ("gpt2-small", 0.45),
];

pub const MIN_DURATION_SECONDS: f64 = 60.0;
pub const MAX_DURATION_SECONDS: f64 = 6.0 * 3600.0;

/// Generator settings. The defaults: 40 jobs about 30 s apart (the Tiresias
/// trace's pace) running a median of 10 minutes with σ = 1 (so roughly 1 in 6
/// jobs over 27 minutes).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct GeneratorConfig {
    /// Seed of the random draws: the same seed gives the same trace.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Number of jobs.
    #[arg(long, default_value_t = 40)]
    pub jobs: usize,
    /// Mean gap between submissions, in seconds.
    #[arg(long = "mean-interval", default_value_t = 30.0)]
    pub mean_interval_seconds: f64,
    /// Median run time, in seconds.
    #[arg(long = "median-duration", default_value_t = 600.0)]
    pub median_duration_seconds: f64,
    /// Standard deviation of the duration's natural logarithm.
    #[arg(long = "sigma", default_value_t = 1.0)]
    pub duration_sigma: f64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        // The command line's defaults are the one place they are written.
        GenArgs::parse_from(["gen_trace"]).config
    }
}

impl GeneratorConfig {
    /// Refuses settings that cannot make a trace, naming the setting.
    pub fn validate(&self) -> Result<(), Error> {
        let positive = |name, v: f64, fix| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::InvalidArgument {
                    name,
                    value: v.to_string(),
                    fix,
                })
            }
        };
        positive(
            "mean_interval_seconds",
            self.mean_interval_seconds,
            "give the mean gap between submissions in seconds, greater than 0",
        )?;
        positive(
            "median_duration_seconds",
            self.median_duration_seconds,
            "give the median run time in seconds, greater than 0",
        )?;
        if !(self.duration_sigma.is_finite() && self.duration_sigma >= 0.0) {
            return Err(Error::InvalidArgument {
                name: "duration_sigma",
                value: self.duration_sigma.to_string(),
                fix: "give the log-normal sigma, at least 0",
            });
        }
        Ok(())
    }
}

/// Generates `config.jobs` jobs with ids `0`, `1`, … in submission order; see
/// the module docs for the model.
pub fn generate(config: &GeneratorConfig) -> Result<Vec<TraceJob>, Error> {
    config.validate()?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let mut clock = 0.0f64;
    let mut jobs = Vec::with_capacity(config.jobs);
    for i in 0..config.jobs {
        if i > 0 {
            clock += exponential(&mut rng, config.mean_interval_seconds);
        }
        let gpus = pick_gpus(rng.random::<f64>());
        let (model, seconds_per_iteration) = MODELS[rng.random_range(0..MODELS.len())];
        let duration = (config.median_duration_seconds.ln()
            + config.duration_sigma * standard_normal(&mut rng))
        .exp()
        .round()
        .clamp(MIN_DURATION_SECONDS, MAX_DURATION_SECONDS);
        jobs.push(TraceJob {
            id: i.to_string(),
            gpus,
            submit_seconds: clock.round(),
            iterations: ((duration / seconds_per_iteration).round() as u64).max(1),
            model: model.to_string(),
            duration_seconds: duration,
            workers: None,
            queue: None,
        });
    }
    Ok(jobs)
}

fn exponential(rng: &mut StdRng, mean: f64) -> f64 {
    // random() is in [0, 1), so 1 − u is in (0, 1] and the log is finite.
    -mean * (1.0 - rng.random::<f64>()).ln()
}

fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos()
}

/// Maps a uniform draw in [0, 1) onto [`GPU_MIX`].
fn pick_gpus(u: f64) -> u32 {
    let mut cumulative = 0.0;
    for (gpus, p) in GPU_MIX {
        cumulative += p;
        if u < cumulative {
            return gpus;
        }
    }
    // Rounding can leave the cumulative sum a hair under 1.
    GPU_MIX[GPU_MIX.len() - 1].0
}

/// What the `gen_trace` command line asks for: a seeded sample GPU trace in
/// the Tiresias columns.
#[derive(Debug, Clone, PartialEq, Parser)]
#[command(name = "gen_trace")]
pub struct GenArgs {
    #[command(flatten)]
    pub config: GeneratorConfig,
    /// Where to write the CSV; standard output when absent.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::trace::{parse_trace, to_csv};

    /// Parses `gen_trace` flags (without the program name) and checks the
    /// settings, as the binary does.
    fn parse_args(args: impl IntoIterator<Item = String>) -> Result<GenArgs, Error> {
        let parsed = GenArgs::try_parse_from(std::iter::once("gen_trace".to_owned()).chain(args))
            .map_err(|e| Error::InvalidArgument {
            name: "argument",
            value: e.to_string(),
            fix: "see gen_trace --help",
        })?;
        parsed.config.validate()?;
        Ok(parsed)
    }

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn same_seed_same_trace_other_seed_other_trace() -> Result<(), Error> {
        let config = GeneratorConfig::default();
        let a = to_csv(&generate(&config)?)?;
        let b = to_csv(&generate(&config)?)?;
        assert_eq!(a, b);
        let other = to_csv(&generate(&GeneratorConfig { seed: 8, ..config })?)?;
        assert_ne!(a, other);
        Ok(())
    }

    #[test]
    fn output_is_a_valid_trace_in_the_tiresias_columns() -> Result<(), Error> {
        let config = GeneratorConfig {
            jobs: 500,
            ..GeneratorConfig::default()
        };
        let jobs = generate(&config)?;
        let text = to_csv(&jobs)?;
        assert!(
            text.starts_with(
                "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
            )
        );
        assert_eq!(parse_trace(&text)?, jobs);
        assert_eq!(jobs[0].submit_seconds, 0.0);
        for j in &jobs {
            assert!(GPU_MIX.iter().any(|(g, _)| *g == j.gpus));
            assert!(MODELS.iter().any(|(m, _)| *m == j.model));
            assert!((MIN_DURATION_SECONDS..=MAX_DURATION_SECONDS).contains(&j.duration_seconds));
            assert_eq!(j.duration_seconds.fract(), 0.0);
            assert_eq!(j.submit_seconds.fract(), 0.0);
            assert!(j.iterations >= 1);
        }
        // Loose shape checks on 500 draws (fixed seed, so not flaky): mostly
        // single-GPU jobs, some 16-GPU ones, and a mean gap near 30 s.
        let single = jobs.iter().filter(|j| j.gpus == 1).count();
        assert!((200..350).contains(&single), "{single}");
        assert!(jobs.iter().any(|j| j.gpus == 16));
        let mean_gap = jobs[jobs.len() - 1].submit_seconds / (jobs.len() - 1) as f64;
        assert!((20.0..40.0).contains(&mean_gap), "{mean_gap}");
        Ok(())
    }

    #[test]
    fn gpu_mix_is_a_distribution() {
        let total: f64 = GPU_MIX.iter().map(|(_, p)| p).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert_eq!(pick_gpus(0.0), 1);
        assert_eq!(pick_gpus(0.56), 2);
        assert_eq!(pick_gpus(0.9999999999), 16);
    }

    #[test]
    fn parses_flags_and_rejects_bad_ones() -> Result<(), Error> {
        let parsed = parse_args(args("--seed 3 --jobs 5 --mean-interval 12.5 --out x.csv"))?;
        assert_eq!(parsed.config.seed, 3);
        assert_eq!(parsed.config.jobs, 5);
        assert_eq!(parsed.config.mean_interval_seconds, 12.5);
        assert_eq!(parsed.out, Some(PathBuf::from("x.csv")));
        for bad in [
            "--seed",
            "--seed x",
            "--bogus 1",
            "--mean-interval 0",
            "--sigma -1",
        ] {
            assert!(
                matches!(parse_args(args(bad)), Err(Error::InvalidArgument { .. })),
                "{bad}"
            );
        }
        Ok(())
    }

    /// The command documented in loadtest/traces/README.md, run through the
    /// binary's own argument parser, reproduces the shipped file exactly.
    #[test]
    fn documented_command_reproduces_the_shipped_sample() -> Result<(), Box<dyn std::error::Error>>
    {
        let readme = std::fs::read_to_string("traces/README.md")?;
        let command = readme
            .lines()
            .find(|l| l.contains("--bin gen_trace --"))
            .ok_or("traces/README.md has no `--bin gen_trace --` command")?;
        let flags = command
            .split("--bin gen_trace --")
            .nth(1)
            .ok_or("no flags after `--bin gen_trace --`")?;
        let parsed = parse_args(args(flags.trim_end_matches('`')))?;
        let out = parsed.out.ok_or("the documented command has no --out")?;
        // The command runs from the workspace root; tests run in loadtest/.
        let shipped_path = Path::new("..").join(&out);
        let shipped = std::fs::read_to_string(&shipped_path)?;
        assert_eq!(
            to_csv(&generate(&parsed.config)?)?,
            shipped,
            "{} differs from a regeneration; rerun the command in traces/README.md",
            shipped_path.display()
        );
        Ok(())
    }
}
