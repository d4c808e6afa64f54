use std::io::Write;
use std::path::Path;

use crate::{DEFAULT_ALIGNMENT, Error, GgmlType, MAGIC, Result, Value};

/// Builds a GGUF file (v3): metadata in insertion order, then tensors, each aligned.
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Data)>,
    alignment: u64,
}

/// A tensor's bytes: held, or written by a function when the file is (a file larger than memory).
enum Data {
    Bytes(Vec<u8>),
    Fill { len: u64, fill: Box<dyn Fn(&mut dyn Write) -> std::io::Result<()>> },
}

impl Data {
    fn len(&self) -> u64 {
        match self {
            Data::Bytes(b) => b.len() as u64,
            Data::Fill { len, .. } => *len,
        }
    }
}

/// Counts the bytes written through it.
struct Counted<'a, W: Write>(&'a mut W, u64);

impl<W: Write> Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(buf)?;
        self.1 += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { metadata: Vec::new(), tensors: Vec::new(), alignment: DEFAULT_ALIGNMENT }
    }

    /// Sets a metadata value; `general.alignment` also sets the alignment used for tensor data.
    pub fn add(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        if key == "general.alignment"
            && let Some(a) = value.as_u64().filter(|a| a.is_power_of_two())
        {
            self.alignment = a;
        }
        self.metadata.retain(|(k, _)| *k != key);
        self.metadata.push((key, value));
    }

    /// Adds a tensor. `dims` are in ggml order (`dims[0]` is the row length); `data` must be exactly its size.
    pub fn add_tensor(&mut self, name: impl Into<String>, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Result<()> {
        self.push(name.into(), dims, ty, Data::Bytes(data))
    }

    /// Adds a tensor whose bytes `fill` writes when the file is written, exactly the tensor's size (checked then).
    pub fn add_tensor_with(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        fill: impl Fn(&mut dyn Write) -> std::io::Result<()> + 'static,
    ) -> Result<()> {
        let len = tensor_bytes(dims, ty).unwrap_or(u64::MAX);
        self.push(name.into(), dims, ty, Data::Fill { len, fill: Box::new(fill) })
    }

    fn push(&mut self, name: String, dims: &[u64], ty: GgmlType, data: Data) -> Result<()> {
        let expected = tensor_bytes(dims, ty);
        if expected != Some(data.len()) {
            return Err(Error::BadTensor {
                name,
                reason: format!("{} bytes given, {:?} expected for {ty} {dims:?}", data.len(), expected),
            });
        }
        self.tensors.push((name, dims.to_vec(), ty, data));
        Ok(())
    }

    /// The tensors added so far: name, ggml dims and bytes of data (what the file's tensor entries will say).
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &[u64], u64)> {
        self.tensors.iter().map(|(name, dims, _, data)| (name.as_str(), dims.as_slice(), data.len()))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out).expect("INVARIANT: writing to a Vec cannot fail");
        out
    }

    /// Writes the file atomically (a temporary file renamed into place).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let err = |source| Error::Write { path: path.into(), source };
        let tmp = path.with_extension("gguf.partial");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(err)?);
        self.write_to(&mut f).map_err(err)?;
        f.into_inner().map_err(|e| err(e.into_error()))?.sync_all().map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Writes the header and sets the file's length to the whole file's, leaving the tensor data a hole that reads
    /// as zeros (sparse where the file system allows): a file for what reads only shapes (a memory plan), not for
    /// running. Atomic as [`write`](Self::write).
    pub fn write_header_only(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let err = |source| Error::Write { path: path.into(), source };
        let tmp = path.with_extension("gguf.partial");
        let (head, data_len) = self.header();
        let mut f = std::fs::File::create(&tmp).map_err(err)?;
        f.write_all(&head).map_err(err)?;
        f.set_len(head.len() as u64 + data_len).map_err(err)?;
        f.sync_all().map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    fn align(&self, n: u64) -> u64 {
        n.div_ceil(self.alignment) * self.alignment
    }

    /// The header, padded to the alignment, and the length of the tensor data after it.
    fn header(&self) -> (Vec<u8>, u64) {
        let mut head = Vec::new();
        head.extend_from_slice(&MAGIC.to_le_bytes());
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut head, k);
            head.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut head, v);
        }
        // `end`: where the last tensor's bytes end (no padding follows it).
        let (mut offset, mut end) = (0u64, 0u64);
        for (name, dims, ty, data) in &self.tensors {
            put_string(&mut head, name);
            head.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&ty.to_u32().to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            end = offset + data.len();
            offset = self.align(end);
        }
        let head_len = head.len() as u64;
        head.resize(self.align(head_len) as usize, 0);
        (head, end)
    }

    fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let align = |n: u64| self.align(n);
        let (head, _) = self.header();
        let zeros = vec![0u8; self.alignment as usize];
        w.write_all(&head)?;
        for (i, (name, _, _, data)) in self.tensors.iter().enumerate() {
            match data {
                Data::Bytes(b) => w.write_all(b)?,
                Data::Fill { len, fill } => {
                    let mut c = Counted(&mut *w, 0);
                    fill(&mut c)?;
                    if c.1 != *len {
                        let e = format!("tensor {name}: {} bytes written, {len} declared", c.1);
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
                    }
                }
            }
            if i + 1 < self.tensors.len() {
                let n = data.len();
                w.write_all(&zeros[..(align(n) - n) as usize])?;
            }
        }
        Ok(())
    }
}

/// Bytes of a tensor of ggml dims `dims` and type `ty`; `None` if its rows are not whole blocks.
fn tensor_bytes(dims: &[u64], ty: GgmlType) -> Option<u64> {
    let row = dims.first().copied().unwrap_or(0) as usize;
    let rows: u64 = dims.iter().skip(1).product();
    ty.row_bytes(row).map(|r| r as u64 * rows)
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.push(*x as u8),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(*x as u8),
        Value::String(s) => put_string(buf, s),
        Value::Array(ty, items) => {
            buf.extend_from_slice(&(*ty as u32).to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(buf, it);
            }
        }
    }
}
