//! The bytes of a transaction's staged keys and values, in chunks that are appended to and
//! never moved: an entry names its bytes by a [`Span`] (where they start and how long they
//! are) instead of holding a handle of its own to them.
//!
//! A `Bytes` handle is 32 bytes: a staged key with a written value held two of them and
//! their tags, 88 bytes an entry, as much again as the key and value themselves for a catalog
//! row. With spans, an entry is 32 bytes. Chunks are shared between clones of the staged
//! writes (a view of a transaction shares them while it is written on), and only the chunk
//! being filled is ever copied for a writer.

use std::mem;
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
    /// The index of the chunk then open.
    chunk: usize,
    /// Its length then.
    len: usize,
}

/// Append-only chunks of bytes: full chunks, shared by clones of the arena, and the chunk
/// being filled, which a clone copies (a mebibyte at most).
#[derive(Debug, Clone, Default)]
pub(in crate::kv) struct Arena {
    full: Vec<Arc<Vec<u8>>>,
    open: Vec<u8>,
}

impl Arena {
    /// Copies `bytes` into the arena.
    ///
    /// # Errors
    /// Their length, when a span cannot hold it (4 GiB and more).
    pub(in crate::kv) fn push(&mut self, bytes: &[u8]) -> Result<Span, usize> {
        self.push_with(bytes, &[])
    }

    /// Copies `bytes` and then `trailer` into the arena: the span names `bytes`, and
    /// [`get`](Self::get) reads the trailer with them.
    ///
    /// # Errors
    /// The length of both, when a span cannot hold it (4 GiB and more).
    pub(in crate::kv) fn push_with(&mut self, bytes: &[u8], trailer: &[u8]) -> Result<Span, usize> {
        let total = bytes.len() + trailer.len();
        let (Ok(len), Ok(_)) = (u32::try_from(bytes.len()), u32::try_from(total)) else {
            return Err(total);
        };
        if self.open.capacity() - self.open.len() < total {
            let size = (self.open.capacity() * 2)
                .clamp(CHUNK_MIN, CHUNK_MAX)
                .max(total);
            let full = mem::replace(&mut self.open, Vec::with_capacity(size));
            if full.capacity() > 0 {
                self.full.push(Arc::new(full));
            }
        }
        let offset = self.open.len();
        self.open.extend_from_slice(bytes);
        self.open.extend_from_slice(trailer);
        let at = (u64::try_from(self.full.len()).unwrap_or(u64::MAX) << 32)
            | u64::try_from(offset).unwrap_or(u64::MAX);
        Ok(Span { at, len })
    }

    /// The bytes `span` names, and `extra` bytes after them (empty if the arena does not hold
    /// them: never for a span it gave out).
    pub(in crate::kv) fn get(&self, span: Span, extra: usize) -> &[u8] {
        let start = span.offset();
        let chunk = span.chunk();
        let chunk = match self.full.get(chunk) {
            Some(full) => full.as_slice(),
            None if chunk == self.full.len() => self.open.as_slice(),
            None => &[],
        };
        chunk
            .get(start..start + span.len() + extra)
            .unwrap_or_default()
    }

    /// Where the arena ends now.
    pub(in crate::kv) fn mark(&self) -> Mark {
        Mark {
            chunk: self.full.len(),
            len: self.open.len(),
        }
    }

    /// Drops what was pushed after `mark`. The spans given out since then name nothing.
    pub(in crate::kv) fn truncate(&mut self, mark: Mark) {
        if mark.chunk < self.full.len() {
            // The chunk open at the mark has filled since: it is open again.
            let reopened = self.full.drain(mark.chunk..).next();
            self.open = reopened.map_or_else(Vec::new, |chunk| {
                Arc::try_unwrap(chunk).unwrap_or_else(|shared| shared.as_ref().clone())
            });
        }
        self.open.truncate(mark.len);
    }

    /// Bytes the arena has allocated.
    pub(in crate::kv) fn capacity(&self) -> usize {
        self.full
            .iter()
            .map(|chunk| chunk.capacity())
            .sum::<usize>()
            + self.open.capacity()
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
            let span = arena.push_with(key.as_bytes(), b"!").expect("push");
            pushed.push((span, key));
        }
        let big = vec![7_u8; 3 * CHUNK_MAX];
        let big_span = arena.push(&big).expect("push");
        assert!(arena.full.len() > 2, "{} chunks", arena.full.len());
        for (span, key) in &pushed {
            assert_eq!(arena.get(*span, 0), key.as_bytes());
            assert_eq!(arena.get(*span, 1).last(), Some(&b'!'));
        }
        assert_eq!(arena.get(big_span, 0), &big[..]);

        let mark = arena.mark();
        let shared = arena.clone();
        let after = arena.push(b"after").expect("push");
        let other = arena.push(&big).expect("push");
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
