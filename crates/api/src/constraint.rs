//! Constrained decoding with llguidance: the output formats a request can demand (`response_format` json_object /
//! json_schema, Responses `text.format`, a required or named tool call) turned into an `engine::TokenConstraint`
//! that masks the logits from the first generated token.
//!
//! In: an [`OutputFormat`] or the tools of a forced call, and the model's tokenizer. Out: a boxed constraint for
//! `GenerateRequest::constraint`, or a 400 naming the field when a schema cannot be compiled. The token trie
//! (~150 ms for Qwen's 151k tokens) is built once per tokenizer and shared. JSON is compiled compact, with `", "`
//! and `": "` separators (what the models' templates show them), so small models cannot pad with whitespace.

use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::ApiError;

/// What the reply's text must be.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum OutputFormat {
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under this schema.
    JsonSchema(Value),
}

/// The tokenizer as llguidance sees it: a trie of token bytes (control tokens marked with 0xFF so no text matches
/// them) and the tokenizer for text.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<tokenizer::Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tokenizer.encode(&String::from_utf8_lossy(s), false).unwrap_or_default()
    }
}

/// The last factory built: (tokenizer address, vocabulary size) and the factory.
type FactoryCache = Option<((usize, usize), Arc<ParserFactory>)>;

/// The parser factory of `tokenizer`, built on first use.
pub(crate) fn factory(tokenizer: &Arc<tokenizer::Tokenizer>) -> Result<Arc<ParserFactory>, ApiError> {
    static CACHE: Mutex<FactoryCache> = Mutex::new(None);
    let key = (Arc::as_ptr(tokenizer) as usize, tokenizer.vocab_size());
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, f)) = cache.as_ref()
        && *k == key
    {
        return Ok(f.clone());
    }
    let vocab = tokenizer.vocab_size() as u32;
    let eos = tokenizer
        .eos()
        .or_else(|| tokenizer.eog_ids().first().copied())
        .ok_or_else(|| ApiError::invalid("Constrained output needs a model with an end-of-text token."))?;
    let words: Vec<Vec<u8>> = (0..vocab)
        .map(|id| {
            let bytes = tokenizer.token_bytes(id);
            if tokenizer.is_control(id) || tokenizer.is_eog(id) {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(bytes);
                w
            } else {
                bytes.to_vec()
            }
        })
        .collect();
    let trie = TokTrie::from(&TokRxInfo::new(vocab, eos), &words);
    let env: TokEnv = Arc::new(Env { trie, tokenizer: tokenizer.clone() });
    let mut f = ParserFactory::new_simple(&env)
        .map_err(|e| ApiError::internal(format!("setting up constrained decoding failed: {e}")))?;
    f.set_stderr_log_level(0);
    let f = Arc::new(f);
    *cache = Some((key, f.clone()));
    Ok(f)
}

/// Builds the token trie and parser factory of `tokenizer` now (a server calls this at start, off the request
/// path), so the first constrained request does not pay for it.
pub fn warm_up(tokenizer: &Arc<tokenizer::Tokenizer>) -> Result<(), ApiError> {
    factory(tokenizer).map(|_| ())
}

/// Compact JSON options, put on a schema as llguidance's `x-guidance`.
fn with_options(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "coerce_one_of": true}),
        );
    }
    schema
}

/// The grammar of a reply that is exactly one Hermes-style call of one of `tools` (name → parameters schema),
/// written after the prompt's `<tool_call>\n`: `{"name": NAME, "arguments": ARGS}\n</tool_call>`.
pub fn tool_call_grammar(tools: &[(String, Value)]) -> Value {
    with_options(call_object_schema(tools, false))
}

/// The JSON schema of one call object `{"name": NAME, "arguments": ARGS}` of one of `tools`: the arguments follow
/// the tool's parameters schema (its objects closed, [`close_objects`]), or (`loose`, or a tool without one) any
/// object.
pub(crate) fn call_object_schema(tools: &[(String, Value)], loose: bool) -> Value {
    let variants: Vec<Value> = tools
        .iter()
        .map(|(name, parameters)| {
            let arguments = if !loose && parameters.as_object().is_some_and(|o| !o.is_empty()) {
                let mut arguments = parameters.clone();
                close_objects(&mut arguments);
                arguments
            } else {
                json!({"type": "object"})
            };
            json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": arguments},
                "required": ["name", "arguments"],
                "additionalProperties": false
            })
        })
        .collect();
    if variants.len() == 1 { variants[0].clone() } else { json!({"anyOf": variants}) }
}

/// In a tool's parameters schema, an object that lists its `properties` and says nothing of `additionalProperties`
/// gets `additionalProperties: false`, at every depth: a call's arguments then hold only the keys the tool declares.
/// JSON Schema would allow any other key there; small models fill such room with keys copied from the prompt
/// (Hermes on the Qwen2.5-Coder 0.5B added `required`, `resolved_path` and `files_modified` to `write_file`), and the
/// client's own validation may refuse them. llama.cpp's schema-to-grammar converter reads a missing
/// `additionalProperties` the same way. Left open: an object without `properties` (a free-form map), one that
/// combines its properties with `allOf` / `anyOf` / `oneOf` / `if` / `$ref` or says `unevaluatedProperties`, and
/// the members of an `allOf` (each would forbid the keys the others add).
pub(crate) fn close_objects(schema: &mut Value) {
    close_objects_in(schema, true);
}

