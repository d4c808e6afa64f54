//! `splash claude|codex|opencode|hermes|pi`: run a coding agent against the local Splash server.
//!
//! Each client module turns a [`server::Target`] (URL, model id, real context limit, API key) and the user's own
//! arguments (after `--`) into a [`Launch`]: the program, its arguments, environment changes and the files it needs.
//! The user's configuration is never overwritten: we use environment variables, per-invocation flags, inline config,
//! a profile directory of our own (Hermes), and, where a client can only read a file (Pi's `models.json`), an atomic
//! replacement of our own provider entry alone. This module owns the shared flow: client present → server found or
//! started ([`server`]) → launch built → files written → the agent exec'd. The API key reaches the agent through the
//! environment or a 0600 file and is never printed (`--dry-run` shows it as `***`).

pub mod claude;
pub mod codex;
pub mod hermes;
pub mod opencode;
pub mod pi;
pub mod server;

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use server::Target;

/// Options every launcher takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Port of the Splash server on 127.0.0.1.
    #[arg(long, env = "SPLASH_PORT", default_value_t = 8000)]
    pub port: u16,
    /// Model id to use (default: the first one the server lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Fail instead of starting `splash serve` in the background when no server answers.
    #[arg(long)]
    pub no_serve: bool,
    /// Pack name or .gguf for the server started when none answers (default: `splash serve`'s default).
    #[arg(long)]
    pub pack: Option<String>,
    /// The server's API key, given to the agent (never printed).
    #[arg(long, env = "SPLASH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Print the command, environment (key hidden) and files instead of running the agent.
    #[arg(long)]
    pub dry_run: bool,
    /// Arguments for the agent itself, after `--` (e.g. `splash codex -- exec "fix the tests"`).
    #[arg(last = true)]
    pub agent_args: Vec<String>,
}

/// `splash hermes` takes one more switch.
#[derive(clap::Args, Debug, Clone)]
pub struct HermesArgs {
    #[command(flatten)]
    pub common: Args,
    /// Run Hermes even though the server's context is below the 64,000 tokens Hermes requires: Hermes is told
    /// 64,000, so a long session gets refused by the server before Hermes compacts it.
    #[arg(long)]
    pub allow_small_context: bool,
}

/// The clients we launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Claude,
    Codex,
    OpenCode,
    Hermes,
    Pi,
}

impl Client {
    /// The executable looked up on PATH.
    pub fn program(self) -> &'static str {
        match self {
            Client::Claude => "claude",
            Client::Codex => "codex",
            Client::OpenCode => "opencode",
            Client::Hermes => "hermes",
            Client::Pi => "pi",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Client::Claude => "Claude Code",
            Client::Codex => "Codex CLI",
            Client::OpenCode => "OpenCode",
            Client::Hermes => "Hermes Agent",
            Client::Pi => "Pi",
        }
    }

    /// The command that installs it.
    pub fn install_hint(self) -> &'static str {
        match self {
            Client::Claude => "npm install -g @anthropic-ai/claude-code",
            Client::Codex => "npm install -g @openai/codex",
            Client::OpenCode => "npm install -g opencode-ai",
            Client::Hermes => "pipx install --python python3.11 hermes-agent",
            Client::Pi => "npm install -g @mariozechner/pi-coding-agent",
        }
    }
}

/// A file the launch needs, written atomically (temp file + rename) with mode 0600 before the agent starts.
#[derive(Debug, Clone, PartialEq)]
pub struct FileWrite {
    pub path: PathBuf,
    pub contents: String,
}

/// Everything needed to start one agent.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Launch {
    pub program: String,
    pub args: Vec<String>,
    /// Variables to set (`Some`) or remove (`None`), in order.
    pub env: Vec<(String, Option<String>)>,
    pub files: Vec<FileWrite>,
    /// Lines for the user (never containing the key).
    pub notes: Vec<String>,
}

impl Launch {
    pub fn new(program: &str) -> Self {
        Launch { program: program.to_owned(), ..Default::default() }
    }

    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.env.push((key.to_owned(), Some(value.into())));
    }

    /// The value the launch gives `key` (last one wins), for tests.
    #[cfg(test)]
    pub fn env_value(&self, key: &str) -> Option<&str> {
        self.env.iter().rev().find(|(k, _)| k == key).and_then(|(_, v)| v.as_deref())
    }
}

