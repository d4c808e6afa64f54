//! Renderer behaviour that needs no model: errors, template helpers and the typed conversation's JSON shape.

use chat::{ChatTemplate, Content, ContentPart, Conversation, Error, Message, RenderInput, Role, Tool, ToolCall};
use serde_json::{Value, json};

fn render(source: &str, input: &RenderInput) -> chat::Result<String> {
    ChatTemplate::new(source, "<s>", "</s>")?.render(input)
}

#[test]
fn raise_exception_becomes_a_clear_error() {
    let err = render("{{ raise_exception('roles must alternate') }}", &RenderInput::default()).unwrap_err();
    match err {
        Error::Raised(message) => assert_eq!(message, "roles must alternate"),
        other => panic!("expected Error::Raised, got {other:?}"),
    }
    assert!(err_text("{{ raise_exception('no') }}").contains("rejected the conversation: no"));
}

fn err_text(source: &str) -> String {
    render(source, &RenderInput::default()).unwrap_err().to_string()
}

#[test]
fn syntax_and_runtime_errors() {
    assert!(matches!(ChatTemplate::new("{% if %}", "", ""), Err(Error::Syntax(_))));
    assert!(matches!(render("{{ 'a' + none }}", &RenderInput::default()), Err(Error::Render(_))));
    let mut input = RenderInput::default();
    input.extra.insert("messages".into(), json!([]));
    assert!(matches!(render("x", &input), Err(Error::BadInput(_))));
}

#[test]
fn strftime_now_and_special_tokens() {
    let year = render("{{ strftime_now('%Y') }}", &RenderInput::default()).unwrap();
    let now: i32 = year.parse().unwrap();
    assert!((2024..3000).contains(&now), "{year}");
    assert!(matches!(render("{{ strftime_now('%Q') }}", &RenderInput::default()), Err(Error::Render(_))));
    let out =
        render("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}", &RenderInput::default());
    assert_eq!(out.unwrap(), "<s>|</s>|False|None");
}

#[test]
fn tojson_keeps_order_and_does_not_escape_html() {
    let mut input = RenderInput::default();
    input.extra.insert("x".into(), json!({"z": "<a href='x'>&</a>", "a": [1, 2.0, null], "m": "日本"}));
    let out = render("{{ x | tojson }}", &input).unwrap();
    assert_eq!(out, r#"{"z": "<a href='x'>&</a>", "a": [1, 2.0, null], "m": "日本"}"#);
    // Maps built inside the template keep their order too.
    let out = render("{{ {'b': 1, 'a': true} | tojson }}", &RenderInput::default()).unwrap();
    assert_eq!(out, r#"{"b": 1, "a": true}"#);
    assert!(matches!(render("{{ undefined_thing | tojson }}", &RenderInput::default()), Err(Error::Render(_))));
}

#[test]
fn tool_call_arguments_strings_are_parsed_when_valid() {
    let source = "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}{% endfor %}";
    let calls = vec![
        ToolCall { id: Some("1".into()), name: "f".into(), arguments: json!("{\"b\": 2, \"a\": [1]}") },
        ToolCall { id: None, name: "g".into(), arguments: json!({"k": "v"}) },
        ToolCall { id: None, name: "h".into(), arguments: json!("not json") },
    ];
    let conversation = Conversation { messages: vec![Message::assistant_tool_calls(None, calls)], tools: vec![] };
    let out = render(source, &RenderInput::from_conversation(&conversation, false)).unwrap();
    assert_eq!(out, r#"{"b": 2, "a": [1]};{"k": "v"};"not json";"#);
}

#[test]
fn typed_messages_have_the_openai_template_shape() {
    let call = ToolCall { id: Some("call_1".into()), name: "get_weather".into(), arguments: json!({"city": "Oslo"}) };
    let conversation = Conversation {
        messages: vec![
            Message::system("sys"),
            Message::user(Content::Parts(vec![
                ContentPart::Text { text: "part one".into() },
                ContentPart::Text { text: "part two".into() },
            ])),
            Message::assistant_tool_calls(Some("Checking.".into()), vec![call.clone()]),
            Message { name: Some("get_weather".into()), ..Message::tool_result("call_1", "sunny") },
        ],
        tools: vec![Tool { name: "get_weather".into(), description: None, parameters: json!({"type": "object"}) }],
    };
    let input = RenderInput::from_conversation(&conversation, true);
    assert_eq!(
        Value::Array(input.messages.clone()),
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "part one\npart two"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ]},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"},
        ])
    );
    assert_eq!(
        input.tools,
        Some(vec![json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})])
    );
    // serde uses the same OpenAI shape both ways.
    let round: Conversation = serde_json::from_value(serde_json::to_value(&conversation).unwrap()).unwrap();
    assert_eq!(round, conversation);
    let parsed: ToolCall =
        serde_json::from_value(json!({"id": "x", "type": "function", "function": {"name": "f", "arguments": "{}"}}))
            .unwrap();
    assert_eq!(parsed.arguments, json!("{}"));
    assert_eq!(Role::Tool.as_str(), "tool");
    // Image parts are not supported and say so.
    assert!(
        serde_json::from_value::<Message>(json!({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}))
            .is_err()
    );
}
