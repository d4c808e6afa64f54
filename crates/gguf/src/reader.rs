use std::path::Path;

use crate::{DEFAULT_ALIGNMENT, Error, GgmlType, MAGIC, Result, Value, ValueType};

/// Nested arrays deeper than this are refused (a hostile file could otherwise exhaust the stack).
const MAX_ARRAY_DEPTH: usize = 8;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// Where a tensor lives and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size_bytes: u64,
}

impl TensorInfo {
    pub fn num_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Length of one row (`dims[0]`).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }

    /// Number of rows (the product of every dimension but the first).
    pub fn num_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }
}

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Tensor data stays in the memory map; [`GgufFile::tensor_data`] borrows it.
pub struct GgufFile {
    storage: Storage,
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("num_metadata", &self.metadata.len())
            .field("num_tensors", &self.tensors.len())
            .field("len", &self.storage.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps and parses a file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|source| Error::Open { path: path.into(), source })?;
        // SAFETY: the map is read-only; a file changed underneath us is the same hazard every mmap-based model
        // loader accepts (llama.cpp included). Every access is bounds-checked against the mapped length.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Open { path: path.into(), source })?;
        Self::parse(Storage::Mmap(mmap))
    }

    /// Parses a file held in memory (tests, synthetic models).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<Self> {
        let mut c = Cursor { buf: &storage, pos: 0 };
        let magic = c.u32("magic")?;
        if magic != MAGIC {
            return Err(Error::BadMagic { found: magic });
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(Error::UnsupportedVersion(version));
        }
        let num_tensors = c.u64("tensor count")?;
        let num_kv = c.u64("metadata count")?;
        // Each metadata pair takes at least 8 + 4 + 1 bytes, each tensor info at least 8 + 4 + 8 + 4 + 8.
        c.check_count("metadata count", num_kv, 13)?;
        c.check_count("tensor count", num_tensors, 32)?;

        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(num_kv as usize);
        let mut seen = std::collections::HashSet::new();
        for i in 0..num_kv {
            let key = c.string(&format!("metadata key #{i}"))?;
            let ty = c.u32(&format!("type of metadata {key:?}"))?;
            let ty = ValueType::from_u32(ty).ok_or_else(|| Error::BadValueType { key: key.clone(), ty })?;
            let value = c.value(&key, ty, 0)?;
            if !seen.insert(key.clone()) {
                return Err(Error::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => {
                let a = v.as_u64().ok_or_else(|| Error::Metadata {
                    key: "general.alignment".into(),
                    reason: format!("expected an unsigned integer, found {:?}", v.value_type()),
                })?;
                if a == 0 || !a.is_power_of_two() {
                    return Err(Error::BadAlignment(a));
                }
                a
            }
        };

        let mut tensors = Vec::with_capacity(num_tensors as usize);
        let mut names = std::collections::HashSet::new();
        for i in 0..num_tensors {
            let name = c.string(&format!("tensor #{i} name"))?;
            let n_dims = c.u32(&format!("tensor {name:?} dimension count"))?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(Error::BadTensor {
                    name,
                    reason: format!("has {n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(c.u64(&format!("tensor {name:?} dimension {d}"))?);
            }
            let ty_raw = c.u32(&format!("tensor {name:?} type"))?;
            let ty = GgmlType::from_u32(ty_raw)
                .ok_or_else(|| Error::UnknownTensorType { name: name.clone(), ty: ty_raw })?;
            let offset = c.u64(&format!("tensor {name:?} offset"))?;
            let size_bytes = tensor_size(&name, &dims, ty)?;
            if offset % alignment != 0 {
                return Err(Error::BadTensor {
                    name,
                    reason: format!("data offset {offset} is not a multiple of the alignment {alignment}"),
                });
            }
            if !names.insert(name.clone()) {
                return Err(Error::DuplicateTensor(name));
            }
            tensors.push(TensorInfo { name, dims, ty, offset, size_bytes });
        }

        let data_offset = c.pos.div_ceil(alignment).checked_mul(alignment).ok_or_else(|| Error::TooLarge {
            what: "data section offset".into(),
            value: c.pos,
            limit: u64::MAX,
        })?;
        let len = storage.len() as u64;
        for t in &tensors {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.size_bytes));
            match (start, end) {
                (Some(_), Some(end)) if end <= len => {}
                _ => {
                    return Err(Error::Truncated {
                        what: format!("data of tensor {:?} ({} {:?})", t.name, t.ty, t.dims),
                        start: data_offset.saturating_add(t.offset),
                        end: data_offset.saturating_add(t.offset).saturating_add(t.size_bytes),
                        len,
                    });
                }
            }
        }

        Ok(GgufFile { storage, version, metadata, tensors, alignment, data_offset })
    }

    /// Total size of the file in bytes.
    pub fn len(&self) -> u64 {
        self.storage.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.type_error(key, "a string", v)),
        }
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.type_error(key, "an unsigned integer", v)),
        }
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.type_error(key, "a number", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.type_error(key, "a bool", v)),
        }
    }

    /// An array of strings (token lists, merges).
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.type_error(key, "an array of strings", v))?;
        arr.iter()
            .map(|e| e.as_str().ok_or_else(|| self.type_error(key, "an array of strings", v)))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// An array of integers (token types).
    pub fn get_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let arr = v.as_array().ok_or_else(|| self.type_error(key, "an array of integers", v))?;
        arr.iter()
            .map(|e| e.as_i64().ok_or_else(|| self.type_error(key, "an array of integers", v)))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    fn type_error(&self, key: &str, expected: &str, v: &Value) -> Error {
        Error::Metadata { key: key.into(), reason: format!("expected {expected}, found {:?}", v.value_type()) }
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor. Bounds were checked when the file was parsed.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + info.offset) as usize;
        &self.storage[start..start + info.size_bytes as usize]
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.storage
    }
}

