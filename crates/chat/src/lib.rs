//! Protocol-neutral conversations and their rendering into prompts with the model's chat template.
//!
//! In: a [`Conversation`] (messages with roles, text, tool calls and tool results; tools as JSON schemas) or the
//! same as JSON values. Out: the prompt text, rendered by [`ChatTemplate`] exactly as Hugging Face transformers
//! renders `tokenizer.chat_template` (checked byte for byte against Python Jinja2 by `fixtures/chat/`). Tokenizing
//! the prompt is the `tokenizer` crate's job. The model's output is read back by [`reasoning`] (a thinking model's
//! reasoning split from its content) and [`tool_parser`] (tool calls in the content).

mod conversation;
mod error;
pub mod python;
pub mod reasoning;
mod template;
pub mod tool_parser;

pub use conversation::{Content, ContentPart, Conversation, Message, Role, Tool, ToolCall};
pub use error::{Error, Result};
pub use reasoning::{ReasoningEvent, ReasoningParser};
pub use template::{ChatTemplate, RenderInput};
pub use tool_parser::{ParseEvent, ToolCallParser};
