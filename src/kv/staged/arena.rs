//! The bytes of a transaction's staged keys and values, in chunks that are appended to and
//! never moved: an entry names its bytes by a [`Span`] (where they start and how long they
//! are) instead of holding a handle of its own to them.
//!
//! A `Bytes` handle is 32 bytes: a staged key with a written value held two of them and
//! their tags, 88 bytes an entry, as much again as the key and value themselves for a catalog
//! row. With spans, an entry is 32 bytes. Chunks are shared between clones of the staged
//! writes (a view of a transaction shares them while it is written on), and only the chunk
//! being filled is ever copied for a writer.

use std::sync::Arc;

/// The first chunk's size; each later one is twice the last, up to [`CHUNK_MAX`]: a small
/// transaction holds little, a large one allocates rarely.
const CHUNK_MIN: usize = 4 << 10;
/// The largest chunk, except that a longer key or value gets a chunk of its own length.
const CHUNK_MAX: usize = 1 << 20;

/// Where bytes lie in an [`Arena`]: their chunk (the high 32 bits of `at`), their offset in
/// it (the low 32) and their length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(in crate::kv) struct Span {
    pub(super) at: u64,
    pub(super) len: u32,
}

impl Span {
    /// The number of bytes.
    pub(in crate::kv) fn len(self) -> usize {
        self.len as usize
    }

    fn chunk(self) -> usize {
        usize::try_from(self.at >> 32).unwrap_or(usize::MAX)
    }

    fn offset(self) -> usize {
        usize::try_from(self.at & u64::from(u32::MAX)).unwrap_or(usize::MAX)
    }
}

/// A point in an [`Arena`]'s history: truncating to it drops whatever was pushed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::kv) struct Mark {
    chunks: usize,
    last: usize,
}

/// Append-only chunks of bytes.
#[derive(Debug, Clone, Default)]
pub(in crate::kv) struct Arena {
    chunks: Vec<Arc<Vec<u8>>>,
}

impl Arena {
    /// Copies `parts`, one after another, into the arena; the span covers the first `take`
    /// of them. A key is pushed with what belongs to it (a digest), which then lies right
    /// after it.
    ///
    /// # Errors
    /// The length of the parts, when a span cannot hold it (4 GiB and more).
    pub(in crate::kv) fn push(&mut self, parts: &[&[u8]], take: usize) -> Result<Span, usize> {
        let total: usize = parts.iter().map(|part| part.len()).sum();
        let taken: usize = parts.iter().take(take).map(|part| part.len()).sum();
        let (Ok(len), Ok(_)) = (u32::try_from(taken), u32::try_from(total)) else {
            return Err(total);
        };
        let fits = self
            .chunks
            .last()
            .is_some_and(|chunk| chunk.capacity() - chunk.len() >= total);
        if !fits {
            let size = self
                .chunks
                .last()
                .map_or(CHUNK_MIN, |chunk| (chunk.capacity() * 2).min(CHUNK_MAX))
                .max(total);
            self.chunks.push(Arc::new(Vec::with_capacity(size)));
        }
        let index = self.chunks.len() - 1;
        let Some(chunk) = self.chunks.last_mut() else {
            return Err(total);
        };
        // Copies the chunk only while a clone of the arena still shares it.
        let chunk = Arc::make_mut(chunk);
        let offset = chunk.len();
        for part in parts {
            chunk.extend_from_slice(part);
        }
        let at = (u64::try_from(index).unwrap_or(u64::MAX) << 32)
            | u64::try_from(offset).unwrap_or(u64::MAX);
        Ok(Span { at, len })
    }

    /// The bytes `span` names, and `extra` bytes after them (empty if the arena does not hold
    /// them: never for a span it gave out).
    pub(in crate::kv) fn get(&self, span: Span, extra: usize) -> &[u8] {
        let start = span.offset();
        self.chunks
            .get(span.chunk())
            .and_then(|chunk| chunk.get(start..start + span.len() + extra))
            .unwrap_or_default()
    }

    /// Where the arena ends now.
    pub(in crate::kv) fn mark(&self) -> Mark {
        Mark {
            chunks: self.chunks.len(),
            last: self.chunks.last().map_or(0, |chunk| chunk.len()),
        }
    }

    /// Drops what was pushed after `mark`. The spans given out since then name nothing.
    pub(in crate::kv) fn truncate(&mut self, mark: Mark) {
        self.chunks.truncate(mark.chunks);
        if let Some(last) = self.chunks.last_mut()
            && last.len() > mark.last
        {
            Arc::make_mut(last).truncate(mark.last);
        }
    }

    /// Bytes the arena has allocated.
    pub(in crate::kv) fn capacity(&self) -> usize {
        self.chunks.iter().map(|chunk| chunk.capacity()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is pushed reads back by its span, across chunks and for a part larger than any
    /// chunk, with what was pushed after it; a truncation drops exactly what came after its
    /// mark, and a clone keeps what it had while the original is written on.
    #[test]
    fn spans_read_back_what_was_pushed_until_it_is_truncated() {
        let mut arena = Arena::default();
        let mut pushed = Vec::new();
        for n in 0..5_000_u32 {
            let key = format!("key-{n}");
            let span = arena.push(&[key.as_bytes(), b"!"], 1).expect("push");
            pushed.push((span, key));
        }
        let big = vec![7_u8; 3 * CHUNK_MAX];
        let big_span = arena.push(&[&big], 1).expect("push");
        assert!(arena.chunks.len() > 2, "{} chunks", arena.chunks.len());
        for (span, key) in &pushed {
            assert_eq!(arena.get(*span, 0), key.as_bytes());
            assert_eq!(arena.get(*span, 1).last(), Some(&b'!'));
        }
        assert_eq!(arena.get(big_span, 0), &big[..]);

        let mark = arena.mark();
        let shared = arena.clone();
        let after = arena.push(&[b"after"], 1).expect("push");
        let other = arena.push(&[&big], 1).expect("push");
        assert_eq!(arena.get(after, 0), b"after");
        assert_eq!(
            shared.get(after, 0),
            b"",
            "the clone does not see later pushes"
        );
        arena.truncate(mark);
        assert_eq!(arena.get(after, 0), b"");
        assert_eq!(arena.get(other, 0), b"");
        assert_eq!(arena.mark(), mark);
        assert_eq!(arena.get(big_span, 0), &big[..]);
        let (span, key) = pushed.last().expect("pushed");
        assert_eq!(arena.get(*span, 0), key.as_bytes());
        assert!(arena.capacity() >= 3 * CHUNK_MAX);
    }
}
