//! Key ranges and the hex form of keys: the byte-level vocabulary the codec and the stores
//! share. Below both: it knows nothing of layouts or backends.

use std::fmt;

/// The least key after every key that starts with `prefix`: the prefix with its last byte
/// below `0xff` incremented and what follows dropped; `None` when every byte is `0xff`.
#[must_use]
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// A half-open key range `[start, end)`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyRange {
    /// First key in the range.
    pub start: Vec<u8>,
    /// First key after the range.
    pub end: Vec<u8>,
}

impl KeyRange {
    /// The range `[start, end)`.
    #[must_use]
    pub fn new(start: Vec<u8>, end: Vec<u8>) -> Self {
        Self { start, end }
    }

    /// Whether `key` lies in the range.
    #[must_use]
    pub fn contains(&self, key: &[u8]) -> bool {
        self.start.as_slice() <= key && key < self.end.as_slice()
    }

    /// Whether the range holds no key at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// The part of the range after `key`: every key of the range greater than `key`.
    #[must_use]
    pub fn after(&self, key: &[u8]) -> KeyRange {
        let mut start = key.to_vec();
        start.push(0);
        KeyRange {
            start: start.max(self.start.clone()),
            end: self.end.clone(),
        }
    }
}

impl fmt::Debug for KeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {})", hex(&self.start), hex(&self.end))
    }
}

/// Lowercase hex of `bytes`, for messages about keys and for tokens.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    let digit = |nibble: u8| char::from_digit(u32::from(nibble), 16).unwrap_or('0');
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(digit(byte >> 4));
        out.push(digit(byte & 0x0f));
    }
    out
}

/// The bytes of hex `text` (either case), if it is hex of whole bytes.
#[must_use]
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks_exact(2)
        .map(|pair| {
            let high = char::from(*pair.first()?).to_digit(16)?;
            let low = char::from(*pair.get(1)?).to_digit(16)?;
            u8::try_from(high * 16 + low).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhex_inverts_hex_and_refuses_what_is_not_hex() {
        let bytes = [0x00, 0x0f, 0xa5, 0xff];
        assert_eq!(unhex(&hex(&bytes)).as_deref(), Some(&bytes[..]));
        assert_eq!(unhex("A5FF").as_deref(), Some(&[0xa5, 0xff][..]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(""), Some(Vec::new()));
    }

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(hex(&[]), "");
    }

    #[test]
    fn after_is_the_rest_of_the_range() {
        let range = KeyRange::new(b"b".to_vec(), b"d".to_vec());
        let rest = range.after(b"c");
        assert!(!rest.contains(b"c") && rest.contains(b"c\x00") && !rest.contains(b"d"));
        assert_eq!(
            range.after(b"a"),
            range,
            "a key before the range leaves all of it"
        );
    }
}
