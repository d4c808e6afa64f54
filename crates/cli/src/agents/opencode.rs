//! `splash opencode`: OpenCode on the Chat Completions endpoint.
//!
//! Configuration goes inline through `OPENCODE_CONFIG_CONTENT`, the source with the highest precedence, merged with
//! (not replacing) the user's global and project `opencode.json`: a `splash` provider (`@ai-sdk/openai-compatible`,
//! the key read from `SPLASH_API_KEY` by OpenCode's `{env:…}` substitution) whose model carries the real context and
//! an output limit, and `model`/`small_model` pointing at it. If the user already exports an
//! `OPENCODE_CONFIG_CONTENT`, ours is merged into theirs. Arguments after `--` pass through (`-m` there wins).
//!
//! It also adds [`WORKDIR_NOTE`] to the model's instructions (a file under `$SPLASH_HOME/agents/opencode/`, named in
//! the config's `instructions`, which OpenCode concatenates across config sources, so a user's own instructions
//! stay). OpenCode's prompt names the project in its environment block ("Working directory"), but outside a git
//! repository it also gives "Workspace root folder: /", and its bash tool's description says "Use `/tmp/opencode`
//! for temporary work outside the workspace": asked to create hello.txt, the Qwen2.5-Coder 1.5B wrote
//! /tmp/opencode/hello.txt (stretch 11) and src/hello.txt (stretch 10), where the user would not find it.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::server::Target;
use super::{FileWrite, Launch, UserEnv, max_output_tokens, token};

/// Where the files the user asks for go (see the module docs).
pub const WORKDIR_NOTE: &str = "Files: the user's project is the \"Working directory\" shown in <env>. Create and edit \
the files the user asks for directly in that directory (for example <Working directory>/notes.txt), never in \
/tmp/opencode, which is only for scratch files the user never sees.";

/// The instructions file named in our config.
fn note_path(user: &UserEnv) -> PathBuf {
    user.splash_home.join("agents").join("opencode").join("instructions.md")
}

pub fn config(target: &Target, note: &Path) -> Value {
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
        "instructions": [note.to_string_lossy()],
    })
}

/// Overlays `ours` onto `base`, object by object; `instructions` lists are joined (theirs first, each entry once), as
/// OpenCode joins them across its config sources.
fn merge(base: &mut Value, ours: Value) {
    match (base, ours) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(Value::Array(theirs)) if k == "instructions" => {
                        for e in v.as_array().into_iter().flatten() {
                            if !theirs.contains(e) {
                                theirs.push(e.clone());
                            }
                        }
                    }
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
    let note = note_path(user);
    merge(&mut content, config(target, &note));
    launch.files.push(FileWrite { path: note, contents: format!("{WORKDIR_NOTE}\n") });
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
        let note = dir.path().join("splash").join("agents").join("opencode").join("instructions.md");
        assert_eq!(l.files, vec![FileWrite { path: note.clone(), contents: format!("{WORKDIR_NOTE}\n") }]);
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
                "instructions": [note.to_string_lossy()],
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
                "instructions": ["CONTRIBUTING.md"],
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
        let note = l.files[0].path.to_string_lossy().into_owned();
        assert_eq!(c["instructions"], json!(["CONTRIBUTING.md", note]), "the user's instructions kept, ours added");
        // Launching again from that config (ours already in it) adds ours once.
        u.vars.insert("OPENCODE_CONFIG_CONTENT".into(), c.to_string());
        let again = build(&target(None), &u, &[]).expect("builds");
        let c2: Value = serde_json::from_str(again.env_value("OPENCODE_CONFIG_CONTENT").expect("set")).expect("json");
        assert_eq!(c2["instructions"], json!(["CONTRIBUTING.md", note]));
        assert_eq!(l.args, args(&["run", "-m", "splash/qwen2.5-coder-0.5b", "hi"]));
        u.vars.insert("OPENCODE_CONFIG_CONTENT".into(), "{not json".into());
        assert!(build(&target(None), &u, &[]).is_err());
    }
}
