//! `render_protected`: every string the client gave reaches the template through `protect` (message fields, tool
//! definitions at any depth, object keys, tool-call arguments after they are parsed from JSON text, extra template
//! variables), the template's own text and `bos_token` / `eos_token` never do.

use chat::{ChatTemplate, RenderInput};
use serde_json::json;

#[test]
fn every_client_string_goes_through_protect() {
    let source = "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}|{{ m.name }}\
        {% for c in m.tool_calls or [] %}|{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}]\
        {% endfor %}{{ tools | tojson }}|{{ note }}|{{ eos_token }}";
    let template = ChatTemplate::new(source, "!bos", "!eos").unwrap();
    let mut input = RenderInput {
        messages: vec![
            json!({"role": "user", "content": "!hi", "name": "!ann"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": "{\"!k\": [\"!v\"]}"}}]}),
        ],
        tools: Some(vec![json!({"type": "function", "function": {"name": "!f", "description": "!d",
            "parameters": {"type": "object", "properties": {"!k": {"type": "string"}}}}})]),
        add_generation_prompt: false,
        extra: Default::default(),
    };
    input.extra.insert("note".into(), json!("!n"));
    let plain = template.render(&input).unwrap();
    assert_eq!(template.render_protected(&input, &|_| None).unwrap(), plain, "no change: the same prompt");
    // Strings starting with `!` are marked: only the client's are, and the arguments' only once parsed.
    let got = template.render_protected(&input, &|s| s.starts_with('!').then(|| format!("«{s}»"))).unwrap();
    assert_eq!(
        got,
        "!bos[user:«!hi»|«!ann»][assistant:None||f({\"«!k»\": [\"«!v»\"]})]\
         [{\"type\": \"function\", \"function\": {\"name\": \"«!f»\", \"description\": \"«!d»\", \
         \"parameters\": {\"type\": \"object\", \"properties\": {\"«!k»\": {\"type\": \"string\"}}}}}]\
         |«!n»|!eos"
    );
}
