//! The `topology-sim` binary (also `cargo xtask simulate`): compare routing algorithms over the
//! KubeCon input space — in-zone traffic, overload and deviation of random, the talk's "local",
//! Auto hints, PreferClose and capacity spillover — and fail if a published property does not hold.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};
use topology_policy::feedback::Tuning;
use topology_sim::{
    dynamic::{self, Scenario},
    run::{self, Config},
};

#[derive(Parser)]
#[command(version, about = "Compare topology-aware routing algorithms over the KubeCon 2020 input space")]
struct Cli {
    /// Evaluate one input in this many (1: all 39,273,145).
    #[arg(long, default_value_t = 16)]
    sample_every: u64,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Spillover's ε values to compare (fractions).
    #[arg(long = "max-overload", value_delimiter = ',', default_values_t = [0.0, 0.05, 0.1])]
    max_overloads: Vec<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Also write the chart here.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Compare real-time feedback with the static plans over time instead: queueing backends,
    /// demand that surges and calms, one independent agent per node.
    #[arg(long)]
    dynamic: bool,
    /// The demand pattern of `--dynamic`.
    #[arg(long, value_enum, default_value_t = Scenario::Surge, requires = "dynamic")]
    scenario: Scenario,
    /// Seed of `--dynamic`'s arrivals and choices.
    #[arg(long, default_value_t = 7, requires = "dynamic")]
    seed: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.dynamic {
        let report = dynamic::simulate(cli.scenario, cli.seed, Tuning::default())?;
        match cli.output {
            Output::Table => print!("{}", report.table()),
            Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        }
        if let Some(path) = cli.svg {
            std::fs::write(&path, dynamic::chart::svg(&report))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    let mut config = Config { sample_every: cli.sample_every, max_overloads: cli.max_overloads, ..Config::default() };
    if let Some(threads) = cli.threads {
        config.threads = threads;
    }
    let report = run::run(&config);
    match cli.output {
        Output::Table => print!("{}", report.table()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    if let Some(path) = cli.svg {
        std::fs::write(&path, report.svg()).with_context(|| format!("writing {}", path.display()))?;
    }
    let failed: Vec<String> = report.checks().into_iter().filter(|c| !c.ok).map(|c| c.what).collect();
    if !failed.is_empty() {
        bail!("{} check(s) failed: {}", failed.len(), failed.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_parses_the_defaults() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["topology-sim", "--max-overload", "0,0.2", "--output", "json"]).unwrap();
        assert_eq!(cli.max_overloads, vec![0.0, 0.2]);
        assert_eq!(cli.sample_every, 16);
        assert!(Cli::try_parse_from(["topology-sim", "--sample-every", "x"]).is_err());
        let dynamic = Cli::try_parse_from(["topology-sim", "--dynamic", "--scenario", "zones"]).unwrap();
        assert!(dynamic.dynamic && dynamic.scenario == Scenario::Zones);
        assert!(Cli::try_parse_from(["topology-sim", "--scenario", "zones"]).is_err(), "needs --dynamic");
    }
}
