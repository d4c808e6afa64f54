//! Load and encode timings of a GGUF's tokenizer: `cargo run -p splash-tokenizer --release --example
//! tokenizer_bench -- <model.gguf> [text-file]`. Prints the best of several runs, which is what matters on a busy
//! machine.

use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| anyhow::anyhow!("usage: tokenizer_bench <model.gguf> [text-file]"))?;
    let text = match args.next() {
        Some(p) => std::fs::read_to_string(p)?,
        None => "fn main() {\n    println!(\"Hello, world! 123\");\n}\n// Привет 你好 🦀\n".repeat(250),
    };
    let file = gguf::GgufFile::open(&path)?;
    let mut best_load = f64::MAX;
    let mut tok = None;
    for _ in 0..7 {
        let start = Instant::now();
        let t = tokenizer::Tokenizer::from_gguf(&file)?;
        best_load = best_load.min(start.elapsed().as_secs_f64() * 1e3);
        tok = Some(t);
    }
    let tok = tok.ok_or_else(|| anyhow::anyhow!("no run"))?;
    let mut best_encode = f64::MAX;
    let mut num_tokens = 0;
    for _ in 0..20 {
        let start = Instant::now();
        num_tokens = tok.encode(&text, true)?.len();
        best_encode = best_encode.min(start.elapsed().as_secs_f64() * 1e3);
    }
    println!("load {best_load:.1} ms (best of 7); encode {num_tokens} tokens {best_encode:.2} ms (best of 20)");
    Ok(())
}
