//! Qwen3-Coder's chat template (`templates/qwen3-coder.jinja`, the vendored llama.cpp's
//! `models/templates/Qwen3-Coder.jinja`) with tool calls in the history: a call the client sends back is rendered in
//! the XML form the model writes, and the output parser reads that text back as the same call (values typed by the
//! tool's schema both ways).

use chat::{ChatTemplate, Conversation, Message, ParseEvent, RenderInput, Tool, ToolCall, ToolCallParser};
use serde_json::{Value, json};

const QWEN3_CODER: &str = include_str!("../templates/qwen3-coder.jinja");

fn bash_tool() -> Tool {
    Tool {
        name: "Bash".into(),
        description: Some("Runs a shell command.".into()),
        parameters: json!({"type": "object", "properties": {"command": {"type": "string"},
                           "timeout": {"type": "number"}, "env": {"type": "object"}}, "required": ["command"]}),
    }
}

/// The calls the parser reads in `text`, given the tool.
fn parse(text: &str, tool: &Tool) -> Vec<ToolCall> {
    let schemas = [(tool.name.clone(), tool.parameters.clone())];
    let mut parser = ToolCallParser::new([tool.name.clone()]).with_schemas(&schemas);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    events.into_iter().filter_map(|e| if let ParseEvent::ToolCall(c) = e { Some(c) } else { None }).collect()
}

#[test]
fn a_call_in_the_history_renders_as_xml_and_parses_back() {
    let tool = bash_tool();
    let arguments = json!({"command": "echo 30 > n.txt\ncat n.txt", "timeout": 30, "env": {"A": [1, "b"]}});
    let call = ToolCall { id: Some("call_1".into()), name: "Bash".into(), arguments: arguments.clone() };
    let assistant = Message::assistant_tool_calls(None, vec![call]);
    let conversation = Conversation {
        messages: vec![Message::user("Write 30 to n.txt"), assistant, Message::tool_result("call_1", "30")],
        tools: vec![tool.clone()],
    };
    let template = ChatTemplate::new(QWEN3_CODER, "", "<|im_end|>").expect("template compiles");
    let prompt = template.render(&RenderInput::from_conversation(&conversation, true)).expect("renders");
    let turn = "<|im_start|>assistant\n<tool_call>\n<function=Bash>\n<parameter=command>\necho 30 > n.txt\ncat n.txt\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=env>\n{\"A\": [1, \"b\"]}\n</parameter>\n</function>\n</tool_call><|im_end|>\n";
    assert!(prompt.contains(turn), "{prompt}");
    assert!(prompt.contains("<|im_start|>user\n<tool_response>\n30\n</tool_response>\n<|im_end|>\n"), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    assert!(prompt.contains("<name>timeout</name>\n<type>number</type>"), "the tool list shows the types: {prompt}");
    // What the model would write is what the history shows: it reads back as the call.
    let written = &turn["<|im_start|>assistant\n".len()..turn.len() - "<|im_end|>\n".len()];
    let calls = parse(written, &tool);
    assert_eq!(calls.len(), 1);
    assert_eq!((calls[0].name.as_str(), &calls[0].arguments), ("Bash", &arguments));
}

#[test]
fn a_string_argument_that_looks_like_a_number_stays_a_string_both_ways() {
    let tool = bash_tool();
    let arguments: Value = json!({"command": "42"});
    let call = ToolCall { id: None, name: "Bash".into(), arguments: arguments.clone() };
    let assistant = Message::assistant_tool_calls(Some("Running it.".into()), vec![call]);
    let conversation = Conversation { messages: vec![Message::user("Hi"), assistant], tools: vec![tool.clone()] };
    let template = ChatTemplate::new(QWEN3_CODER, "", "<|im_end|>").expect("template compiles");
    let prompt = template.render(&RenderInput::from_conversation(&conversation, false)).expect("renders");
    let start = prompt.rfind("<|im_start|>assistant\n").expect("assistant turn") + "<|im_start|>assistant\n".len();
    let written = prompt[start..].strip_suffix("<|im_end|>\n").expect("turn end");
    assert_eq!(
        written,
        "Running it.\n\n<tool_call>\n<function=Bash>\n<parameter=command>\n42\n</parameter>\n</function>\n</tool_call>"
    );
    let calls = parse(written, &tool);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments, arguments);
}
