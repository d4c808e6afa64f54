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
//! answered "create a file" with `create_goal`/`wait_agent` calls and never reached the shell tool. Also off:
//! `view_image` (the catalogue entry below says text input only, yet Codex 0.171 still sends the tool) and the skills
//! listing (`skills.include_instructions`: ~5K characters naming OpenAI's bundled skills, imagegen and openai-docs, in
//! a second developer message); `-c skills.include_instructions=true` brings a user's skills back.
//!
//! A model catalogue entry for the served model (`-c model_catalog_json=<file>`, the file under
//! `$SPLASH_HOME/codex/`): for a model it does not know, Codex falls back to metadata that gives the model no tool
//! that edits files, and its only file-writing tool, `apply_patch`, is freeform (a Responses `custom` tool) in every
//! catalogue entry. The entry is copied from the installed Codex's own bundled catalogue (`codex debug models
//! --bundled`), so its fields match that Codex version: the classic-tools entry (no `tool_mode`) with the best
//! priority, with the served model's slug and context, no reasoning levels, text input only, no hosted search, no
//! verbosity parameter, and the skills/plugins/apps usage notes off as in Codex's own fallback. Its instructions
//! (`base_instructions`, which replace Codex's prompt) are [`INSTRUCTIONS`], a short prompt for a small local model,
//! not the copied entry's ~21K-character prompt written for OpenAI's GPT-5 models (which also forbids writing files
//! with shell commands). Measured with `codex exec` on "Create a file named hello.txt containing the word hi" (the
//! server samples at temperature 0.7, so tries differ), the Qwen2.5-Coder 1.5B wrote the file in: 0 of 5 tries with
//! the GPT-5 prompt (it called `write_stdin` before any `exec_command`, or printed the tool list as text), 0 of 2 with
//! Codex's own fallback prompt, 2 of 6 with a short prompt that pointed at `apply_patch` (otherwise it copied
//! `apply_patch`'s Lark grammar as the patch), and 3 of 4 with [`INSTRUCTIONS`] (`printf 'hi\n' > hello.txt`). The
//! 0.5B wrote it in none (0 of 4 with these). Codex 0.171 has no simpler shell tool to offer: every catalogue
//! `shell_type` (`default`, `local`, `shell_command`, `unified_exec`) and `features.unified_exec=false` still give
//! `exec_command` + `write_stdin`, and `apply_patch_tool_type` accepts only `freeform`. A user's
//! `-c model_instructions_file=...` replaces our instructions (Codex reads it over the catalogue's), and a user's own
//! `-c model_catalog_json=...` replaces the whole catalogue. When the catalogue cannot be read the launch goes on
//! without one (and says so).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::server::Target;
use super::{FileWrite, Launch, UserEnv, token};

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
        // Text-only models (our catalogue says so; Codex 0.171 sends the tool anyway).
        "features.view_image=false".into(),
        "skills.include_instructions=false".into(),
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

