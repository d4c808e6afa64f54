//! GPT-2's byte-level alphabet: every byte is written as one printable Unicode character, so BPE can work on
//! characters and the vocabulary can be stored as text.
//!
//! `ENCODE[b]` is the character for byte `b`; [`decode_char`] inverts it. Same table as `bytes_to_unicode` in
//! OpenAI's gpt-2 `encoder.py`, Hugging Face's `ByteLevel` and llama.cpp's `unicode_byte_to_utf8`.

/// The character that stands for each byte.
pub(crate) static ENCODE: [char; 256] = build_encode();

const fn is_printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_encode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let code = if is_printable(b as u8) {
            b as u32
        } else {
            n += 1;
            255 + n
        };
        table[b] = match char::from_u32(code) {
            Some(c) => c,
            None => '\0', // unreachable: codes are below 0x200
        };
        b += 1;
    }
    table
}

/// `DECODE[c]` is the byte character `c` stands for, or -1; characters of the alphabet are all below 0x144.
static DECODE: [i16; 0x144] = build_decode();

const fn build_decode() -> [i16; 0x144] {
    let encode = build_encode();
    let mut table = [-1i16; 0x144];
    let mut b = 0usize;
    while b < 256 {
        table[encode[b] as usize] = b as i16;
        b += 1;
    }
    table
}

/// The byte a byte-level character stands for, or `None` for a character outside the alphabet.
pub(crate) fn decode_char(c: char) -> Option<u8> {
    let v = *DECODE.get(c as usize)?;
    u8::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_and_matches_gpt2() {
        for b in 0..=255u8 {
            assert_eq!(decode_char(ENCODE[b as usize]), Some(b));
        }
        assert_eq!(ENCODE[b' ' as usize], 'Ġ');
        assert_eq!(ENCODE[b'\n' as usize], 'Ċ');
        assert_eq!(ENCODE[b'\t' as usize], 'ĉ');
        assert_eq!(ENCODE[b'a' as usize], 'a');
        assert_eq!(ENCODE[0xAD], 'Ń');
        assert_eq!(decode_char('中'), None);
    }
}
