//! The `splash` binary: wires the crates together behind one command line.

mod agents;
mod bench;
mod cuda_check;
mod kld;
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
    /// Run Claude Code on the local server (started in the background if none answers).
    Claude(agents::Args),
    /// Run OpenAI Codex CLI on the local server.
    Codex(agents::Args),
    /// Run OpenCode on the local server.
    #[command(name = "opencode")]
    OpenCode(agents::Args),
    /// Run Hermes Agent on the local server (needs a 64K context).
    Hermes(agents::HermesArgs),
    /// Run Pi on the local server (adds a provider entry to Pi's models.json).
    Pi(agents::Args),
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
        Command::Claude(a) => agents::main(agents::Client::Claude, a, false),
        Command::Codex(a) => agents::main(agents::Client::Codex, a, false),
        Command::OpenCode(a) => agents::main(agents::Client::OpenCode, a, false),
        Command::Hermes(a) => agents::main(agents::Client::Hermes, a.common, a.allow_small_context),
        Command::Pi(a) => agents::main(agents::Client::Pi, a, false),
        Command::Synth(a) => synth::main(a),
        Command::CudaCheck(a) => cuda_check::main(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_command_lines() {
        let cli =
            Cli::try_parse_from(["splash", "codex", "--port", "9001", "--no-serve", "--", "exec", "-c", "x=1", "hi"])
                .expect("parses");
        let Command::Codex(a) = cli.command else { panic!("codex") };
        assert_eq!((a.port, a.no_serve), (9001, true));
        assert_eq!(a.agent_args, ["exec", "-c", "x=1", "hi"]);
        let cli = Cli::try_parse_from(["splash", "hermes", "--allow-small-context", "--model", "m"]).expect("parses");
        let Command::Hermes(a) = cli.command else { panic!("hermes") };
        assert!(a.allow_small_context && a.common.model.as_deref() == Some("m") && a.common.agent_args.is_empty());
        assert!(Cli::try_parse_from(["splash", "opencode", "--pack", "qwen2.5-coder-0.5b"]).is_ok());
        // Agent flags must come after `--`, so a typo in ours is not silently handed to the agent.
        assert!(Cli::try_parse_from(["splash", "claude", "-p", "hi"]).is_err());
    }
}
