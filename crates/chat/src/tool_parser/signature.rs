//! What a declared tool's arguments may hold, read from its parameter schema: used to read a call written without
//! its name (`nameless.rs`) and a tool entry echoed with values (`tools_block.rs`).

use serde_json::{Map, Value};

/// What a declared tool's arguments may hold, from its parameter schema.
#[derive(Debug, Clone)]
pub(super) struct Signature {
    pub(super) name: String,
    /// Each parameter's own schema, by name.
    pub(super) properties: Map<String, Value>,
    pub(super) required: Vec<String>,
    /// It takes parameters it does not declare ([`super::qwen3_xml::takes_undeclared`]).
    pub(super) open: bool,
}

impl Signature {
    pub(super) fn from_schema(name: &str, schema: &Value) -> Signature {
        Signature {
            name: name.to_owned(),
            properties: schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default(),
            required: schema
                .get("required")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect())
                .unwrap_or_default(),
            open: super::qwen3_xml::takes_undeclared(schema),
        }
    }

    /// The arguments in an echo of this tool's schema whose `properties` hold values in place of some parameters'
    /// schemas (`"cmd": "printf 'hi' > hello.txt"` where the tool declares `"cmd": {"type": "string", ...}`). An
    /// entry that is a schema (the declared one, or any object with a `type` or `description`) or the parameter's
    /// own description copied is no value.
    pub(super) fn filled_in(&self, properties: &Map<String, Value>) -> Option<Map<String, Value>> {
        let mut args = Map::new();
        for (key, value) in properties {
            let declared = self.properties.get(key)?;
            let is_schema = value == declared
                || value.as_object().is_some_and(|o| o.contains_key("type") || o.contains_key("description"));
            if is_schema || (value.is_string() && declared.get("description") == Some(value)) {
                continue;
            }
            args.insert(key.clone(), value.clone());
        }
        (!args.is_empty() && self.accepts(&args)).then_some(args)
    }

    /// Whether `args` can be this tool's arguments: every key a parameter, every required parameter there.
    pub(super) fn accepts(&self, args: &Map<String, Value>) -> bool {
        args.keys().all(|k| self.properties.contains_key(k)) && self.required.iter().all(|k| args.contains_key(k))
    }
}
