//! `splash claude`: Claude Code on the Anthropic Messages endpoint.
//!
//! Claude Code lets `env` in the user's `~/.claude/settings.json` override the process environment, so every value is
//! set twice: in the environment and in a `--settings` file of ours (settings given on the command line win over user
//! settings and are merged with them; no user file is touched). The file lives under `$SPLASH_HOME/agents/claude/`
//! with mode 0600 because it carries the token. Also: every model tier mapped to the served model, the real context
//! limit (else Claude assumes 1M tokens), the attribution header off (it changes the system prompt per request and
//! defeats prefix caching), non-essential traffic and the auto-updater off, and `--permission-mode manual` unless the
//! user chose a mode (the default auto mode needs Anthropic's server-side classifier).
//!
//! Below a 100K context, the output cap as well: Claude Code compacts at the context minus min(output cap, 20,000)
//! minus 13,000 tokens, and with its default cap (32,000) that is below zero on a 32K server, so it compacted the
//! conversation after the first tool call (a long extra request). A cap of an eighth of the context (4,096 on 32K)
//! moves that point to 15.6K tokens, past its ~11.5K-token first prompt. A cap the user set is kept.
//!
//! Also below 100K, auto-memory off (`CLAUDE_CODE_DISABLE_AUTO_MEMORY=1`, in the environment only, so a user's own
//! settings `env` or variable still decides): its system-prompt section (~2.1K characters, plus the `MEMORY.md` index
//! it loads every session) tells the model to save facts as markdown files and shows the file's template, and the
//! Qwen2.5-Coder 0.5B answered requests to act (create a file) by printing that template as its reply instead of
//! calling a tool, in every captured run; on a small context the section is also budget the task needs.
//!
//! And below 100K, the sub-agent and scheduling tools off (`--disallowedTools Agent,Workflow,ListAgents,
//! ReportFindings,ScheduleWakeup`, unless the user passed `--tools` or `--disallowedTools` themselves): their schemas
//! and the agent-type list are ~23K characters, about 5K tokens of every request on a 32K server, for sub-agents that
//! would queue on the same local server with prompts of their own; with them on, the 0.5B (auto-memory off) answered
//! "create a file" with an `Agent` call whose fields were copied from the tool's description.
//!
//! And one note appended to Claude Code's system prompt ([`APPEND_SYSTEM_PROMPT`], via `--append-system-prompt-file`,
//! a file of ours next to the settings): new files are created with `Write`, `Edit` only changes a file that exists.
//! The Qwen2.5-Coder 0.5B answered "create a file" with `Edit` on the missing file (old text "hi", new text "hello")
//! and repeated it after every "File does not exist" result until the client gave up; with the note its first call
//! was no longer `Edit` (replays of a captured request: 0 of 4 `Edit` against 2 of 3 without). Claude Code 2.1.332
//! joins the file's text with a user's own `--append-system-prompt` text (ours first) and also appends it after a
//! user's `--system-prompt`; a user's own `--append-system-prompt-file` replaces ours (Claude Code keeps only the last
//! file), so then we pass none.

use serde_json::{Map, Value};

use super::server::Target;
use super::{FileWrite, Launch, UserEnv, has_flag, token};