/// What the launchers read from the user's environment (a snapshot, so tests can build one).
#[derive(Debug, Clone, Default)]
pub struct UserEnv {
    /// The user's home directory.
    pub home: PathBuf,
    /// Splash's state root (`$SPLASH_HOME`, default `~/.cache/splash`).
    pub splash_home: PathBuf,
    pub vars: HashMap<String, String>,
    /// The installed Codex's bundled model catalogue (`codex debug models --bundled`), read for `splash codex` only.
    pub codex_catalog: Option<serde_json::Value>,
}

impl UserEnv {
    pub fn current() -> Self {
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from).or_else(std::env::home_dir);
        UserEnv {
            home: home.unwrap_or_else(|| PathBuf::from(".")),
            splash_home: pack::home(),
            vars: std::env::vars().collect(),
            codex_catalog: None,
        }
    }

    pub fn var(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str).filter(|v| !v.is_empty())
    }
}

/// The key the agent sends: the server's, or a placeholder that an open server ignores.
pub fn token(target: &Target) -> &str {
    target.api_key.as_deref().unwrap_or("splash-local")
}

/// The output cap we give agents: a quarter of the context, at most 32K.
pub fn max_output_tokens(context_tokens: usize) -> usize {
    (context_tokens / 4).clamp(1, 32_768)
}

/// Whether the user's arguments set any of these flags (`--flag`, `--flag=v`, `-f`).
pub fn has_flag(user_args: &[String], flags: &[&str]) -> bool {
    user_args.iter().take_while(|a| *a != "--").any(|a| {
        flags.iter().any(|f| a == f || (f.starts_with("--") && a.strip_prefix(f).is_some_and(|r| r.starts_with('='))))
    })
}

