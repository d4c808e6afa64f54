//! `splash codex`: OpenAI Codex CLI on the Responses endpoint (the only wire API Codex still speaks).
//!
//! Everything goes through `-c key=value` overrides at the root of the command line, which beat `~/.codex/config.toml`
//! without touching it: a custom `splash` provider (`wire_api = "responses"`, the key read from `SPLASH_API_KEY`,
//! bounded retries, a long stream idle timeout for slow CPU prefill), the model, the real context window and an
//! auto-compact limit at 90 % of it, analytics off, and no unbounded reconnect loop. The user's own `-c` overrides are
//! moved to the root after ours (so theirs win); all other arguments pass through in order (`splash codex -- exec
//! "…"`, `splash codex -- resume --last`).
//!
//! Two tool groups are off (`features.multi_agent`, `features.goals`; a user's `-c features.…=true` turns them back):
//! the `multi_agent_v1` namespace (spawn/wait/close agents) is ~11K characters of schema, a tenth of a 32K context on
//! every request, for sub-agents that would queue on the same local server; and the goal tools (`create_goal`, ...)
//! fail in `codex exec` ("Goal tools require a persistent thread"). With them on, the Qwen2.5-Coder 1.5B and 0.5B
//! answered "create a file" with `create_goal`/`wait_agent` calls and never reached the shell tool.

use super::server::Target;
use super::{Launch, token};

/// A TOML basic string.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Our `-c` overrides (without the `-c`).
pub fn overrides(target: &Target) -> Vec<String> {
    let provider = format!(
        "model_providers.splash={{name={},base_url={},wire_api=\"responses\",env_key=\"SPLASH_API_KEY\",\
         request_max_retries=1,stream_max_retries=1,stream_idle_timeout_ms=600000}}",
        toml_str("Splash (local)"),
        toml_str(&format!("{}/v1", target.base_url)),
    );
    vec![
        "model_provider=\"splash\"".into(),
        provider,
        format!("model={}", toml_str(&target.model)),
        format!("model_context_window={}", target.context_tokens),
        format!("model_auto_compact_token_limit={}", target.context_tokens * 9 / 10),
        "web_search=\"disabled\"".into(),
        "analytics.enabled=false".into(),
        // Without this Codex retries a dead server forever ("Reconnecting... waiting for network").
        "features.unbounded_connection_retries=false".into(),
        "features.multi_agent=false".into(),
        "features.goals=false".into(),
    ]
}

/// Splits the user's arguments into their `-c` overrides and the rest.
fn split_user_overrides(user_args: &[String]) -> (Vec<String>, Vec<String>) {
    let mut overrides = Vec::new();
    let mut rest = Vec::new();
    let mut it = user_args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            rest.push(a.clone());
            rest.extend(it.by_ref().cloned());
            break;
        }
        if a == "-c" || a == "--config" {
            match it.next() {
                Some(v) => overrides.push(v.clone()),
                None => rest.push(a.clone()),
            }
        } else if let Some(v) = a.strip_prefix("--config=") {
            overrides.push(v.to_owned());
        } else if let Some(v) = a.strip_prefix("-c").filter(|v| !v.is_empty() && !a.starts_with("--")) {
            overrides.push(v.to_owned());
        } else {
            rest.push(a.clone());
        }
    }
    (overrides, rest)
}

pub fn build(target: &Target, user_args: &[String]) -> Launch {
    let mut launch = Launch::new("codex");
    launch.set("SPLASH_API_KEY", token(target));
    let (user_overrides, rest) = split_user_overrides(user_args);
    for o in overrides(target).into_iter().chain(user_overrides) {
        launch.args.extend(["-c".into(), o]);
    }
    launch.args.extend(rest);
    launch
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, target};
    use super::*;

    #[test]
    fn exact_arguments_and_environment() {
        let l = build(&target(Some("k3y")), &[]);
        assert_eq!(l.program, "codex");
        assert_eq!(l.env, vec![("SPLASH_API_KEY".to_string(), Some("k3y".to_string()))]);
        assert_eq!(
            l.args,
            args(&[
                "-c",
                "model_provider=\"splash\"",
                "-c",
                "model_providers.splash={name=\"Splash (local)\",base_url=\"http://127.0.0.1:8000/v1\",\
                 wire_api=\"responses\",env_key=\"SPLASH_API_KEY\",request_max_retries=1,stream_max_retries=1,\
                 stream_idle_timeout_ms=600000}",
                "-c",
                "model=\"qwen2.5-coder-0.5b\"",
                "-c",
                "model_context_window=32768",
                "-c",
                "model_auto_compact_token_limit=29491",
                "-c",
                "web_search=\"disabled\"",
                "-c",
                "analytics.enabled=false",
                "-c",
                "features.unbounded_connection_retries=false",
                "-c",
                "features.multi_agent=false",
                "-c",
                "features.goals=false",
            ])
        );
    }

    #[test]
    fn user_overrides_go_last_at_the_root_and_the_rest_passes_through() {
        let user_args = args(&[
            "exec",
            "-c",
            "model_context_window=8000",
            "--json",
            "--config=a.b=1",
            "-cx=2",
            "fix it",
            "--",
            "-c",
        ]);
        let l = build(&target(None), &user_args);
        let n = l.args.len();
        assert_eq!(
            &l.args[n - 11..],
            args(&["-c", "model_context_window=8000", "-c", "a.b=1", "-c", "x=2", "exec", "--json", "fix it", "--"])
                .iter()
                .chain(std::iter::once(&"-c".to_string()))
                .cloned()
                .collect::<Vec<_>>()
                .as_slice()
        );
        // Ours come first, so the user's later `-c model_context_window` wins inside Codex.
        let ours = l.args.iter().position(|a| a == "model_context_window=32768").expect("ours");
        let theirs = l.args.iter().position(|a| a == "model_context_window=8000").expect("theirs");
        assert!(ours < theirs);
        assert_eq!(l.env_value("SPLASH_API_KEY"), Some("splash-local"));
    }

    #[test]
    fn a_user_can_turn_the_tool_groups_we_turn_off_back_on() {
        let l = build(&target(None), &args(&["-c", "features.goals=true", "exec", "hi"]));
        let ours = l.args.iter().position(|a| a == "features.goals=false").expect("ours");
        let theirs = l.args.iter().position(|a| a == "features.goals=true").expect("theirs");
        assert!(ours < theirs, "the later -c wins inside Codex: {:?}", l.args);
        assert!(l.args.iter().any(|a| a == "features.multi_agent=false"));
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
