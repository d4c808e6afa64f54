pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Chat-template failures. `Syntax` and `NoTemplate` concern the model; the others are request-scoped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] gguf::Error),
    #[error("the model has no chat template (tokenizer.chat_template)")]
    NoTemplate,
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template itself refused the conversation with `raise_exception(message)`.
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    #[error("chat template failed: {0}")]
    Render(String),
    #[error("invalid template input: {0}")]
    BadInput(String),
}