/// Looks `program` up on PATH.
pub fn find_program(program: &str, path_var: Option<&str>) -> Option<PathBuf> {
    let path_var = path_var?;
    std::env::split_paths(path_var).map(|d| d.join(program)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// The one-line refusal for a client that is not installed.
pub fn missing_client(client: Client) -> String {
    format!(
        "{} is not installed (no `{}` on PATH). Install it with: {}",
        client.name(),
        client.program(),
        client.install_hint()
    )
}

/// Writes `contents` to `path` atomically: a temp file in the same folder (mode 0600), then a rename.
pub fn write_atomic(path: &Path, contents: &str) -> Result<()> {
    let dir = path.parent().context("file has no parent folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = path.file_name().context("file has no name")?.to_string_lossy();
    let tmp = dir.join(format!(".{name}.splash-{}.tmp", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing {}", path.display()))
}

/// Finds (or starts) the server and returns what the agent should talk to.
fn find_server(a: &Args) -> Result<Target> {
    let key = a.api_key.clone().filter(|k| !k.is_empty());
    let served = match server::probe(a.port, key.as_deref())? {
        Some(s) => s,
        None if a.no_serve => bail!(
            "no Splash server answers on http://127.0.0.1:{} (--no-serve): start one with `splash serve --port {}`",
            a.port,
            a.port
        ),
        None => server::start_background(&server::StartOptions {
            port: a.port,
            pack: a.pack.clone(),
            api_key: key.clone(),
            max_wait: Duration::from_secs(30 * 60),
        })?,
    };
    let (ids, context_tokens) = served;
    let model = server::choose_model(&ids, a.model.as_deref())?;
    Ok(Target { base_url: format!("http://127.0.0.1:{}", a.port), port: a.port, model, context_tokens, api_key: key })
}

/// Builds the launch for `client` (pure: no files written, nothing started).
pub fn build(
    client: Client,
    target: &Target,
    user: &UserEnv,
    user_args: &[String],
    allow_small_context: bool,
) -> Result<Launch> {
    match client {
        Client::Claude => Ok(claude::build(target, user, user_args)),
        Client::Codex => Ok(codex::build(target, user, user_args)),
        Client::OpenCode => opencode::build(target, user, user_args),
        Client::Hermes => hermes::build(target, user, user_args, allow_small_context),
        Client::Pi => pi::build(target, user, user_args),
    }
}

/// The launch as text with the key hidden (for `--dry-run`).
pub fn describe(launch: &Launch, key: Option<&str>) -> String {
    let hide = |s: &str| match key {
        Some(k) if !k.is_empty() => s.replace(k, "***"),
        _ => s.to_owned(),
    };
    let mut out = String::new();
    for (k, v) in &launch.env {
        match v {
            Some(v) => out.push_str(&format!("{k}={}\n", hide(&shell_quote(v)))),
            None => out.push_str(&format!("unset {k}\n")),
        }
    }
    let args: Vec<String> = launch.args.iter().map(|a| hide(&shell_quote(a))).collect();
    out.push_str(&format!("{} {}\n", launch.program, args.join(" ")));
    for f in &launch.files {
        out.push_str(&format!("--- {}\n{}\n", f.path.display(), hide(&f.contents)));
    }
    out
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@+".contains(&b)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `splash <client>`: find the client, find or start the server, build the launch, write its files, run it.
pub fn main(client: Client, a: Args, allow_small_context: bool) -> Result<()> {
    let mut user = UserEnv::current();
    let program =
        find_program(client.program(), user.var("PATH")).ok_or_else(|| anyhow::anyhow!(missing_client(client)))?;
    let target = find_server(&a)?;
    if client == Client::Codex {
        user.codex_catalog = codex::read_bundled_catalog(&program);
    }
    let launch = build(client, &target, &user, &a.agent_args, allow_small_context)?;
    if a.dry_run {
        print!("{}", describe(&launch, target.api_key.as_deref()));
        return Ok(());
    }
    for f in &launch.files {
        write_atomic(&f.path, &f.contents)?;
    }
    eprintln!(
        "splash: {} → {} (model {}, context {} tokens)",
        client.name(),
        target.base_url,
        target.model,
        target.context_tokens
    );
    for n in &launch.notes {
        eprintln!("splash: {n}");
    }
    let mut cmd = std::process::Command::new(&program);
    cmd.args(&launch.args);
    for (k, v) in &launch.env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let e = cmd.exec();
        Err(e).with_context(|| format!("running {}", program.display()))
    }
    #[cfg(not(unix))]
    {
        let status = cmd.status().with_context(|| format!("running {}", program.display()))?;
        std::process::exit(status.code().unwrap_or(1));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn target(key: Option<&str>) -> Target {
        Target {
            base_url: "http://127.0.0.1:8000".into(),
            port: 8000,
            model: "qwen2.5-coder-0.5b".into(),
            context_tokens: 32768,
            api_key: key.map(str::to_owned),
        }
    }

    pub fn user(dir: &Path) -> UserEnv {
        UserEnv { home: dir.join("home"), splash_home: dir.join("splash"), vars: HashMap::new(), codex_catalog: None }
    }

    pub fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_in_user_args() {
        let a = args(&["-p", "hi", "--model=x", "--permission-mode", "plan"]);
        assert!(has_flag(&a, &["--model"]));
        assert!(has_flag(&a, &["--permission-mode"]));
        assert!(has_flag(&a, &["-p", "--print"]));
        assert!(!has_flag(&a, &["--settings"]));
        assert!(!has_flag(&args(&["--modelx"]), &["--model"]));
        assert!(!has_flag(&args(&["--", "--model"]), &["--model"]), "after -- it is the agent's prompt");
    }

    #[test]
    fn missing_client_is_one_line_with_the_install_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(find_program("claude", Some(dir.path().to_str().expect("utf8"))).is_none());
        for c in [Client::Claude, Client::Codex, Client::OpenCode, Client::Hermes, Client::Pi] {
            let m = missing_client(c);
            assert!(!m.contains('\n') && m.contains(c.install_hint()) && m.contains(c.program()), "{m}");
        }
        assert_eq!(
            missing_client(Client::Codex),
            "Codex CLI is not installed (no `codex` on PATH). Install it with: npm install -g @openai/codex"
        );
    }

    #[test]
    fn finds_executables_on_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("pi");
        std::fs::write(&p, "#!/bin/sh\n").expect("write");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert!(find_program("pi", dir.path().to_str()).is_none(), "not executable yet");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let path = format!("/nonexistent:{}", dir.path().display());
        assert_eq!(find_program("pi", Some(&path)), Some(p));
    }

    #[test]
    fn atomic_write_is_private_and_replaces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("a/b.json");
        write_atomic(&p, "one").expect("write");
        write_atomic(&p, "two").expect("rewrite");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(p.metadata().expect("meta").permissions().mode() & 0o777, 0o600);
        }
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().expect("dir")).expect("ls").collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind");
    }

    #[test]
    fn dry_run_never_shows_the_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = target(Some("s3cr3t-key"));
        for c in [Client::Claude, Client::Codex, Client::OpenCode, Client::Hermes, Client::Pi] {
            let mut t = t.clone();
            t.context_tokens = 131072;
            let launch = build(c, &t, &user(dir.path()), &[], false).expect("builds");
            let text = describe(&launch, t.api_key.as_deref());
            assert!(!text.contains("s3cr3t-key"), "{c:?}: {text}");
            assert!(!launch.args.iter().any(|a| a.contains("s3cr3t-key")), "{c:?}: key on the command line");
            assert!(!launch.notes.iter().any(|a| a.contains("s3cr3t-key")), "{c:?}: key in a note");
        }
    }
}
