//! `splash hermes`: Nous Research's Hermes Agent on the Chat Completions endpoint.
//!
//! Hermes reads its endpoint key only from a config file, and a user's `model.api_mode` in `~/.hermes/config.yaml` can
//! leak into a custom endpoint, so it runs in a profile of ours: `HERMES_HOME=<hermes home>/profiles/splash`, whose
//! `config.yaml` we own and rewrite on each launch (custom provider, model, real context, output cap, key). The
//! environment repeats the endpoint (`CUSTOM_BASE_URL`, and `OPENAI_BASE_URL` for the interactive first-run guard) and
//! selects provider and model. Hermes refuses contexts under 64,000 tokens: we report the server's real context and,
//! when it is smaller, refuse plainly instead of inflating it, unless the user asks for `--allow-small-context`.
//!
//! The profile's `SOUL.md` (Hermes's identity, the first part of its system prompt) is Hermes's own default identity
//! plus [`WORKDIR_NOTE`] (a file holding an earlier version of it is updated). Hermes's prompt names "User home
//! directory" before "Current working directory", and the Qwen2.5-Coder 0.5B and 1.5B answered "create hello.txt"
//! with `write_file` on `<home>/hello.txt`, an absolute path they chose: Hermes resolves relative paths in the right
//! place (for its local terminal backend it sets `TERMINAL_CWD` to its own working directory), so there is no
//! directory to pass, only the model to point at it. A `SOUL.md` the user wrote into our profile is kept: we write it
//! only when it is missing, Hermes's seeded default, or ours.

use anyhow::{Result, bail};

use super::server::Target;
use super::{FileWrite, Launch, UserEnv, max_output_tokens};

/// The smallest context Hermes Agent accepts.
pub const MIN_CONTEXT_TOKENS: usize = 64_000;

/// Hermes Agent 0.19.0's default identity (`agent/prompt_builder.py`, `DEFAULT_AGENT_IDENTITY`), which it also seeds
/// into a new profile's `SOUL.md`.
pub const HERMES_DEFAULT_IDENTITY: &str = "You are Hermes Agent, an intelligent AI assistant created by Nous Research. \
You are helpful, knowledgeable, and direct. You assist users with a wide range of tasks including answering questions, \
writing and editing code, analyzing information, creative work, and executing actions via your tools. You communicate \
clearly, admit uncertainty when appropriate, and prioritize being genuinely useful over being verbose unless \
otherwise directed below. Be targeted and efficient in your exploration and investigations.";

/// What our `SOUL.md` adds to Hermes's identity. It names both of the prompt's directory lines and the file tools: with
/// the earlier, vaguer wording ([`EARLIER_WORKDIR_NOTES`]) the 1.5B wrote `hello.txt` into the home directory in 3 of
/// 3 tool round trips, with this one into the project in 2 of 2 (benchmarks/log/2026-11-30-stretch-10.md).
pub const WORKDIR_NOTE: &str = "Files: you work in the project at the \"Current working directory\" shown below, never \
in the \"User home directory\". Give write_file, read_file and patch paths relative to the working directory (for \
example notes.txt or src/main.py), without the home directory in front.";

/// Notes earlier versions of Splash wrote into the profile's `SOUL.md`: a file holding one of them is ours to update.
const EARLIER_WORKDIR_NOTES: [&str; 1] =
    ["Work in the current working directory named below: give the files you create \
or edit paths relative to it (for example notes.txt or src/main.py), not paths under the user's home directory."];

/// Our profile's `SOUL.md`.
pub fn soul() -> String {
    soul_with(WORKDIR_NOTE)
}

fn soul_with(note: &str) -> String {
    format!("{HERMES_DEFAULT_IDENTITY}\n\n{note}\n")
}

/// Whether a `SOUL.md` with `existing` contents (`None`: no file) may be replaced by ours.
fn soul_is_replaceable(existing: Option<&str>) -> bool {
    existing.is_none_or(|s| {
        let s = s.trim();
        s.is_empty()
            || s == HERMES_DEFAULT_IDENTITY
            || std::iter::once(WORKDIR_NOTE).chain(EARLIER_WORKDIR_NOTES).any(|n| s == soul_with(n).trim())
    })
}

