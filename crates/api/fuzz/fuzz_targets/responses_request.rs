//! OpenAI Responses request parsing and checking never panics: any bytes give a turn or an `ApiError`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = api::error::parse_json::<api::responses::wire::CreateRequest>(data) {
        let _ = api::responses::convert::to_turn(&request, Vec::new(), &engine::SamplingParams::default());
    }
});
