//! Tokenizers read from GGUF metadata: byte-level BPE (`tokenizer.ggml.model = "gpt2"`) with llama.cpp's
//! pre-tokenizers, special-token handling and end-of-generation rules, so that token ids equal llama.cpp's.
//!
//! In: a [`gguf::GgufFile`]. Out: a [`Tokenizer`] (text ⇄ ids, special ids, EOG test) and, per generated sequence, a
//! [`Detokenizer`] that streams text. The BPE merging itself is the `tokenizers` crate's model, built in memory from
//! `tokenizer.ggml.tokens` / `merges`; pre-tokenization and special tokens follow llama.cpp (`llama-vocab.cpp`) and
//! are checked against it by the fixtures in `fixtures/tokenizer/`. Chat prompts are tokenized so that only the
//! template's own text can write control tokens ([`Tokenizer::protect`], [`Tokenizer::encode_prompt`]).

mod bytes;
mod detokenizer;
mod error;
mod memo;
mod pretokenizer;
mod prompt;
mod tokenizer;
mod vocab;

pub use detokenizer::Detokenizer;
pub use error::{Error, Result};
pub use prompt::{BREAK, ESCAPE, unmark};
pub use tokenizer::Tokenizer;
pub use vocab::SpecialIds;
