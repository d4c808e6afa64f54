//! The `splash` binary: wires the crates together behind one command line.

mod bench;
mod cuda_check;
mod load;
mod ls;
mod plan;
mod pull;
mod run;
mod serve;
mod spec;
mod synth;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "splash", version, about = "A local LLM inference engine built around the model")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text once (or chat interactively when no prompt is given).
    Run(run::Args),
    /// Measure prefill and decode speed.
    Bench(bench::Args),
    /// Fetch models into the cache ($SPLASH_HOME, default ~/.cache/splash).
    Pull(pull::Args),
    /// List the built-in packs and whether their files are in the cache.
    Ls(ls::LsArgs),
    /// Delete a pack's model file from the cache.
    Rm(ls::RmArgs),
    /// Print the memory plan (context, sequences, KV pages) for a model on this or a simulated machine.
    Plan(plan::Args),
    /// Serve the model over HTTP (OpenAI-compatible API).
    Serve(serve::Args),
    /// Write a synthetic GGUF with a real model's shapes and tensor types and random values.
    Synth(synth::Args),
    /// Check the CUDA backend against the CPU backend on a model (logits, top-1, batched vs unbatched).
    CudaCheck(cuda_check::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => run::main(a),
        Command::Bench(a) => bench::main(a),
        Command::Pull(a) => pull::main(a),
        Command::Ls(a) => ls::ls(a),
        Command::Rm(a) => ls::rm(a),
        Command::Plan(a) => plan::main(a),
        Command::Serve(a) => serve::main(a),
        Command::Synth(a) => synth::main(a),
        Command::CudaCheck(a) => cuda_check::main(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