fn close_objects_in(schema: &mut Value, closable: bool) {
    const COMBINED: [&str; 6] = ["allOf", "anyOf", "oneOf", "if", "$ref", "unevaluatedProperties"];
    match schema {
        Value::Object(o) => {
            if closable
                && o.get("properties").is_some_and(Value::is_object)
                && !o.contains_key("additionalProperties")
                && !COMBINED.iter().any(|k| o.contains_key(*k))
            {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (key, value) in o.iter_mut() {
                match key.as_str() {
                    // Maps of names to schemas.
                    "properties" | "patternProperties" | "$defs" | "definitions" => {
                        if let Some(m) = value.as_object_mut() {
                            m.values_mut().for_each(close_objects);
                        }
                    }
                    // Each member must accept the keys the others declare.
                    "allOf" => {
                        if let Some(members) = value.as_array_mut() {
                            members.iter_mut().for_each(|m| close_objects_in(m, false));
                        }
                    }
                    // A schema, or a list of them.
                    "items"
                    | "prefixItems"
                    | "additionalProperties"
                    | "anyOf"
                    | "oneOf"
                    | "not"
                    | "if"
                    | "then"
                    | "else"
                    | "contains" => close_objects(value),
                    // Keywords whose values are data, not schemas (`const`, `enum`, `default`, `examples`, ...).
                    _ => {}
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// A compiled grammar, ready to constrain one request.
pub struct Constraint {
    matcher: Matcher,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").finish_non_exhaustive()
    }
}

impl Constraint {
    fn compile(
        tokenizer: &Arc<tokenizer::Tokenizer>,
        grammar: TopLevelGrammar,
        param: &str,
    ) -> Result<Constraint, ApiError> {
        let parser = factory(tokenizer)?
            .create_parser(grammar)
            .map_err(|e| ApiError::invalid_param(param, format!("The schema cannot be used: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ApiError::invalid_param(param, format!("The schema cannot be used: {e}")));
        }
        Ok(Constraint { matcher })
    }

    /// The constraint of an output format (`None` for plain text); `param` names the field in errors.
    pub fn for_format(
        tokenizer: &Arc<tokenizer::Tokenizer>,
        format: &OutputFormat,
        param: &str,
    ) -> Result<Option<Constraint>, ApiError> {
        let schema = match format {
            OutputFormat::Text => return Ok(None),
            OutputFormat::JsonObject => json!({"type": "object"}),
            OutputFormat::JsonSchema(s) if s.is_object() => s.clone(),
            OutputFormat::JsonSchema(_) => return Err(ApiError::invalid_param(param, "The schema must be an object.")),
        };
        Self::compile(tokenizer, TopLevelGrammar::from_json_schema(with_options(schema)), param).map(Some)
    }

    /// The constraint of a forced call of one of `tools`, continuing after `<tool_call>\n`.
    pub fn for_tool_call(
        tokenizer: &Arc<tokenizer::Tokenizer>,
        tools: &[(String, Value)],
    ) -> Result<Constraint, ApiError> {
        let schema = tool_call_grammar(tools);
        let lark = format!("start: call \"\\n</tool_call>\"\ncall: %json {schema}\n");
        Self::compile(tokenizer, TopLevelGrammar::from_lark(lark), "tools")
    }

    /// The constraint of a forced call of one of `tools` in Qwen3-Coder's XML form, continuing after
    /// `<tool_call>\n`: `<function=NAME>`, that tool's parameters (`lazy_call::xml_call_rules`: each value as the
    /// output parser reads it, typed by its schema), `</function>\n</tool_call>`. `loose`: every value is text.
    pub fn for_xml_tool_call(
        tokenizer: &Arc<tokenizer::Tokenizer>,
        tools: &[(String, Value)],
        loose: bool,
    ) -> Result<Constraint, ApiError> {
        let rules = crate::lazy_call::xml_call_rules(tools, loose);
        let lark = format!("start: xcall \"\\n</tool_call>\"\nWS: /[ \\t\\r\\n]{{0,8}}/\n{rules}");
        Self::compile(tokenizer, TopLevelGrammar::from_lark(lark), "tools")
    }
}

impl engine::TokenConstraint for Constraint {
    fn allowed_tokens(&mut self, allowed: &mut [u32]) -> Result<(), String> {
        let mask = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        let words = mask.as_slice();
        for (i, w) in allowed.iter_mut().enumerate() {
            *w &= words.get(i).copied().unwrap_or(0);
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::close_objects;

    #[test]
    fn objects_with_properties_are_closed_at_every_depth_and_the_rest_left_open() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "edits": {"type": "array", "items": {"type": "object", "properties": {"old": {"type": "string"}}}},
                "env": {"type": "object"},
                "meta": {"type": "object", "properties": {"k": {"const": {"properties": {}}}},
                         "additionalProperties": true},
                "either": {"anyOf": [{"type": "object", "properties": {"x": {}}}, {"type": "string"}]},
                "both": {"allOf": [{"properties": {"a": {"type": "object", "properties": {"b": {}}}}},
                                   {"properties": {"c": {}}}]}
            },
            "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}}
        });
        close_objects(&mut schema);
        let expect = json!({
            "type": "object",
            "properties": {
                "edits": {"type": "array", "items": {"type": "object", "properties": {"old": {"type": "string"}},
                          "additionalProperties": false}},
                "env": {"type": "object"},
                "meta": {"type": "object", "properties": {"k": {"const": {"properties": {}}}},
                         "additionalProperties": true},
                "either": {"anyOf": [{"type": "object", "properties": {"x": {}}, "additionalProperties": false},
                                     {"type": "string"}]},
                "both": {"allOf": [{"properties": {"a": {"type": "object", "properties": {"b": {}},
                                                         "additionalProperties": false}}},
                                   {"properties": {"c": {}}}]}
            },
            "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}},
                                "additionalProperties": false}},
            "additionalProperties": false
        });
        assert_eq!(schema, expect);
    }
}
