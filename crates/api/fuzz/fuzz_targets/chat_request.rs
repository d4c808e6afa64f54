//! OpenAI Chat Completions request parsing and checking never panics: any bytes give a turn or an `ApiError`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = api::error::parse_json::<api::openai::wire::ChatRequest>(data) {
        let _ = api::openai::convert::to_turn(request, &engine::SamplingParams::default());
    }
});
