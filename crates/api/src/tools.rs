//! What every adapter checks in a request's tools, and OpenAI's `tool_choice` (one reading for Chat Completions and
//! Responses, which spell a named choice differently).
//!
//! Tool names follow the hosted APIs' rule, `[a-zA-Z0-9_-]{1,64}`: a name is written into the prompt and matched in
//! the model's output, so anything else is refused with a 400 that names the field. Tool parameter schemas are
//! compiled where a call is forced (`generate`), as `response_format`'s schema is.

use serde_json::Value;

use crate::error::ApiError;
use crate::generate::ToolChoice;

/// Longest tool name the hosted APIs accept.
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// Checks a declared tool's name (`param` names the field in the error).
pub fn check_name(name: &str, param: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(ApiError::invalid_param(param, "A tool name must not be empty."));
    }
    let bad = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'));
    if name.len() > MAX_TOOL_NAME_CHARS || bad.is_some() {
        let shown: String = name.chars().take(80).collect();
        let why = match bad {
            Some(c) => format!("it contains {c:?}"),
            None => format!("it is {} characters long", name.chars().count()),
        };
        return Err(ApiError::invalid_param(
            param,
            format!(
                "Invalid tool name {shown:?}: {why}; a tool name must match ^[a-zA-Z0-9_-]{{1,{MAX_TOOL_NAME_CHARS}}}$."
            ),
        ));
    }
    Ok(())
}

/// Which OpenAI API a `tool_choice` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenAiApi {
    /// `{"type": "function", "function": {"name": ...}}`.
    ChatCompletions,
    /// `{"type": "function" | "custom", "name": ...}`; hosted-tool and `allowed_tools` choices leave the model to
    /// decide.
    Responses,
}

/// OpenAI's `tool_choice`: `auto` (the default), `none`, `required`, or an object naming one tool.
pub fn openai_tool_choice(choice: Option<&Value>, api: OpenAiApi) -> Result<ToolChoice, ApiError> {
    let bad = || {
        let named = match api {
            OpenAiApi::ChatCompletions => "{\"type\": \"function\", \"function\": {\"name\": ...}}",
            OpenAiApi::Responses => "{\"type\": \"function\" or \"custom\", \"name\": ...}",
        };
        ApiError::invalid_param("tool_choice", format!("tool_choice must be 'auto', 'none', 'required' or {named}."))
    };
    match choice {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad()),
        },
        Some(Value::Object(o)) => match api {
            OpenAiApi::ChatCompletions => {
                let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(bad)?;
                Ok(ToolChoice::Named(name.to_owned()))
            }
            OpenAiApi::Responses => {
                match (o.get("type").and_then(Value::as_str), o.get("name").and_then(Value::as_str)) {
                    (Some("function" | "custom"), Some(name)) => Ok(ToolChoice::Named(name.to_owned())),
                    (Some(_), _) => Ok(ToolChoice::Auto),
                    _ => Err(bad()),
                }
            }
        },
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_names_follow_the_hosted_apis_rule() {
        for ok in ["bash", "Read", "mcp__github__create_issue", "a-b_c-9", &"x".repeat(64)] {
            assert!(check_name(ok, "tools[0].name").is_ok(), "{ok}");
        }
        for bad in ["", "has space", "dot.name", "<|im_start|>", "naïve", &"x".repeat(65), "semi;colon"] {
            let e = check_name(bad, "tools[0].name").unwrap_err();
            assert_eq!((e.status().as_u16(), e.param.as_deref()), (400, Some("tools[0].name")), "{bad}");
        }
        let e = check_name("a b", "p").unwrap_err();
        assert!(e.message.contains("' '") && e.message.contains("^[a-zA-Z0-9_-]{1,64}$"), "{}", e.message);
    }

    #[test]
    fn one_reading_of_tool_choice_for_both_openai_apis() {
        use OpenAiApi::*;
        for api in [ChatCompletions, Responses] {
            assert_eq!(openai_tool_choice(None, api).unwrap(), ToolChoice::Auto);
            assert_eq!(openai_tool_choice(Some(&json!("none")), api).unwrap(), ToolChoice::None);
            assert_eq!(openai_tool_choice(Some(&json!("required")), api).unwrap(), ToolChoice::Required);
            assert!(openai_tool_choice(Some(&json!("always")), api).is_err());
            assert!(openai_tool_choice(Some(&json!(3)), api).is_err());
        }
        let chat = json!({"type": "function", "function": {"name": "bash"}});
        assert_eq!(openai_tool_choice(Some(&chat), ChatCompletions).unwrap(), ToolChoice::Named("bash".into()));
        let responses = json!({"type": "custom", "name": "apply_patch"});
        assert_eq!(openai_tool_choice(Some(&responses), Responses).unwrap(), ToolChoice::Named("apply_patch".into()));
        assert_eq!(openai_tool_choice(Some(&json!({"type": "web_search"})), Responses).unwrap(), ToolChoice::Auto);
        assert!(openai_tool_choice(Some(&json!({"type": "web_search"})), ChatCompletions).is_err());
        assert!(openai_tool_choice(Some(&json!({"name": "x"})), Responses).is_err());
    }
}
