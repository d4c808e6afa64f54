//! Python's way of turning template values into text, which Hugging Face chat templates are written against.
//!
//! * [`tojson`]: the `tojson` filter transformers installs, i.e. `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)` with those keyword arguments: `", "` / `": "` separators, no HTML escaping,
//!   key order kept, Python's float formatting (`1e-05`, `1e+20`, `1.0`).
//! * [`format_value`]: what `{{ value }}` prints, i.e. Python's `str()`: `None`, `True`, `[1, 'a']`, `{'k': 'v'}`.
//!
//! In: minijinja values. Out: text, or a template error for values Python could not serialize either.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};

/// `json.dumps` options, as the `tojson` filter's keyword arguments.
struct JsonOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// The `tojson` filter: `{{ x | tojson }}`, `{{ x | tojson(indent=2, sort_keys=true) }}`.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.is_integer() => Some(" ".repeat(usize::try_from(i64::try_from(v)?).unwrap_or(0))),
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: bad indent {v}"))),
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> = v
                .try_iter()?
                .map(|p| p.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"))?;
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"));
                }
            }
        }
        // Python's defaults depend on whether there is an indent.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let opts = JsonOptions { ensure_ascii, indent, item_separator, key_separator, sort_keys };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from(out))
}

/// `json.dumps` of a value, with the default options of transformers' filter.
pub fn to_json(value: &Value) -> Result<String, Error> {
    let opts = JsonOptions {
        ensure_ascii: false,
        indent: None,
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        sort_keys: false,
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(out)
}

fn not_serializable(value: &Value) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("Object of type {} is not JSON serializable", value.kind()))
}

fn write_json(out: &mut String, value: &Value, opts: &JsonOptions, level: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, true)?,
        ValueKind::String => write_json_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, opts, level, '[', ']', &items, |out, item, level| write_json(out, item, opts, level))?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, opts, level, '{', '}', &entries, |out, (key, item), level| {
                write_json_string(out, key, opts.ensure_ascii);
                out.push_str(&opts.key_separator);
                write_json(out, item, opts, level)
            })?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// Python's `_iterencode_list` / `_iterencode_dict` layout: `[]` when empty, else items separated by the item
/// separator, each on its own indented line when there is an indent.
fn write_container<T>(
    out: &mut String,
    opts: &JsonOptions,
    level: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let inner = level + 1;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&opts.item_separator);
        }
        if let Some(indent) = &opts.indent {
            out.push('\n');
            out.push_str(&indent.repeat(inner));
        }
        write_item(out, item, inner)?;
    }
    if let Some(indent) = &opts.indent {
        out.push('\n');
        out.push_str(&indent.repeat(level));
    }
    out.push(close);
    Ok(())
}

/// Python turns non-string keys into strings: numbers as they print, booleans and None as JSON literals.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, true)?;
            s
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {}", key.kind()),
            ));
        }
    })
}

/// `json.encoder.py_encode_basestring` (or `_ascii` with `ensure_ascii`).
fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Integers in decimal; floats as Python's `repr` (`json` spells the non-finite ones `NaN`, `Infinity`).
fn write_number(out: &mut String, value: &Value, json: bool) -> Result<(), Error> {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return Ok(());
    }
    let f = f64::try_from(value.clone())?;
    if f.is_nan() {
        out.push_str(if json { "NaN" } else { "nan" });
    } else if f.is_infinite() {
        let word = if json { "Infinity" } else { "inf" };
        if f < 0.0 {
            out.push('-');
        }
        out.push_str(word);
    } else {
        out.push_str(&float_repr(f));
    }
    Ok(())
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional when the decimal exponent is in
/// -5 < e < 16 (always with a `.0` or fraction), else `d.ddde±XX`.
pub(crate) fn float_repr(f: f64) -> String {
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-7", "1e20", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let mut out = String::from(sign);
    if !(-5 < exp && exp < 16) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.unsigned_abs());
    } else if exp < 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-exp - 1) as usize));
        out.push_str(&digits);
    } else {
        let point = exp as usize + 1;
        if digits.len() > point {
            out.push_str(&digits[..point]);
            out.push('.');
            out.push_str(&digits[point..]);
        } else {
            out.push_str(&digits);
            out.push_str(&"0".repeat(point - digits.len()));
            out.push_str(".0");
        }
    }
    out
}

/// The formatter for `{{ value }}`: Python's `str(value)`; undefined prints nothing, as in Jinja2.
pub(crate) fn format_value(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    let mut s = String::new();
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => s.push_str(value.as_str().unwrap_or_default()),
        _ => write_repr(&mut s, value, true)?,
    }
    out.write_str(&s).map_err(|_| Error::new(ErrorKind::WriteFailure, "cannot write template output"))
}

/// Python's `repr` (or `str` at the top level, which differs only for strings).
fn write_repr(out: &mut String, value: &Value, top: bool) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, false)?,
        ValueKind::String if top => out.push_str(value.as_str().unwrap_or_default()),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item, false)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key, false)?;
                out.push_str(": ");
                write_repr(out, &value.get_item(&key)?, false)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
    Ok(())
}

/// Python's `repr(str)`: single quotes unless the text has `'` but no `"`; backslash escapes for the quote,
/// backslash and non-printable characters.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let code = c as u32;
                let _ = match code {
                    0..=0xff => write!(out, "\\x{code:02x}"),
                    0x100..=0xffff => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character, approximated without Unicode tables: control characters,
/// separators other than the space, the common format characters and private-use characters are not printable.
fn is_printable(c: char) -> bool {
    !matches!(c as u32,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad
        | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x1680 | 0x180e
        | 0x2000..=0x200f | 0x2028..=0x202f | 0x205f..=0x2064 | 0x2066..=0x206f
        | 0x3000 | 0xd800..=0xf8ff | 0xfeff | 0xfff9..=0xfffb
        | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0x10ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (0.1, "0.1"),
            (1.0, "1.0"),
            (1e-5, "1e-05"),
            (1e20, "1e+20"),
            (123456789.125, "123456789.125"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (2.5e-4, "0.00025"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (-2.5, "-2.5"),
            (1234.5678, "1234.5678"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f:e}");
        }
    }

    #[test]
    fn str_repr_picks_quotes_like_python() {
        let repr = |s: &str| {
            let mut out = String::new();
            write_str_repr(&mut out, s);
            out
        };
        assert_eq!(repr("it's"), "\"it's\"");
        assert_eq!(repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(repr("tab\tnl\n\u{1}é\u{a0}"), "'tab\\tnl\\n\\x01é\\xa0'");
    }
}
