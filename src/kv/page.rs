//! Pages of a scan: pairs held in one buffer, so that a scan allocates once per page, never
//! once per pair.

/// How much one page of a scan may hold. A page holds at least one pair while any remain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSize {
    /// At most this many pairs.
    pub rows: usize,
    /// Stop adding pairs once the page holds this many key and value bytes.
    pub bytes: usize,
}

impl Default for PageSize {
    fn default() -> Self {
        Self {
            rows: 1024,
            bytes: 1 << 20,
        }
    }
}

impl PageSize {
    /// Pages of up to `rows` pairs, with the default byte bound.
    #[must_use]
    pub fn rows(rows: usize) -> Self {
        Self {
            rows,
            ..Self::default()
        }
    }

    /// This size with both bounds at least one.
    #[must_use]
    pub fn at_least_one(self) -> Self {
        Self {
            rows: self.rows.max(1),
            bytes: self.bytes.max(1),
        }
    }

    /// Whether a page with `rows` pairs and `bytes` bytes is full.
    #[must_use]
    pub fn is_full(self, rows: usize, bytes: usize) -> bool {
        rows >= self.rows || bytes >= self.bytes
    }
}

/// One stored key and its value, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPair {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
}

/// Pairs of one scan page, in key order, in one buffer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    data: Vec<u8>,
    /// Per pair, where its key ends and where its value ends in `data`; its key starts where
    /// the previous pair's value ends.
    ends: Vec<(usize, usize)>,
    exhausted: bool,
}

impl Page {
    /// An empty page with room for `pairs` pairs of `bytes` bytes in all.
    #[must_use]
    pub fn with_capacity(pairs: usize, bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
            ends: Vec::with_capacity(pairs),
            exhausted: false,
        }
    }

    /// An empty page that says the range has nothing more.
    #[must_use]
    pub fn exhausted_empty() -> Self {
        Self {
            exhausted: true,
            ..Self::default()
        }
    }

    /// Appends a pair; pairs must be pushed in key order.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        self.data.extend_from_slice(key);
        let key_end = self.data.len();
        self.data.extend_from_slice(value);
        self.ends.push((key_end, self.data.len()));
    }

    /// Number of pairs.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the page holds no pair.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Key and value bytes held.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Whether no pair of the scanned range lies after the last pair of this page.
    #[must_use]
    pub fn is_exhausted(&self) -> bool {
        self.exhausted
    }

    /// Says whether pairs of the range lie after this page.
    pub fn set_exhausted(&mut self, exhausted: bool) {
        self.exhausted = exhausted;
    }

    /// Pair `i`.
    #[must_use]
    pub fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let start = match i.checked_sub(1) {
            Some(previous) => self.ends.get(previous)?.1,
            None => 0,
        };
        let &(key_end, value_end) = self.ends.get(i)?;
        Some((
            self.data.get(start..key_end)?,
            self.data.get(key_end..value_end)?,
        ))
    }

    /// The last pair's key.
    #[must_use]
    pub fn last_key(&self) -> Option<&[u8]> {
        self.get(self.len().checked_sub(1)?).map(|(key, _)| key)
    }

    /// The pairs, in key order.
    #[must_use]
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&[u8], &[u8])> + ExactSizeIterator {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// Keeps the first `n` pairs.
    pub fn truncate(&mut self, n: usize) {
        if n < self.ends.len() {
            self.ends.truncate(n);
            let end = self.ends.last().map_or(0, |&(_, value_end)| value_end);
            self.data.truncate(end);
        }
    }

    /// The pairs as owned pairs.
    #[must_use]
    pub fn to_pairs(&self) -> Vec<KvPair> {
        self.iter()
            .map(|(key, value)| KvPair {
                key: key.to_vec(),
                value: value.to_vec(),
            })
            .collect()
    }
}

/// Fills one page from an ordered iterator of items, each pushed by `push`. Shared by the
/// backends that scan with an iterator; `push` lets a backend lend its bytes to the page
/// instead of copying them into owned pairs first.
pub(crate) fn fill_page<T, E>(
    items: impl Iterator<Item = Result<T, E>>,
    page: PageSize,
    mut push: impl FnMut(&mut Page, T),
) -> Result<Page, E> {
    // The bytes' room is taken from the first pair, below; room for the whole byte bound
    // would be a large allocation, and a page fault, for each of the short pages (a few
    // index entries) that a table-scoped read asks for per id run.
    let mut out = Page::with_capacity(page.rows.min(4096), 0);
    let mut items = items;
    loop {
        if page.is_full(out.len(), out.bytes()) {
            return Ok(out);
        }
        let Some(item) = items.next() else {
            out.exhausted = true;
            return Ok(out);
        };
        push(&mut out, item?);
        if out.len() == 1 {
            // The pairs of one range are mostly of one size: room for a page of pairs like
            // the first, so that a page of records grows once, while it is small, rather than
            // being copied as it doubles.
            let room = page
                .bytes
                .min(page.rows.saturating_mul(out.bytes() + out.bytes() / 4))
                .min(4 << 20);
            out.data.reserve(room.saturating_sub(out.data.len()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_come_back_as_pushed() {
        let mut page = Page::default();
        page.push(b"a", b"1");
        page.push(b"bb", b"");
        page.push(b"c", b"333");
        assert_eq!(page.len(), 3);
        assert_eq!(page.get(1), Some((&b"bb"[..], &b""[..])));
        assert_eq!(page.last_key(), Some(&b"c"[..]));
        assert_eq!(
            page.iter().map(|(k, _)| k.to_vec()).collect::<Vec<_>>(),
            vec![b"a".to_vec(), b"bb".to_vec(), b"c".to_vec()]
        );
        page.truncate(1);
        assert_eq!(page.to_pairs().len(), 1);
        assert_eq!(page.bytes(), 2);
        assert_eq!(page.get(1), None);
    }

    /// A page of records of one size takes its room once, from its first pair, and never
    /// doubles: room for a page of pairs like the first, a quarter over.
    #[test]
    fn a_page_of_like_pairs_takes_its_room_from_the_first() {
        let value = [7u8; 290];
        let pairs = (0..2000u32).map(|i| Ok::<_, ()>((i.to_be_bytes(), value)));
        let size = PageSize::default();
        let page =
            fill_page(pairs, size, |out, (key, value)| out.push(&key, &value)).expect("no error");
        assert_eq!(page.len(), size.rows);
        let pair = 4 + value.len();
        assert_eq!(page.bytes(), size.rows * pair);
        let room = page.data.capacity();
        assert!(room >= size.rows * pair, "room {room}");
        assert!(
            room <= size.rows * (pair + pair / 4),
            "room {room}: the page grew past its first estimate"
        );
    }
}
