//! Base64 text as requests carry images and documents (the standard alphabet; the URL-safe
//! one read too): decoded a few bytes at an offset (an image's header) or whole (a PDF).

/// Each byte's six bits as a base64 character, [`NOT_BASE64`] for padding and anything else.
const SEXTETS: [u8; 256] = {
    let mut table = [NOT_BASE64; 256];
    let mut i = 0;
    while i < 26 {
        table[b'A' as usize + i] = i as u8;
        table[b'a' as usize + i] = 26 + i as u8;
        i += 1;
    }
    let mut digit = 0;
    while digit < 10 {
        table[b'0' as usize + digit] = 52 + digit as u8;
        digit += 1;
    }
    table[b'+' as usize] = 62;
    table[b'-' as usize] = 62;
    table[b'/' as usize] = 63;
    table[b'_' as usize] = 63;
    table
};
const NOT_BASE64: u8 = 0xff;

/// The six bits a base64 character stands for; `None` for padding and anything else.
fn sextet(c: u8) -> Option<u8> {
    let value = SEXTETS[usize::from(c)];
    (value != NOT_BASE64).then_some(value)
}

/// The bytes of `text`, white space skipped, up to its padding or the first character that
/// is not base64. Four characters at a time while they are all base64 (a request's PDF is
/// megabytes, sent again with every call), one at a time from the first that is not.
pub(super) fn decode(text: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len() / 4 * 3);
    let mut groups = text.chunks_exact(4);
    let mut read = 0;
    for group in groups.by_ref() {
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| SEXTETS[usize::from(group[i])]);
        if (a | b | c | d) > 63 {
            break;
        }
        let n = u32::from(a) << 18 | u32::from(b) << 12 | u32::from(c) << 6 | u32::from(d);
        bytes.extend_from_slice(&n.to_be_bytes()[1..]);
        read += 4;
    }
    let (mut bits, mut held) = (0u32, 0u32);
    for &c in &text[read..] {
        let value = match sextet(c) {
            Some(value) => value,
            None if c.is_ascii_whitespace() => continue,
            None => break,
        };
        bits = (bits << 6) | u32::from(value);
        held += 6;
        if held >= 8 {
            held -= 8;
            bytes.push((bits >> held) as u8);
        }
    }
    bytes
}

/// Standard base64 text read at any byte offset, decoding only the 4-character groups that
/// hold the bytes asked for (an image's header, a JPEG's segment heads).
pub(super) struct Base64<'a>(pub(super) &'a [u8]);

impl Base64<'_> {
    /// `len` bytes from `offset`; `None` past the end or over a character that is not base64.
    pub(super) fn range(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(len + 3);
        let mut group = offset / 3;
        while out.len() < offset % 3 + len {
            let chars = self.0.get(group * 4..group * 4 + 4)?;
            let mut n: u32 = 0;
            let mut bytes = 3;
            for (i, &c) in chars.iter().enumerate() {
                let value = match (sextet(c), c) {
                    (Some(value), _) => value,
                    (None, b'=') if i >= 2 => {
                        bytes = bytes.min(i - 1);
                        0
                    }
                    _ => return None,
                };
                n = n << 6 | u32::from(value);
            }
            out.extend_from_slice(&n.to_be_bytes()[1..1 + bytes]);
            if bytes < 3 {
                break;
            }
            group += 1;
        }
        let start = offset % 3;
        out.get(start..start + len).map(<[u8]>::to_vec)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use base64::Engine;

    /// Standard base64 with padding, as SDKs write an image's or a PDF's bytes.
    pub fn encoded(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn whole_text_decodes_with_white_space_and_stops_at_padding_or_garbage() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = encoded(&bytes);
        assert_eq!(decode(text.as_bytes()), bytes);
        let wrapped: Vec<u8> = text
            .as_bytes()
            .chunks(76)
            .flat_map(|line| [line, b"\r\n"].concat())
            .collect();
        assert_eq!(decode(&wrapped), bytes);
        assert_eq!(decode(b"aGk=aGk="), b"hi");
        assert_eq!(decode(b"aGVsbG8!d29ybGQ"), b"hello");
    }

    #[test]
    fn a_range_decodes_at_any_offset_and_stops_at_the_padding() {
        let bytes: Vec<u8> = (0..=255).collect();
        let text = encoded(&bytes[..100]);
        let decoded = Base64(text.as_bytes());
        for offset in [0, 1, 2, 3, 50, 97] {
            assert_eq!(
                decoded.range(offset, 3),
                Some(bytes[offset..offset + 3].to_vec())
            );
        }
        assert_eq!(decoded.range(98, 2), Some(vec![98, 99]));
        assert_eq!(decoded.range(99, 2), None, "past the end");
    }
}