/// Size in bytes of a tensor, with every multiplication checked and the row length a whole number of blocks.
fn tensor_size(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64> {
    let bad = |reason: String| Error::BadTensor { name: name.into(), reason };
    let row = dims[0];
    if dims.contains(&0) {
        return Err(bad(format!("has a zero dimension {dims:?}")));
    }
    let block = ty.block_len() as u64;
    if !row.is_multiple_of(block) {
        return Err(bad(format!("row length {row} is not a multiple of the {ty} block size {block}")));
    }
    let mut size = (row / block).checked_mul(ty.block_bytes() as u64);
    for &d in &dims[1..] {
        size = size.and_then(|s| s.checked_mul(d));
    }
    // Nothing real comes near 2^48 bytes; larger values are corrupt and would overflow later arithmetic.
    match size {
        Some(s) if s < 1 << 48 => Ok(s),
        _ => Err(bad(format!("dimensions {dims:?} of type {ty} give an absurd size"))),
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: u64,
}

impl Cursor<'_> {
    fn take(&mut self, n: u64, what: &str) -> Result<&[u8]> {
        let len = self.buf.len() as u64;
        let end = self.pos.checked_add(n).filter(|&e| e <= len).ok_or_else(|| Error::Truncated {
            what: what.into(),
            start: self.pos,
            end: self.pos.saturating_add(n),
            len,
        })?;
        let s = &self.buf[self.pos as usize..end as usize];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("INVARIANT: take returned N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Refuses a count whose elements could not fit in the rest of the file.
    fn check_count(&self, what: &str, count: u64, min_bytes_each: u64) -> Result<()> {
        let remaining = (self.buf.len() as u64).saturating_sub(self.pos);
        let limit = remaining / min_bytes_each.max(1);
        if count > limit {
            return Err(Error::TooLarge { what: what.into(), value: count, limit });
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.u64(&format!("{what} length"))?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| Error::BadUtf8 { what: what.into() })
    }

    fn value(&mut self, key: &str, ty: ValueType, depth: usize) -> Result<Value> {
        let what = || format!("value of metadata {key:?}");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what())?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what())?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            ValueType::Bool => match self.array::<1>(&what())?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(Error::Metadata { key: key.into(), reason: format!("bool byte is {b}, not 0 or 1") }),
            },
            ValueType::String => Value::String(self.string(&what())?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(Error::Metadata {
                        key: key.into(),
                        reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    });
                }
                let raw = self.u32(&format!("element type of metadata {key:?}"))?;
                let elem = ValueType::from_u32(raw).ok_or_else(|| Error::BadValueType { key: key.into(), ty: raw })?;
                let n = self.u64(&format!("length of metadata {key:?}"))?;
                let min_each = match elem {
                    ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
                    ValueType::U16 | ValueType::I16 => 2,
                    ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
                    ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
                    ValueType::Array => 12,
                };
                self.check_count(&format!("length of metadata {key:?}"), n, min_each)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(key, elem, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }
}

impl AsRef<[u8]> for GgufFile {
    fn as_ref(&self) -> &[u8] {
        &self.storage
    }
}