/// The variables we set, in order (all also go into `--settings`).
pub fn env_vars(target: &Target, user: &UserEnv) -> Vec<(&'static str, String)> {
    let m = target.model.clone();
    let ctx = target.context_tokens.to_string();
    let mut vars = vec![
        ("ANTHROPIC_BASE_URL", target.base_url.clone()),
        ("ANTHROPIC_AUTH_TOKEN", token(target).to_owned()),
        // A set ANTHROPIC_API_KEY would be sent as x-api-key and win over the token.
        ("ANTHROPIC_API_KEY", String::new()),
        ("ANTHROPIC_MODEL", m.clone()),
        ("ANTHROPIC_DEFAULT_OPUS_MODEL", m.clone()),
        ("ANTHROPIC_DEFAULT_SONNET_MODEL", m.clone()),
        ("ANTHROPIC_DEFAULT_HAIKU_MODEL", m.clone()),
        ("ANTHROPIC_SMALL_FAST_MODEL", m.clone()),
        ("CLAUDE_CODE_SUBAGENT_MODEL", m),
        ("CLAUDE_CODE_MAX_CONTEXT_TOKENS", ctx.clone()),
        ("CLAUDE_CODE_ATTRIBUTION_HEADER", "0".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
        ("DISABLE_AUTOUPDATER", "1".into()),
        ("CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL", "1".into()),
        ("CLAUDE_CODE_USE_BEDROCK", "0".into()),
        ("CLAUDE_CODE_USE_VERTEX", "0".into()),
        ("CLAUDE_CODE_USE_FOUNDRY", "0".into()),
    ];
    // Claude Code rejects an auto-compact window under 100K ("treats it as the 100k minimum"); below that the context
    // limit alone drives compaction.
    if target.context_tokens >= MIN_AUTO_COMPACT_WINDOW {
        vars.push(("CLAUDE_CODE_AUTO_COMPACT_WINDOW", ctx));
    } else if !user.vars.contains_key("CLAUDE_CODE_MAX_OUTPUT_TOKENS") {
        vars.push(("CLAUDE_CODE_MAX_OUTPUT_TOKENS", (target.context_tokens / 8).max(1).to_string()));
    }
    vars
}

/// Variables set in the environment only (not in `--settings`), so the `env` of the user's own settings file, which
/// Claude Code applies over the process environment, can still turn them back.
pub fn soft_env_vars(target: &Target, user: &UserEnv) -> Vec<(&'static str, String)> {
    let mut vars = Vec::new();
    if target.context_tokens < MIN_AUTO_COMPACT_WINDOW && !user.vars.contains_key("CLAUDE_CODE_DISABLE_AUTO_MEMORY") {
        vars.push(("CLAUDE_CODE_DISABLE_AUTO_MEMORY", "1".to_owned()));
    }
    vars
}

/// Claude Code's sub-agent and scheduling tools (2.1.332), left out below a 100K context.
pub const SMALL_CONTEXT_DISALLOWED_TOOLS: [&str; 5] =
    ["Agent", "Workflow", "ListAgents", "ReportFindings", "ScheduleWakeup"];

/// What `splash claude` appends to Claude Code's system prompt (see the module docs).
pub const APPEND_SYSTEM_PROMPT: &str =
    "To create a new file, use the Write tool. The Edit tool only changes a file that already exists (Read it first).";

/// The smallest `CLAUDE_CODE_AUTO_COMPACT_WINDOW` Claude Code 2.1 accepts.
pub const MIN_AUTO_COMPACT_WINDOW: usize = 100_000;

pub fn build(target: &Target, user: &UserEnv, user_args: &[String]) -> Launch {
    let mut launch = Launch::new("claude");
    let vars = env_vars(target, user);
    let mut env = Map::new();
    for (k, v) in &vars {
        launch.set(k, v.clone());
        env.insert((*k).to_owned(), Value::String(v.clone()));
    }
    for (k, v) in soft_env_vars(target, user) {
        launch.set(k, v);
    }
    let settings = serde_json::json!({ "env": env });
    let path = user.splash_home.join("agents").join("claude").join(format!("settings-{}.json", target.port));
    launch.files.push(FileWrite { path: path.clone(), contents: format!("{settings:#}\n") });
    if !has_flag(user_args, &["--model"]) {
        launch.args.extend(["--model".into(), target.model.clone()]);
    }
    if !has_flag(user_args, &["--permission-mode", "--dangerously-skip-permissions"]) {
        launch.args.extend(["--permission-mode".into(), "manual".into()]);
    }
    if target.context_tokens < MIN_AUTO_COMPACT_WINDOW
        && !has_flag(user_args, &["--tools", "--disallowedTools", "--disallowed-tools"])
    {
        launch.args.extend(["--disallowedTools".into(), SMALL_CONTEXT_DISALLOWED_TOOLS.join(",")]);
    }
    launch.args.extend(["--settings".into(), path.to_string_lossy().into_owned()]);
    if !has_flag(user_args, &["--append-system-prompt-file"]) {
        let path = user.splash_home.join("agents").join("claude").join("append-system-prompt.md");
        launch.files.push(FileWrite { path: path.clone(), contents: format!("{APPEND_SYSTEM_PROMPT}\n") });
        launch.args.extend(["--append-system-prompt-file".into(), path.to_string_lossy().into_owned()]);
    }
    launch.args.extend(user_args.iter().cloned());
    launch
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, target, user};
    use super::*;

    #[test]
    fn exact_environment_arguments_and_settings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let u = user(dir.path());
        let l = build(&target(Some("k3y")), &u, &[]);
        let settings_path = dir.path().join("splash/agents/claude/settings-8000.json");
        let append_path = dir.path().join("splash/agents/claude/append-system-prompt.md");
        assert_eq!(l.program, "claude");
        assert_eq!(
            l.args,
            args(&[
                "--model",
                "qwen2.5-coder-0.5b",
                "--permission-mode",
                "manual",
                "--disallowedTools",
                "Agent,Workflow,ListAgents,ReportFindings,ScheduleWakeup",
                "--settings",
                settings_path.to_str().expect("utf8"),
                "--append-system-prompt-file",
                append_path.to_str().expect("utf8"),
            ])
        );
        let expect = [
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:8000"),
            ("ANTHROPIC_AUTH_TOKEN", "k3y"),
            ("ANTHROPIC_API_KEY", ""),
            ("ANTHROPIC_MODEL", "qwen2.5-coder-0.5b"),
            ("ANTHROPIC_DEFAULT_OPUS_MODEL", "qwen2.5-coder-0.5b"),
            ("ANTHROPIC_DEFAULT_SONNET_MODEL", "qwen2.5-coder-0.5b"),
            ("ANTHROPIC_DEFAULT_HAIKU_MODEL", "qwen2.5-coder-0.5b"),
            ("CLAUDE_CODE_SUBAGENT_MODEL", "qwen2.5-coder-0.5b"),
            ("CLAUDE_CODE_MAX_CONTEXT_TOKENS", "32768"),
            ("CLAUDE_CODE_ATTRIBUTION_HEADER", "0"),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_AUTOUPDATER", "1"),
        ];
        for (k, v) in expect {
            assert_eq!(l.env_value(k), Some(v), "{k}");
        }
        // The same values in --settings, which beats `env` in the user's ~/.claude/settings.json.
        assert_eq!(l.files.len(), 2);
        assert_eq!(l.files[0].path, settings_path);
        assert_eq!(l.files[1].path, append_path);
        assert_eq!(
            l.files[1].contents,
            "To create a new file, use the Write tool. The Edit tool only changes a file that already exists (Read it \
             first).\n"
        );
        let s: Value = serde_json::from_str(&l.files[0].contents).expect("json");
        for (k, v) in expect {
            assert_eq!(s["env"][k], v, "{k} in --settings");
        }
        assert_eq!(l.env_value("CLAUDE_CODE_AUTO_COMPACT_WINDOW"), None, "32768 is under Claude's 100K minimum");
        assert!(s["env"].get("CLAUDE_CODE_AUTO_COMPACT_WINDOW").is_none());
        // Claude Code's compaction point, 32768 - min(cap, 20000) - 13000 = 15,672, clears its ~11.6K-token first
        // prompt.
        assert_eq!(l.env_value("CLAUDE_CODE_MAX_OUTPUT_TOKENS"), Some("4096"));
        assert_eq!(s["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"], "4096");
        let mut own = user(dir.path());
        own.vars.insert("CLAUDE_CODE_MAX_OUTPUT_TOKENS".into(), "1000".into());
        assert_eq!(build(&target(None), &own, &[]).env_value("CLAUDE_CODE_MAX_OUTPUT_TOKENS"), None, "user's cap kept");
        let mut big = target(None);
        big.context_tokens = 131072;
        let l = build(&big, &u, &[]);
        assert_eq!(l.env_value("CLAUDE_CODE_AUTO_COMPACT_WINDOW"), Some("131072"));
        assert_eq!(l.env_value("CLAUDE_CODE_MAX_CONTEXT_TOKENS"), Some("131072"));
        assert_eq!(l.env_value("CLAUDE_CODE_MAX_OUTPUT_TOKENS"), None);
    }

    #[test]
    fn auto_memory_off_below_100k_in_the_environment_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let u = user(dir.path());
        let l = build(&target(None), &u, &[]);
        assert_eq!(l.env_value("CLAUDE_CODE_DISABLE_AUTO_MEMORY"), Some("1"));
        // Not in --settings: the user's own settings `env` (applied over the process environment) can turn it back.
        let s: Value = serde_json::from_str(&l.files[0].contents).expect("json");
        assert!(s["env"].get("CLAUDE_CODE_DISABLE_AUTO_MEMORY").is_none());
        // A value the user exported is theirs (the launcher leaves the variable alone, so the child inherits it).
        let mut own = user(dir.path());
        own.vars.insert("CLAUDE_CODE_DISABLE_AUTO_MEMORY".into(), "0".into());
        assert_eq!(build(&target(None), &own, &[]).env_value("CLAUDE_CODE_DISABLE_AUTO_MEMORY"), None);
        let mut big = target(None);
        big.context_tokens = 131072;
        assert_eq!(build(&big, &u, &[]).env_value("CLAUDE_CODE_DISABLE_AUTO_MEMORY"), None);
    }

    #[test]
    fn sub_agent_tools_off_below_100k_unless_the_user_chose_tools() {
        let dir = tempfile::tempdir().expect("tempdir");
        let u = user(dir.path());
        let disallowed = |l: &Launch| {
            let i = l.args.iter().position(|a| a == "--disallowedTools")?;
            l.args.get(i + 1).cloned()
        };
        let l = build(&target(None), &u, &args(&["-p", "hi", "--allowedTools", "Bash"]));
        assert_eq!(disallowed(&l).as_deref(), Some("Agent,Workflow,ListAgents,ReportFindings,ScheduleWakeup"));
        for own in [&["--tools", "default"][..], &["--disallowedTools", "WebFetch"], &["--disallowed-tools=Bash"]] {
            let l = build(&target(None), &u, &args(own));
            assert_eq!(l.args.iter().filter(|a| a.contains("isallowed") || *a == "--tools").count(), 1, "{own:?}");
            assert!(l.args.ends_with(&args(own)), "user's choice passed through: {:?}", l.args);
        }
        let mut big = target(None);
        big.context_tokens = 131072;
        assert_eq!(disallowed(&build(&big, &u, &[])), None);
    }

    #[test]
    fn user_choices_after_dashes_win() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user_args = args(&["--model=other", "--permission-mode", "plan", "-p", "hello"]);
        let l = build(&target(None), &user(dir.path()), &user_args);
        assert!(!l.args.iter().any(|a| a == "manual"), "user picked a permission mode: {:?}", l.args);
        assert!(!l.args.iter().any(|a| a == "qwen2.5-coder-0.5b"), "user picked a model: {:?}", l.args);
        assert!(l.args.ends_with(&user_args), "user args passed through after ours, in order: {:?}", l.args);
        assert_eq!(l.env_value("ANTHROPIC_AUTH_TOKEN"), Some("splash-local"), "placeholder token when open");
        let l = build(&target(None), &user(dir.path()), &args(&["--dangerously-skip-permissions"]));
        assert!(!l.args.iter().any(|a| a == "--permission-mode"));
    }

    #[test]
    fn the_note_on_new_files_is_appended_unless_the_user_appends_a_file_of_their_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let u = user(dir.path());
        let ours = dir.path().join("splash/agents/claude/append-system-prompt.md");
        let appended = |l: &Launch| {
            l.args
                .iter()
                .enumerate()
                .filter(|(_, a)| *a == "--append-system-prompt-file")
                .map(|(i, _)| l.args[i + 1].clone())
                .collect::<Vec<_>>()
        };
        // A user's own text (--append-system-prompt) or system prompt: Claude Code 2.1.332 appends our file's text to
        // it (checked against a logging stub), so ours stays, before the user's arguments.
        for own in [&["--append-system-prompt", "Be terse."][..], &["--system-prompt=You are a pirate."]] {
            let l = build(&target(None), &u, &args(own));
            assert_eq!(appended(&l), [ours.to_string_lossy()], "{own:?}");
            assert!(l.args.ends_with(&args(own)));
            assert!(l.files.iter().any(|f| f.path == ours));
        }
        // A user's own file: Claude Code would keep only the last one, so we pass none and write none.
        for own in [&["--append-system-prompt-file", "/home/u/extra.md"][..], &["--append-system-prompt-file=x.md"]] {
            let l = build(&target(None), &u, &args(own));
            assert_eq!(l.args.iter().filter(|a| a.starts_with("--append-system-prompt-file")).count(), 1, "{own:?}");
            assert!(l.args.ends_with(&args(own)));
            assert!(!l.files.iter().any(|f| f.path == ours));
        }
        // After `--` the arguments are the prompt's, not flags.
        let l = build(&target(None), &u, &args(&["-p", "--", "--append-system-prompt-file"]));
        assert!(l.files.iter().any(|f| f.path == ours), "{:?}", l.args);
    }

    #[test]
    fn settings_file_is_per_port() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut t = target(None);
        t.port = 9001;
        t.base_url = "http://127.0.0.1:9001".into();
        let l = build(&t, &user(dir.path()), &[]);
        assert!(l.files[0].path.ends_with("agents/claude/settings-9001.json"));
        assert!(l.files[0].contents.contains("http://127.0.0.1:9001"));
    }
}
