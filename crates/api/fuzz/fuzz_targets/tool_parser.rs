//! The streaming tool-call parser never panics, gives the same events however the text is split, and loses no text
//! when it finds no call. Input: the first byte picks split points (as a seed), the rest is the model's output.
#![no_main]

mod split;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let tools = [
        ("get_weather".to_owned(), serde_json::json!({"properties": {"city": {}}, "required": ["city"]})),
        ("bash".to_owned(), serde_json::json!({"properties": {"command": {}, "timeout": {}}, "required": ["command"]})),
    ];
    split::checked_events(&tools, seed, text);
});
