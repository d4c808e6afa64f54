//! `splash opencode`: OpenCode on the Chat Completions endpoint.
//!
//! Configuration goes inline through `OPENCODE_CONFIG_CONTENT`, the source with the highest precedence, merged with
//! (not replacing) the user's global and project `opencode.json`: a `splash` provider (`@ai-sdk/openai-compatible`,
//! the key read from `SPLASH_API_KEY` by OpenCode's `{env:…}` substitution) whose model carries the real context and
//! an output limit, and `model`/`small_model` pointing at it. If the user already exports an
//! `OPENCODE_CONFIG_CONTENT`, ours is merged into theirs. Arguments after `--` pass through (`-m` there wins).

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::server::Target;
use super::{Launch, UserEnv, max_output_tokens, token};

pub fn config(target: &Target) -> Value {
    let m = &target.model;
    let output = max_output_tokens(target.context_tokens);
    json!({
        "provider": {
            "splash": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Splash (local)",
                "options": { "baseURL": format!("{}/v1", target.base_url), "apiKey": "{env:SPLASH_API_KEY}" },
                "models": {
                    m.as_str(): {
                        "name": m,
                        "tool_call": true,
                        "limit": { "context": target.context_tokens, "output": output },
                    }
                }
            }
        },
        "model": format!("splash/{m}"),
        "small_model": format!("splash/{m}"),
    })
}

/// Overlays `ours` onto `base`, object by object.
fn merge(base: &mut Value, ours: Value) {
    match (base, ours) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    // Our provider entry replaces any same-named one whole.
                    Some(slot) if k != "splash" => merge(slot, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

pub fn build(target: &Target, user: &UserEnv, user_args: &[String]) -> Result<Launch> {
    let mut launch = Launch::new("opencode");
    let mut content = match user.var("OPENCODE_CONFIG_CONTENT") {
        Some(existing) => {
            serde_json::from_str(existing).context("OPENCODE_CONFIG_CONTENT in your environment is not valid JSON")?
        }
        None => json!({}),
    };
    merge(&mut content, config(target));
    launch.set("OPENCODE_CONFIG_CONTENT", content.to_string());
    launch.set("SPLASH_API_KEY", token(target));
    launch.args.extend(user_args.iter().cloned());
    Ok(launch)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, target, user};
    use super::*;

    #[test]
    fn exact_inline_config() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = build(&target(Some("k3y")), &user(dir.path()), &[]).expect("builds");
        assert_eq!(l.program, "opencode");
        assert!(l.args.is_empty());
        assert_eq!(l.env_value("SPLASH_API_KEY"), Some("k3y"));
        let c: Value = serde_json::from_str(l.env_value("OPENCODE_CONFIG_CONTENT").expect("set")).expect("json");
        assert_eq!(
            c,
            json!({
                "provider": {"splash": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Splash (local)",
                    "options": {"baseURL": "http://127.0.0.1:8000/v1", "apiKey": "{env:SPLASH_API_KEY}"},
                    "models": {"qwen2.5-coder-0.5b": {
                        "name": "qwen2.5-coder-0.5b", "tool_call": true,
                        "limit": {"context": 32768, "output": 8192}}}}},
                "model": "splash/qwen2.5-coder-0.5b",
                "small_model": "splash/qwen2.5-coder-0.5b",
            })
        );
    }

    #[test]
    fn merges_into_the_users_inline_config_and_passes_args() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut u = user(dir.path());
        u.vars.insert(
            "OPENCODE_CONFIG_CONTENT".into(),
            json!({
                "theme": "dark",
                "model": "openai/gpt-5",
                "provider": {
                    "openai": {"options": {"apiKey": "x"}},
                    "splash": {"options": {"baseURL": "http://elsewhere:1/v1"}, "models": {"old": {}}}
                }
            })
            .to_string(),
        );
        let l = build(&target(None), &u, &args(&["run", "-m", "splash/qwen2.5-coder-0.5b", "hi"])).expect("builds");
        let c: Value = serde_json::from_str(l.env_value("OPENCODE_CONFIG_CONTENT").expect("set")).expect("json");
        assert_eq!(c["theme"], "dark", "user's other settings kept");
        assert_eq!(c["provider"]["openai"]["options"]["apiKey"], "x", "user's other providers kept");
        assert_eq!(c["provider"]["splash"]["options"]["baseURL"], "http://127.0.0.1:8000/v1");
        assert!(c["provider"]["splash"]["models"].get("old").is_none(), "a stale splash entry is replaced whole");
        assert_eq!(c["model"], "splash/qwen2.5-coder-0.5b");
        assert_eq!(l.args, args(&["run", "-m", "splash/qwen2.5-coder-0.5b", "hi"]));
        u.vars.insert("OPENCODE_CONFIG_CONTENT".into(), "{not json".into());
        assert!(build(&target(None), &u, &[]).is_err());
    }
}