/// The installed Codex's bundled model catalogue (`{"models": [...]}`), `None` when `codex debug models --bundled`
/// fails or prints something else (a Codex without the command).
pub fn read_bundled_catalog(program: &Path) -> Option<Value> {
    let out = Command::new(program)
        .args(["debug", "models", "--bundled"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let catalog: Value = serde_json::from_slice(&out.stdout).ok().filter(|_| out.status.success())?;
    catalog.get("models").is_some_and(Value::is_array).then_some(catalog)
}

/// Bundled-entry fields about OpenAI's own serving modes that do not apply to a local model.
const DROPPED_FIELDS: [&str; 5] =
    ["tool_mode", "multi_agent_version", "multi_agent_reasoning_effort", "default_service_tier", "model_specialty"];

/// The instructions our catalogue entry gives the model (Codex's `base_instructions`): what Codex 0.171's tools do,
/// in a few lines a small local model follows, steering file creation to a shell command (which the Qwen2.5-Coder
/// models write well) rather than `apply_patch`'s patch format (which they garble); see the module docs.
pub const INSTRUCTIONS: &str = concat!(
    "You are Codex, a coding agent running in the user's terminal, working in the current directory. Do what the user ",
    "asks with your tools, then reply briefly.\n",
    r#"- Run shell commands with exec_command: {"cmd": "<command>"}. Its output comes back to you."#,
    "\n",
    r#"- To create a file, run a shell command with exec_command, for example {"cmd": "printf 'first line\\n' > notes.txt"}. "#,
    "Edit files with apply_patch or with a shell command.\n",
    "- write_stdin only sends input to a process that exec_command left running (it returned a session_id); never call ",
    "it first.\n",
);

/// Our catalogue (`{"models": [entry]}`) for the served model, built from the bundled catalogue `bundled`; `None` when
/// it has no entry with instructions to copy from (an entry without them is not a real model's).
pub fn catalog(bundled: &Value, target: &Target) -> Option<Value> {
    let models = bundled.get("models")?.as_array()?;
    let has_instructions =
        |m: &&Value| m.get("base_instructions").and_then(Value::as_str).is_some_and(|s| !s.trim().is_empty());
    let priority = |m: &&Value| m.get("priority").and_then(Value::as_i64).unwrap_or(i64::MAX);
    let classic_tools = |m: &&Value| m.get("tool_mode").is_none_or(Value::is_null);
    let template = models
        .iter()
        .filter(has_instructions)
        .filter(classic_tools)
        .min_by_key(priority)
        .or_else(|| models.iter().filter(has_instructions).min_by_key(priority))?;
    let mut entry = template.as_object()?.clone();
    for key in DROPPED_FIELDS {
        entry.remove(key);
    }
    let context_tokens = target.context_tokens;
    let ours = json!({
        "slug": target.model,
        "display_name": target.model,
        "description": "Served by Splash",
        "context_window": context_tokens,
        "max_context_window": context_tokens,
        "auto_compact_token_limit": context_tokens * 9 / 10,
        // The entry's instructions are `base_instructions`, not a persona template.
        "model_messages": null,
        "upgrade": null,
        "availability_nux": null,
        "visibility": "list",
        "priority": 0,
        "supported_reasoning_levels": [],
        "default_reasoning_level": null,
        "input_modalities": ["text"],
        "supports_search_tool": false,
        "additional_speed_tiers": [],
        "service_tiers": [],
        "support_verbosity": false,
        "default_verbosity": null,
        "use_responses_lite": false,
        "include_skills_usage_instructions": false,
        "include_plugin_usage_instructions": false,
        "include_apps_usage_instructions": false,
        "apply_patch_tool_type": "freeform",
        "base_instructions": INSTRUCTIONS,
    });
    for (key, value) in ours.as_object()? {
        entry.insert(key.clone(), value.clone());
    }
    Some(json!({"models": [entry]}))
}

/// Where our catalogue for `target` is written (one file per port and model, so launches side by side do not clash).
pub fn catalog_path(user: &UserEnv, target: &Target) -> PathBuf {
    let model: String =
        target.model.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
    user.splash_home.join("codex").join(format!("model-catalog-{}-{model}.json", target.port))
}

pub fn build(target: &Target, user: &UserEnv, user_args: &[String]) -> Launch {
    let mut launch = Launch::new("codex");
    launch.set("SPLASH_API_KEY", token(target));
    let (user_overrides, rest) = split_user_overrides(user_args);
    let mut ours = overrides(target);
    let users_catalog = user_overrides.iter().any(|o| o.trim_start().starts_with("model_catalog_json"));
    if !users_catalog {
        match user.codex_catalog.as_ref().and_then(|bundled| catalog(bundled, target)) {
            Some(catalog) => {
                let path = catalog_path(user, target);
                ours.push(format!("model_catalog_json={}", toml_str(&path.to_string_lossy())));
                let contents = serde_json::to_string_pretty(&catalog).expect("INVARIANT: JSON values serialize");
                launch.files.push(FileWrite { path, contents });
            }
            None => launch.notes.push(format!(
                "could not read Codex's bundled model catalogue (`codex debug models --bundled`): Codex will use its \
                 fallback metadata for `{}`, which gives the model no apply_patch tool to edit files and instructions written for OpenAI's models",
                target.model
            )),
        }
    }
    for o in ours.into_iter().chain(user_overrides) {
        launch.args.extend(["-c".into(), o]);
    }
    launch.args.extend(rest);
    launch
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, target, user};
    use super::*;

    #[test]
    fn exact_arguments_and_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = build(&target(Some("k3y")), &user(dir.path()), &[]);
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
                "-c",
                "features.view_image=false",
                "-c",
                "skills.include_instructions=false",
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
        let dir = tempfile::tempdir().expect("tempdir");
        let l = build(&target(None), &user(dir.path()), &user_args);
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
        let dir = tempfile::tempdir().expect("tempdir");
        let l = build(&target(None), &user(dir.path()), &args(&["-c", "features.goals=true", "exec", "hi"]));
        let ours = l.args.iter().position(|a| a == "features.goals=false").expect("ours");
        let theirs = l.args.iter().position(|a| a == "features.goals=true").expect("theirs");
        assert!(ours < theirs, "the later -c wins inside Codex: {:?}", l.args);
        assert!(l.args.iter().any(|a| a == "features.multi_agent=false"));
    }

    /// A bundled catalogue shaped as `codex debug models --bundled` prints it (Codex 0.171.0, entries trimmed).
    fn bundled() -> Value {
        json!({"models": [
            {"slug": "gpt-6.2-sol", "priority": 1, "tool_mode": "code_mode_only", "shell_type": "unified_exec",
             "apply_patch_tool_type": "freeform", "base_instructions": "You are Codex, an agent based on GPT-6.",
             "multi_agent_version": "v2"},
            {"slug": "no-prompt", "priority": 0, "base_instructions": ""},
            {"slug": "gpt-5.5", "display_name": "GPT-5.5", "description": "Legacy coding model.",
             "default_reasoning_level": "medium",
             "supported_reasoning_levels": [{"effort": "low", "description": "Fast"}],
             "shell_type": "unified_exec", "visibility": "list", "supported_in_api": true, "priority": 13,
             "additional_speed_tiers": ["fast"], "service_tiers": [{"id": "priority", "name": "Fast"}],
             "availability_nux": null, "upgrade": {"model": "gpt-6-sol", "migration_markdown": "Meet GPT-6 Sol"},
             "model_messages": {"instructions_template": "You are Codex, a coding agent based on GPT-5."},
             "include_skills_usage_instructions": true, "include_plugin_usage_instructions": true,
             "include_apps_usage_instructions": true, "default_reasoning_summary": "none",
             "support_verbosity": true, "default_verbosity": "low", "apply_patch_tool_type": "freeform",
             "web_search_tool_type": "text_and_image", "truncation_policy": {"mode": "tokens", "limit": 10000},
             "context_window": 272000, "max_context_window": 272000, "effective_context_window_percent": 95,
             "experimental_supported_tools": [], "input_modalities": ["text", "image"], "supports_search_tool": true,
             "use_responses_lite": false, "base_instructions": "You are Codex, a coding agent based on GPT-5."}
        ]})
    }

    #[test]
    fn catalogue_entry_copies_codexs_classic_entry_for_the_served_model() {
        let t = target(None);
        let entry = catalog(&bundled(), &t).expect("catalogue")["models"][0].clone();
        assert_eq!(
            entry,
            json!({
                "slug": "qwen2.5-coder-0.5b", "display_name": "qwen2.5-coder-0.5b", "description": "Served by Splash",
                "default_reasoning_level": null, "supported_reasoning_levels": [],
                "shell_type": "unified_exec", "visibility": "list", "supported_in_api": true, "priority": 0,
                "additional_speed_tiers": [], "service_tiers": [], "availability_nux": null, "upgrade": null,
                "model_messages": null,
                "include_skills_usage_instructions": false, "include_plugin_usage_instructions": false,
                "include_apps_usage_instructions": false, "default_reasoning_summary": "none",
                "support_verbosity": false, "default_verbosity": null, "apply_patch_tool_type": "freeform",
                "web_search_tool_type": "text_and_image", "truncation_policy": {"mode": "tokens", "limit": 10000},
                "context_window": 32768, "max_context_window": 32768, "auto_compact_token_limit": 29491,
                "effective_context_window_percent": 95, "experimental_supported_tools": [],
                "input_modalities": ["text"], "supports_search_tool": false, "use_responses_lite": false,
                "base_instructions": INSTRUCTIONS
            })
        );
        // Only code-mode entries: the best one, without its serving mode.
        let only_code_mode = json!({"models": [bundled()["models"][0].clone()]});
        let entry = catalog(&only_code_mode, &t).expect("catalogue")["models"][0].clone();
        assert_eq!(entry["slug"], "qwen2.5-coder-0.5b");
        assert_eq!(entry["shell_type"], "unified_exec");
        assert!(entry.get("tool_mode").is_none() && entry.get("multi_agent_version").is_none(), "{entry}");
        assert_eq!(catalog(&json!({"models": [{"slug": "x", "base_instructions": " "}]}), &t), None);
        assert_eq!(catalog(&json!({"error": "x"}), &t), None);
    }

    #[test]
    fn catalogue_is_written_and_passed_before_the_users_overrides() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut u = user(dir.path());
        u.codex_catalog = Some(bundled());
        let l = build(&target(None), &u, &args(&["-c", "x=1", "exec", "hi"]));
        let path = dir.path().join("splash/codex/model-catalog-8000-qwen2.5-coder-0.5b.json");
        assert_eq!(l.files.len(), 1);
        assert_eq!(l.files[0].path, path);
        let written: Value = serde_json::from_str(&l.files[0].contents).expect("JSON");
        assert_eq!(written, catalog(&bundled(), &target(None)).expect("catalogue"));
        let n = l.args.len();
        assert_eq!(
            l.args[n - 6..],
            args(&["-c", &format!("model_catalog_json=\"{}\"", path.display()), "-c", "x=1", "exec", "hi"])
        );
        assert!(l.notes.is_empty());
        // A model id that is not a file name.
        let mut t = target(None);
        t.model = "org/model:q4".into();
        assert_eq!(catalog_path(&u, &t), dir.path().join("splash/codex/model-catalog-8000-org_model_q4.json"));
    }

    #[test]
    fn the_users_own_catalogue_wins_and_a_missing_one_is_said() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut u = user(dir.path());
        u.codex_catalog = Some(bundled());
        let l = build(&target(None), &u, &args(&["-c", "model_catalog_json=\"/mine.json\"", "exec", "hi"]));
        assert!(l.files.is_empty());
        let catalogues: Vec<&String> = l.args.iter().filter(|a| a.starts_with("model_catalog_json")).collect();
        assert_eq!(catalogues, ["model_catalog_json=\"/mine.json\""]);
        assert!(l.notes.is_empty());
        let l = build(&target(None), &user(dir.path()), &[]);
        assert!(l.files.is_empty() && !l.args.iter().any(|a| a.starts_with("model_catalog_json")));
        assert_eq!(l.notes.len(), 1);
        assert!(l.notes[0].contains("codex debug models --bundled") && l.notes[0].contains("apply_patch"));
    }

    #[test]
    fn instructions_name_the_tools_codex_sends_and_their_example_is_a_valid_call() {
        // Codex 0.171.0 with our overrides sends exactly these tools (captured from a real `codex exec` request).
        for tool in ["exec_command", "write_stdin", "apply_patch"] {
            assert!(INSTRUCTIONS.contains(tool), "{tool}");
        }
        // The example call is exec_command's JSON arguments (`cmd`: a string) and decodes to a real shell command.
        let start = INSTRUCTIONS.find("for example {").expect("example") + "for example ".len();
        let mut example = serde_json::Deserializer::from_str(&INSTRUCTIONS[start..]).into_iter::<Value>();
        let example = example.next().expect("a JSON value").expect("valid JSON");
        assert_eq!(example, json!({"cmd": "printf 'first line\\n' > notes.txt"}));
        assert_eq!(example["cmd"].as_str().map(|c| c.contains("\\n")), Some(true));
        // Lines joined as meant: no doubled spaces, one instruction per line.
        assert!(!INSTRUCTIONS.contains("  ") && INSTRUCTIONS.ends_with("never call it first.\n"), "{INSTRUCTIONS}");
        assert_eq!(INSTRUCTIONS.lines().count(), 4, "{INSTRUCTIONS}");
    }

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_str(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
