//! Bounded text for messages: excerpts of client input, and text cut to a byte bound. Below
//! every layer: it knows nothing but strings.

use std::borrow::Cow;

/// Longest piece of client input a message repeats.
pub const MAX_EXCERPT: usize = 64;

/// The longest start of `text` that is at most `max` bytes and ends at a character boundary.
fn prefix(text: &str, max: usize) -> &str {
    let mut cut = max.min(text.len());
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.get(..cut).unwrap_or_default()
}

/// `text` in at most `max` bytes: whole when it fits, else cut at a character boundary and
/// ended with `…`. For messages whose length must stay bounded (gRPC status messages, a
/// backend's account of an error).
#[must_use]
pub fn shortened(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mark = '…';
    Cow::Owned(format!(
        "{}{mark}",
        prefix(text, max.saturating_sub(mark.len_utf8()))
    ))
}

/// `text` as a message repeats client input: whole when short, else its first
/// [`MAX_EXCERPT`] bytes (cut at a character boundary) and how long it was, so a huge or
/// hostile input never comes back whole.
#[must_use]
pub fn excerpt(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_EXCERPT {
        return Cow::Borrowed(text);
    }
    Cow::Owned(format!(
        "{}… ({} bytes)",
        prefix(text, MAX_EXCERPT),
        text.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortened_text_keeps_its_bound_and_character_boundaries() {
        let text = "é".repeat(3000);
        for max in [0, 1, 2, 3, 4, 5, 100, 4096] {
            let cut = shortened(&text, max);
            assert!(cut.len() <= max.max(3), "{max}: {} bytes", cut.len());
            assert!(cut.ends_with('…'), "{max}: {cut}");
        }
        assert_eq!(shortened("short", 10), "short");
        assert_eq!(shortened("exactly", 7), "exactly");
    }

    #[test]
    fn client_input_is_repeated_only_in_part() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(1 << 19);
        let shown = excerpt(&long);
        assert!(shown.len() < MAX_EXCERPT + 32, "{shown}");
        assert!(shown.ends_with("… (1048576 bytes)"), "{shown}");
    }
}
