pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong building a tokenizer from a GGUF file or encoding text with it.
///
/// All variants but [`Error::Regex`] are load-time problems with the file; `Regex` is request-scoped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] gguf::Error),
    #[error("GGUF metadata has no {0:?}; the file carries no usable tokenizer")]
    MissingKey(&'static str),
    #[error("tokenizer model {0:?} is not supported (supported: byte-level BPE, \"gpt2\")")]
    UnsupportedModel(String),
    #[error("pre-tokenizer {0:?} is not supported")]
    UnsupportedPreTokenizer(String),
    #[error("{key} has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch { key: &'static str, found: usize, expected: usize },
    #[error("invalid vocabulary: {0}")]
    BadVocab(String),
    #[error("cannot build the BPE model: {0}")]
    Bpe(String),
    #[error("pre-tokenizer regex failed on the input: {0}")]
    Regex(String),
}