/// A YAML double-quoted scalar (JSON strings are valid YAML).
fn yaml_str(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

pub fn build(target: &Target, user: &UserEnv, user_args: &[String], allow_small_context: bool) -> Result<Launch> {
    let ctx = target.context_tokens;
    let mut launch = Launch::new("hermes");
    let claimed = if ctx >= MIN_CONTEXT_TOKENS {
        ctx
    } else if allow_small_context {
        launch.notes.push(format!(
            "the server's context is {ctx} tokens, below the {MIN_CONTEXT_TOKENS} Hermes Agent requires; running \
             anyway (--allow-small-context): Hermes is told {MIN_CONTEXT_TOKENS}, so requests past {ctx} tokens will \
             be refused by the server before Hermes compacts"
        ));
        MIN_CONTEXT_TOKENS
    } else {
        bail!(
            "Hermes Agent requires a context of at least {MIN_CONTEXT_TOKENS} tokens, and the server's model {} has \
             {ctx} tokens, so Hermes would refuse it. Serve a model with a longer context (see `splash plan`), or run \
             anyway with `splash hermes --allow-small-context` (the server still refuses requests past {ctx} tokens).",
            target.model
        );
    };
    let hermes_home = match user.var("HERMES_HOME") {
        Some(h) => std::path::PathBuf::from(h),
        None => user.home.join(".hermes"),
    };
    let profile = hermes_home.join("profiles").join("splash");
    let base = format!("{}/v1", target.base_url);
    let mut config = format!(
        "# Written by `splash hermes` on each launch: Hermes Agent on the Splash server at {base}.\nmodel:\n  \
         provider: custom\n  default: {}\n  base_url: {}\n  api_mode: chat_completions\n  context_length: {claimed}\n  \
         max_tokens: {}\n",
        yaml_str(&target.model),
        yaml_str(&base),
        max_output_tokens(ctx),
    );
    if let Some(k) = &target.api_key {
        config.push_str(&format!("  api_key: {}\n", yaml_str(k)));
    }
    launch.files.push(FileWrite { path: profile.join("config.yaml"), contents: config });
    let soul_path = profile.join("SOUL.md");
    let existing = match std::fs::read_to_string(&soul_path) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(_) => Some(String::from("unreadable: keep it")),
    };
    if soul_is_replaceable(existing.as_deref()) {
        launch.files.push(FileWrite { path: soul_path, contents: soul() });
    }
    launch.set("HERMES_HOME", profile.to_string_lossy());
    launch.set("CUSTOM_BASE_URL", base.clone());
    launch.set("OPENAI_BASE_URL", base);
    launch.set("OPENAI_API_KEY", super::token(target));
    launch.set("HERMES_INFERENCE_PROVIDER", "custom");
    launch.set("HERMES_INFERENCE_MODEL", target.model.clone());
    launch.notes.push(format!("Hermes profile: {}", profile.display()));
    launch.args.extend(user_args.iter().cloned());
    Ok(launch)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{args, target, user};
    use super::*;

    #[test]
    fn small_context_is_refused_plainly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = build(&target(None), &user(dir.path()), &[], false).expect_err("32768 < 64000").to_string();
        assert!(e.contains("64000") && e.contains("32768") && e.contains("--allow-small-context"), "{e}");
    }

    #[test]
    fn small_context_when_allowed_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = build(&target(None), &user(dir.path()), &[], true).expect("allowed");
        assert!(l.files[0].contents.contains("context_length: 64000\n"));
        assert!(l.notes.iter().any(|n| n.contains("32768") && n.contains("refused by the server")), "{:?}", l.notes);
    }

    #[test]
    fn exact_profile_environment_and_args() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut t = target(Some("k3y"));
        t.context_tokens = 131072;
        let l = build(&t, &user(dir.path()), &args(&["-z", "hi", "--ignore-user-config"]), false).expect("builds");
        let profile = dir.path().join("home/.hermes/profiles/splash");
        assert_eq!(l.program, "hermes");
        assert_eq!(l.args, args(&["-z", "hi", "--ignore-user-config"]));
        assert_eq!(l.env_value("HERMES_HOME"), profile.to_str());
        assert_eq!(l.env_value("CUSTOM_BASE_URL"), Some("http://127.0.0.1:8000/v1"));
        assert_eq!(l.env_value("OPENAI_BASE_URL"), Some("http://127.0.0.1:8000/v1"));
        assert_eq!(l.env_value("HERMES_INFERENCE_PROVIDER"), Some("custom"));
        assert_eq!(l.env_value("HERMES_INFERENCE_MODEL"), Some("qwen2.5-coder-0.5b"));
        assert_eq!(l.files.len(), 2);
        assert_eq!(l.files[0].path, profile.join("config.yaml"));
        assert_eq!(l.files[1].path, profile.join("SOUL.md"));
        assert_eq!(l.files[1].contents, soul());
        let body: Vec<&str> = l.files[0].contents.lines().skip(1).collect();
        assert_eq!(
            body,
            [
                "model:",
                "  provider: custom",
                "  default: \"qwen2.5-coder-0.5b\"",
                "  base_url: \"http://127.0.0.1:8000/v1\"",
                "  api_mode: chat_completions",
                "  context_length: 131072",
                "  max_tokens: 32768",
                "  api_key: \"k3y\"",
            ]
        );
    }

    #[test]
    fn profile_lives_under_the_users_hermes_home() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut u = user(dir.path());
        u.vars.insert("HERMES_HOME".into(), "/opt/hermes".into());
        let mut t = target(None);
        t.context_tokens = 65536;
        let l = build(&t, &u, &[], false).expect("builds");
        assert_eq!(l.env_value("HERMES_HOME"), Some("/opt/hermes/profiles/splash"));
        assert!(!l.files[0].contents.contains("api_key"), "no key when the server is open");
    }

    #[test]
    fn soul_is_hermes_identity_plus_the_working_directory_note_and_a_users_own_is_kept() {
        // Hermes 0.19.0 seeds a new profile's SOUL.md with exactly its default identity (a file from a real run).
        let seeded = "You are Hermes Agent, an intelligent AI assistant created by Nous Research. You are helpful, \
                      knowledgeable, and direct. You assist users with a wide range of tasks including answering \
                      questions, writing and editing code, analyzing information, creative work, and executing \
                      actions via your tools. You communicate clearly, admit uncertainty when appropriate, and \
                      prioritize being genuinely useful over being verbose unless otherwise directed below. Be \
                      targeted and efficient in your exploration and investigations.";
        assert_eq!(HERMES_DEFAULT_IDENTITY, seeded);
        assert!(soul().starts_with(seeded) && soul().contains("relative to the working directory"));
        assert!(!soul().contains("  ") && EARLIER_WORKDIR_NOTES.iter().all(|n| !n.contains("  ")));
        let dir = tempfile::tempdir().expect("tempdir");
        let profile = dir.path().join("home/.hermes/profiles/splash");
        std::fs::create_dir_all(&profile).expect("mkdir");
        let mut t = target(None);
        t.context_tokens = 65536;
        for (existing, replaced) in
            [(seeded.to_string(), true), (soul(), true), ("\n".into(), true), ("Be a pirate.".into(), false)]
                .into_iter()
                .chain(EARLIER_WORKDIR_NOTES.map(|n| (soul_with(n), true)))
        {
            std::fs::write(profile.join("SOUL.md"), &existing).expect("write");
            let l = build(&t, &user(dir.path()), &[], false).expect("builds");
            let ours = l.files.iter().any(|f| f.path == profile.join("SOUL.md"));
            assert_eq!(ours, replaced, "{existing:?}");
        }
    }
}
