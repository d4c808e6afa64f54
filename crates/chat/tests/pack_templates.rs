//! The packs' corrected chat templates (crates/pack/packs/templates) render byte for byte as Python Jinja2 renders
//! them (set up as transformers does): the expected texts in fixtures/chat/pack_templates.json come from
//! `scripts/fixtures/gen_pack_template_fixtures.py`, which also checked them against the 0.5B file's own template.
//! Covers the tool prompt without the 1.5B file's doubled braces, system turns mid-conversation, and a tool result
//! without content.

use chat::{ChatTemplate, RenderInput};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Fixture {
    bos_token: String,
    eos_token: String,
    templates: std::collections::BTreeMap<String, String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    template: String,
    name: String,
    messages: Vec<Value>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    add_generation_prompt: bool,
    expected: String,
}

#[test]
fn corrected_templates_match_jinja2() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/chat/pack_templates.json");
    let fixture: Fixture =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("fixture JSON");
    assert!(fixture.cases.len() >= 16, "{} cases", fixture.cases.len());
    let mut failures = Vec::new();
    for case in &fixture.cases {
        let source = &fixture.templates[&case.template];
        // Built the way a pack applies it: the model's template with the pack's source swapped in.
        let original =
            ChatTemplate::new("{{ 'model file template' }}", &fixture.bos_token, &fixture.eos_token).expect("compiles");
        let template = original.with_source(source.clone()).expect("corrected template compiles");
        assert_eq!((template.bos_token(), template.eos_token()), (original.bos_token(), original.eos_token()));
        let input = RenderInput {
            messages: case.messages.clone(),
            tools: case.tools.clone(),
            add_generation_prompt: case.add_generation_prompt,
            extra: Default::default(),
        };
        match template.render(&input) {
            Ok(text) if text == case.expected => {}
            Ok(text) => failures.push(format!("{}: got\n{text}\nexpected\n{}", case.name, case.expected)),
            Err(e) => failures.push(format!("{}: {e}", case.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
    // The cases that motivated the override are in the fixture.
    let names: Vec<&str> = fixture.cases.iter().map(|c| c.name.as_str()).collect();
    for needed in ["tools_list", "system_turns_mid_conversation", "tool_result_without_content"] {
        assert!(names.contains(&needed), "{needed}");
    }
    let tools = fixture.cases.iter().find(|c| c.name == "tools_list").expect("tools case");
    assert!(tools.expected.contains("\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"));
}
