//! `splash pi`: Pi (pi-coding-agent) on the Chat Completions endpoint.
//!
//! Pi reads custom providers only from `models.json` in its agent folder (`$PI_CODING_AGENT_DIR`, default
//! `~/.pi/agent`). We add or replace our provider entry there (`splash`, or `splash-<port>` off port 8000) and leave
//! every other provider and key as it was, writing the file atomically (temp file + rename); a file that is not valid
//! JSON is refused, never overwritten. The entry names the key by environment variable (`SPLASH_API_KEY`, which Pi
//! resolves at request time), so the key itself is never written. Then `pi --provider <ours> --model <id>` unless
//! the user chose either after `--`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use super::server::Target;
use super::{FileWrite, Launch, UserEnv, has_flag, max_output_tokens, token};

/// Our provider's name for a port.
pub fn provider_name(port: u16) -> String {
    if port == 8000 { "splash".into() } else { format!("splash-{port}") }
}

pub fn provider_entry(target: &Target) -> Value {
    json!({
        "baseUrl": format!("{}/v1", target.base_url),
        "api": "openai-completions",
        "apiKey": "SPLASH_API_KEY",
        "compat": { "supportsDeveloperRole": false, "supportsReasoningEffort": false },
        "models": [{
            "id": target.model,
            "name": format!("{} (Splash)", target.model),
            "reasoning": false,
            "input": ["text"],
            "contextWindow": target.context_tokens,
            "maxTokens": max_output_tokens(target.context_tokens),
            "cost": { "input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0 },
        }],
    })
}

/// `existing` (the current file, if any) with our provider entry added or replaced; everything else kept in order.
pub fn merge_models_json(existing: Option<&str>, name: &str, entry: Value) -> Result<String> {
    let mut root = match existing.filter(|t| !t.trim().is_empty()) {
        Some(text) => serde_json::from_str::<Value>(text).context("it is not valid JSON; fix or move it first")?,
        None => Value::Object(Map::new()),
    };
    let Value::Object(obj) = &mut root else { bail!("it is not a JSON object; fix or move it first") };
    let providers = obj.entry("providers").or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(providers) = providers else { bail!("its \"providers\" is not an object; fix it first") };
    providers.insert(name.to_owned(), entry);
    Ok(format!("{root:#}\n"))
}

pub fn models_path(user: &UserEnv) -> PathBuf {
    match user.var("PI_CODING_AGENT_DIR") {
        Some(d) => PathBuf::from(d).join("models.json"),
        None => user.home.join(".pi").join("agent").join("models.json"),
    }
}

pub fn build(target: &Target, user: &UserEnv, user_args: &[String]) -> Result<Launch> {
    let path = models_path(user);
    let existing = match std::fs::read_to_string(&path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let name = provider_name(target.port);
    let contents = merge_models_json(existing.as_deref(), &name, provider_entry(target))
        .with_context(|| format!("adding the '{name}' provider to {}", path.display()))?;
    let mut launch = Launch::new("pi");
    launch.notes.push(format!("provider '{name}' written to {} (other providers untouched)", path.display()));
    launch.files.push(FileWrite { path, contents });
    launch.set("SPLASH_API_KEY", token(target));
    if !has_flag(user_args, &["--provider"]) && !has_flag(user_args, &["--model"]) {
        launch.args.extend(["--provider".into(), name, "--model".into(), target.model.clone()]);
    }
    launch.args.extend(user_args.iter().cloned());
    Ok(launch)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, target, user};
    use super::*;

    #[test]
    fn fresh_file_and_exact_args() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = build(&target(Some("k3y")), &user(dir.path()), &[]).expect("builds");
        assert_eq!(l.program, "pi");
        assert_eq!(l.args, args(&["--provider", "splash", "--model", "qwen2.5-coder-0.5b"]));
        assert_eq!(l.env_value("SPLASH_API_KEY"), Some("k3y"));
        assert_eq!(l.files[0].path, dir.path().join("home/.pi/agent/models.json"));
        let v: Value = serde_json::from_str(&l.files[0].contents).expect("json");
        assert_eq!(
            v,
            json!({"providers": {"splash": {
                "baseUrl": "http://127.0.0.1:8000/v1", "api": "openai-completions", "apiKey": "SPLASH_API_KEY",
                "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
                "models": [{"id": "qwen2.5-coder-0.5b", "name": "qwen2.5-coder-0.5b (Splash)", "reasoning": false,
                            "input": ["text"], "contextWindow": 32768, "maxTokens": 8192,
                            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}}]}}})
        );
        assert!(!l.files[0].contents.contains("k3y"), "the key is named, never written");
    }

    #[test]
    fn only_our_entry_changes_in_an_existing_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent_dir = dir.path().join("pi-agent");
        std::fs::create_dir_all(&agent_dir).expect("mkdir");
        let before = json!({
            "providers": {
                "ollama": {"baseUrl": "http://localhost:11434/v1", "api": "openai-completions", "apiKey": "ollama",
                           "models": [{"id": "llama3.1:8b"}]},
                "splash": {"baseUrl": "http://stale:1/v1", "models": [{"id": "old"}]},
                "zeta": {"baseUrl": "http://z/v1", "models": []}
            },
            "somethingElse": [1, 2, 3]
        });
        std::fs::write(agent_dir.join("models.json"), before.to_string()).expect("write");
        let mut u = user(dir.path());
        u.vars.insert("PI_CODING_AGENT_DIR".into(), agent_dir.to_string_lossy().into_owned());
        let l = build(&target(None), &u, &args(&["-p", "hi"])).expect("builds");
        assert_eq!(l.files[0].path, agent_dir.join("models.json"));
        let after: Value = serde_json::from_str(&l.files[0].contents).expect("json");
        assert_eq!(after["providers"]["ollama"], before["providers"]["ollama"]);
        assert_eq!(after["providers"]["zeta"], before["providers"]["zeta"]);
        assert_eq!(after["somethingElse"], before["somethingElse"]);
        assert_eq!(after["providers"]["splash"], provider_entry(&target(None)));
        let order: Vec<&String> = after["providers"].as_object().expect("object").keys().collect();
        assert_eq!(order, ["ollama", "splash", "zeta"], "order kept");
        assert_eq!(l.args, args(&["--provider", "splash", "--model", "qwen2.5-coder-0.5b", "-p", "hi"]));
        // Applying it really replaces the file atomically.
        super::super::write_atomic(&l.files[0].path, &l.files[0].contents).expect("write");
        let on_disk: Value =
            serde_json::from_str(&std::fs::read_to_string(agent_dir.join("models.json")).expect("read")).expect("json");
        assert_eq!(on_disk, after);
    }

    #[test]
    fn broken_file_is_refused_not_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let u = user(dir.path());
        let path = models_path(&u);
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        std::fs::write(&path, "{ \"providers\": { // comment").expect("write");
        let e = format!("{:#}", build(&target(None), &u, &[]).expect_err("invalid"));
        assert!(e.contains("not valid JSON") && e.contains("models.json"), "{e}");
        assert!(merge_models_json(Some("[1]"), "splash", json!({})).is_err());
        assert!(merge_models_json(Some(r#"{"providers": 3}"#), "splash", json!({})).is_err());
    }

    #[test]
    fn other_ports_get_their_own_entry_and_user_model_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut t = target(None);
        t.port = 8123;
        t.base_url = "http://127.0.0.1:8123".into();
        let l = build(&t, &user(dir.path()), &args(&["--model", "splash-8123/other"])).expect("builds");
        assert!(l.files[0].contents.contains("\"splash-8123\""));
        assert_eq!(l.args, args(&["--model", "splash-8123/other"]));
    }
}
