//! Staged writes: a transaction's net effect on each key it touches, found by hash as the
//! transaction is built and put in key order when it is read in order, so that staging a
//! change costs in proportion to the change, a view of the transaction shares the staged
//! writes instead of copying them, and the commit hands them to the backend sorted and
//! reduced.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::mem;
use std::ops::Bound;
use std::sync::{Arc, Mutex, PoisonError};

use self::arena::{Mark, Span};
use self::slots::{Full, Hash, Lookup, Slots};
use super::digest::{Digest, Digester};
use super::write_set::Mutation;
use super::{Conflict, KeyRange, KvError, StoreLimits};

/// What a key must be in the store before the commit for it to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Anything.
    None,
    /// Absent (an insert-if-absent).
    Absent,
    /// Present.
    Present,
    /// Present, with the value the transaction read (by its digest): an update or delete of
    /// a record commits only if no other commit changed the record since it was read.
    Unchanged(Digest),
}

/// A range the transaction read whole and acted on (a range delete, the end of every file of
/// a table): the commit applies only if the range still holds exactly what it held in the
/// transaction's snapshot, so that a row inserted, changed or removed there concurrently
/// conflicts with it instead of escaping it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRequirement {
    /// The range.
    pub range: KeyRange,
    /// The digest of its pairs in the snapshot, in key order.
    pub digest: Digest,
}

impl RangeRequirement {
    /// Whether `pairs`, the range's contents now in key order, are what was read.
    pub fn holds<'a>(&self, pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> bool {
        Digester::of_pairs(pairs) == self.digest
    }
}

/// A transaction's net effect on one key, as read from the staged writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staged<'a> {
    /// What the key must be before the commit.
    pub requirement: Requirement,
    /// The key's value after the commit: `Some(Some(v))` written, `Some(None)` deleted, `None`
    /// untouched (a requirement only).
    pub write: Option<Option<&'a [u8]>>,
}

/// A requirement as an entry holds it: the digest of [`Requirement::Unchanged`] lies in the
/// arena right after the key (a key is required unchanged only when it is first staged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    None,
    Absent,
    Present,
    Unchanged,
}

impl Need {
    /// How an entry holds `requirement`, and the digest to store after its key.
    fn of(requirement: Requirement) -> (Self, Option<[u8; DIGEST_BYTES]>) {
        match requirement {
            Requirement::None => (Self::None, None),
            Requirement::Absent => (Self::Absent, None),
            Requirement::Present => (Self::Present, None),
            Requirement::Unchanged(digest) => (Self::Unchanged, Some(digest.to_bytes())),
        }
    }
}

/// A write as an entry holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Write {
    Untouched,
    Deleted,
    Written,
}

/// What is staged for one key, as the entries hold it: 16 bytes, its written value named by
/// where it lies in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed {
    value_at: u64,
    value_len: u32,
    need: Need,
    write: Write,
}

impl Packed {
    fn new(need: Need, write: Write, value: Span) -> Self {
        Self {
            value_at: value.at,
            value_len: value.len,
            need,
            write,
        }
    }

    fn value(self) -> Span {
        Span {
            at: self.value_at,
            len: self.value_len,
        }
    }

    /// The bytes the value adds to the transaction.
    fn value_len(self) -> usize {
        match self.write {
            Write::Written => self.value_len as usize,
            Write::Untouched | Write::Deleted => 0,
        }
    }

    fn with_need(self, need: Need) -> Self {
        Self { need, ..self }
    }
}

/// The digest stored after a key, as [`Need::Unchanged`] requires it.
const DIGEST_BYTES: usize = 16;

/// What a key held in the staged writes when an insert was asked of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prior {
    /// Nothing: the insert is staged as an insert-if-absent.
    Unstaged,
    /// A delete: the insert is staged as a write over it.
    Deleted,
    /// A written value: nothing was staged.
    Written,
    /// A requirement that the key be present: nothing was staged.
    Required,
}

/// One change to a key, folded into what is staged for it.
#[derive(Debug, Clone, Copy)]
enum Step<'a> {
    Put(&'a [u8]),
    Insert(&'a [u8]),
    Delete,
    RequirePresent,
}

/// What a change did to the staged writes, so that it can be taken back: the previous states
/// of the keys it changed that were staged before it, and where the keys it created begin.
/// Keys are created at the end of the staging order and nothing is taken out while a change
/// is made, so the keys a change created are the entries from the first of them on: taking
/// them back is one truncation, and the log holds nothing per created key (nor per later
/// change to one). The bytes the change put in the arena are likewise all after where the
/// arena ended before it, and are cut off the same way.
#[derive(Debug)]
#[must_use = "an undo log does nothing unless it is applied or dropped on purpose"]
pub struct Undo {
    /// The previous states of keys staged before the change, by position (a key keeps its
    /// position while it is staged, and only the keys a change created are taken out).
    previous: Vec<(usize, Packed)>,
    /// The position of the first key the change created, if it created one.
    created_from: Option<usize>,
    /// Where the arena ended before the change, if it changed a key.
    arena_before: Option<Mark>,
    /// How many range requirements there were before the first one this change added.
    ranges_before: Option<usize>,
    /// Whether changes are recorded at all: a change that will never be taken back need not
    /// keep what it replaced.
    recording: bool,
}

impl Default for Undo {
    fn default() -> Self {
        Self::new()
    }
}

impl Undo {
    /// An empty log.
    pub fn new() -> Self {
        Self {
            previous: Vec::new(),
            created_from: None,
            arena_before: None,
            ranges_before: None,
            recording: true,
        }
    }

    /// A log that records nothing, for changes that are never taken back.
    pub fn off() -> Self {
        Self {
            recording: false,
            ..Self::new()
        }
    }

    /// A key is about to change, with the arena ending at `mark`.
    fn changing(&mut self, mark: impl FnOnce() -> Mark) {
        if self.recording && self.arena_before.is_none() {
            self.arena_before = Some(mark());
        }
    }

    /// The key at position `at` was created.
    fn created(&mut self, at: usize) {
        if self.recording {
            self.created_from.get_or_insert(at);
        }
    }

    /// The key at position `at` held `previous` before it was changed.
    fn changed(&mut self, at: usize, previous: Packed) {
        // A key this change created goes back by the truncation, whatever it holds since.
        if self.recording && self.created_from.is_none_or(|from| at < from) {
            self.previous.push((at, previous));
        }
    }

    /// Memory the log holds, in bytes.
    #[must_use]
    pub fn memory(&self) -> usize {
        self.previous.capacity() * size_of::<(usize, Packed)>()
    }

    /// Previous states recorded.
    #[cfg(test)]
    fn logged(&self) -> usize {
        self.previous.len()
    }

    /// Whether the change touched nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.previous.is_empty() && self.created_from.is_none() && self.ranges_before.is_none()
    }
}

/// Orders keys as their bytes do, eight bytes at a time: keys share long prefixes (subspace,
/// kind, table), and a comparison of whole words finds where two differ without a call per
/// comparison.
#[inline]
fn cmp_keys(mut a: &[u8], mut b: &[u8]) -> Ordering {
    while let (Some((x, rest_a)), Some((y, rest_b))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        // Big-endian words order as their bytes do.
        let (x, y) = (u64::from_be_bytes(*x), u64::from_be_bytes(*y));
        if x != y {
            return x.cmp(&y);
        }
        a = rest_a;
        b = rest_b;
    }
    a.cmp(b)
}

/// Whether `key` is inside `range`.
fn in_bounds(key: &[u8], (start, end): (Bound<&[u8]>, Bound<&[u8]>)) -> bool {
    let after_start = match start {
        Bound::Included(start) => cmp_keys(key, start) != Ordering::Less,
        Bound::Excluded(start) => cmp_keys(key, start) == Ordering::Greater,
        Bound::Unbounded => true,
    };
    let before_end = match end {
        Bound::Included(end) => cmp_keys(key, end) != Ordering::Greater,
        Bound::Excluded(end) => cmp_keys(key, end) == Ordering::Less,
        Bound::Unbounded => true,
    };
    after_start && before_end
}

/// The 24 bytes of `key` from `skip` on as big-endian words, padded with zeros: among keys
/// that share their first `skip` bytes, where two keys' heads differ, the keys order as their
/// heads do (a key that is a prefix of another pads with the least byte); where they are
/// equal, the whole keys decide.
fn head(key: &[u8], skip: usize) -> [u64; 3] {
    let rest = key.get(skip..).unwrap_or_default();
    let mut bytes = [0_u8; 24];
    let len = rest.len().min(bytes.len());
    if let (Some(to), Some(from)) = (bytes.get_mut(..len), rest.get(..len)) {
        to.copy_from_slice(from);
    }
    let word = |at: usize| {
        bytes
            .get(at..at + 8)
            .and_then(|eight| <[u8; 8]>::try_from(eight).ok())
            .map_or(0, u64::from_be_bytes)
    };
    [word(0), word(8), word(16)]
}

/// How many first bytes all of `keys` share.
fn shared_prefix<'a>(mut keys: impl Iterator<Item = &'a [u8]>) -> usize {
    let Some(first) = keys.next() else {
        return 0;
    };
    let mut shared = first.len();
    for key in keys {
        if shared == 0 {
            break;
        }
        shared = first
            .iter()
            .zip(key)
            .take(shared)
            .take_while(|(a, b)| a == b)
            .count();
    }
    shared
}

/// The key at position `at` of `entries` (none past the end).
fn key_at(entries: &Entries, at: usize) -> &[u8] {
    entries.get_index(at).map_or(&[][..], |(key, _)| key)
}

/// Positions `old` and `fresh`, each in key order, merged into one key order.
fn merge_positions(entries: &Entries, old: &[usize], fresh: Vec<usize>) -> Vec<usize> {
    let mut merged = Vec::with_capacity(old.len() + fresh.len());
    let mut old = old.iter().copied().peekable();
    for at in fresh {
        let new_key = key_at(entries, at);
        while let Some(before) =
            old.next_if(|&o| cmp_keys(key_at(entries, o), new_key) == Ordering::Less)
        {
            merged.push(before);
        }
        merged.push(at);
    }
    merged.extend(old);
    merged
}

/// The positions `at` of `entries`, in the order of their keys. The sort orders the keys'
/// heads, held beside their positions, and reads a key itself only where two heads are equal,
/// so it runs in cache rather than through the map. The heads start after the prefix every
/// key shares (the deployment's key prefix, at least): from there a row key's 24 bytes hold
/// its kind, its table and its id, and two keys' heads are almost never equal.
///
/// Of those 24 bytes, a transaction's keys differ in only a few (the kinds are few, the
/// tables' and the ids' high bytes are zero): when they differ in at most twelve, each head is
/// packed into those bytes and the packed heads are sorted by [`sort_packed`]; otherwise by
/// [`sort_by_digits`].
fn sorted_positions(
    entries: &Entries,
    at: impl ExactSizeIterator<Item = usize> + Clone,
) -> Vec<usize> {
    let key = |at: usize| key_at(entries, at);
    let skip = shared_prefix(at.clone().map(key));
    let count = at.len();
    if count < RADIX_FROM {
        let mut heads: Vec<Head> = at.map(|at| (head(key(at), skip), at)).collect();
        heads.sort_unstable_by_key(|&(head, _)| head);
        return order_of(entries, &mut heads, |a, b| a.0 == b.0, |&(_, at)| at);
    }
    // The keys are read twice more: for the bytes in which their heads differ, and to pack
    // them. (Collected, the heads would take 24 bytes a key of memory freshly mapped for them,
    // whose page faults cost more than the second read.)
    let heads = at.clone().map(|at| (head(key(at), skip), at));
    let digits = varying_digits(heads.clone().map(|(head, _)| head));
    if digits.len() <= PACKED_DIGITS && u32::try_from(entries.len()).is_ok() {
        let mut packed: Vec<u128> = heads.map(|(head, at)| pack(&head, &digits, at)).collect();
        sort_packed(&mut packed, &mut vec![0; count]);
        return order_of(
            entries,
            &mut packed,
            |a, b| a >> 32 == b >> 32,
            |&item| unpack(item),
        );
    }
    let mut heads: Vec<Head> = heads.collect();
    sort_by_digits(&mut heads, &digits);
    order_of(entries, &mut heads, |a, b| a.0 == b.0, |&(_, at)| at)
}

/// The positions of `sorted` (heads in order, whose runs of equal heads `same_head` finds,
/// each holding the position `at` gives) in key order: a run of equal heads is ordered by
/// its whole keys. The order is a fresh vector: collected from `sorted` in place, it would
/// keep that larger allocation for as long as the writes are staged.
fn order_of<T>(
    entries: &Entries,
    sorted: &mut [T],
    same_head: impl FnMut(&T, &T) -> bool,
    at: impl Fn(&T) -> usize,
) -> Vec<usize> {
    for run in sorted.chunk_by_mut(same_head) {
        if run.len() > 1 {
            run.sort_unstable_by(|a, b| cmp_keys(key_at(entries, at(a)), key_at(entries, at(b))));
        }
    }
    let mut order = Vec::with_capacity(sorted.len());
    order.extend(sorted.iter().map(at));
    order
}

/// A key's head and its position among the staged keys.
type Head = ([u64; 3], usize);

/// From how many keys a seal sorts their heads by radix rather than by comparison.
const RADIX_FROM: usize = 2_048;
/// From how many heads a bucket of the radix sort is sorted by its next byte rather than by
/// comparison: below it, counting 256 buckets costs more than comparing.
const RADIX_RUN_FROM: usize = 256;
/// Most bytes in which heads may differ for them to be sorted packed: 96 bits beside a 32-bit
/// position.
const PACKED_DIGITS: usize = 12;

/// The bytes in which some two of `heads` differ, most significant first, as (word, shift)
/// within a head: word by word, each from its high byte.
fn varying_digits(mut heads: impl Iterator<Item = [u64; 3]>) -> Vec<(usize, u32)> {
    let Some(first) = heads.next() else {
        return Vec::new();
    };
    let mut varying = [0_u64; 3];
    for head in heads {
        for (bits, (word, first)) in varying.iter_mut().zip(head.iter().zip(first)) {
            *bits |= word ^ first;
        }
    }
    varying
        .iter()
        .enumerate()
        .flat_map(|(word, bits)| {
            (0..64_u32)
                .step_by(8)
                .rev()
                .filter(move |shift| (bits >> shift) & 0xff != 0)
                .map(move |shift| (word, shift))
        })
        .collect()
}

/// `head`'s bytes at `digits` (at most [`PACKED_DIGITS`]), packed above the low 32 bits in the
/// same order, and the position `at` (below 2³², as every position of the staged keys is) in
/// the low 32: packed heads order as the heads do, since the heads are equal in every other
/// byte.
fn pack(head: &[u64; 3], digits: &[(usize, u32)], at: usize) -> u128 {
    let packed = digits.iter().fold(0_u128, |packed, &(word, shift)| {
        (packed << 8) | u128::from((head.get(word).copied().unwrap_or_default() >> shift) & 0xff)
    });
    (packed << 32) | (at as u128 & u128::from(u32::MAX))
}

/// The position a packed head holds.
#[allow(
    clippy::cast_possible_truncation,
    reason = "the low 32 bits hold a position"
)]
fn unpack(item: u128) -> usize {
    item as u32 as usize
}

/// Sorts packed heads by the bytes above their positions: a radix sort least significant
/// byte first over the bytes in which the heads differ, each pass one stable move of every
/// head into a second buffer (`scratch`, as long as `items`), reading and writing in order
/// where a sort most significant byte first swaps heads into 256 places scattered over the
/// run. Heads that differ in more than [`LSD_PASSES`] bytes are first split by their most
/// significant differing byte, and each part sorted so in turn: a transaction's kinds of keys
/// differ in different bytes (a row's table and id, an index entry's id), and apart they
/// differ in few. The two buffers of 16-byte packed heads hold what the 32-byte unpacked heads
/// with their positions alone would.
fn sort_packed(items: &mut [u128], scratch: &mut [u128]) {
    if items.len() < RADIX_RUN_FROM {
        items.sort_unstable();
        return;
    }
    let Some(&first) = items.first() else {
        return;
    };
    let varying = items
        .iter()
        .fold(0_u128, |bits, &item| bits | (item ^ first))
        >> 32;
    let bytes: Vec<u32> = (0_u32..)
        .take(PACKED_DIGITS)
        .filter(|&byte| (varying >> (8 * byte)) & 0xff != 0)
        .collect();
    let Some(scratch) = scratch.get_mut(..items.len()) else {
        return;
    };
    match bytes.last() {
        // Equal heads: their keys decide, as the caller sorts them.
        None => {}
        Some(&top) if bytes.len() > LSD_PASSES => {
            let (starts, ends) = scatter(items, scratch, top);
            items.copy_from_slice(scratch);
            let parts: Vec<(usize, usize)> = starts
                .into_iter()
                .zip(ends)
                .filter(|&(start, end)| end - start > 1)
                .collect();
            if items.len() >= PARALLEL_FROM {
                sort_parts_on_two_threads(items, scratch, &parts);
            } else {
                sort_parts(items, scratch, &parts, 0);
            }
        }
        Some(_) => {
            let mut in_scratch = false;
            for &byte in &bytes {
                if in_scratch {
                    scatter(scratch, items, byte);
                } else {
                    scatter(items, scratch, byte);
                }
                in_scratch = !in_scratch;
            }
            if in_scratch {
                items.copy_from_slice(scratch);
            }
        }
    }
}

/// Most bytes a part's heads may differ in to be sorted least significant byte first.
const LSD_PASSES: usize = 6;

/// From how many heads the parts of a split are sorted on two threads. A seal that large is
/// a commit's (or a view's) of a bulk load, which its client waits for with nothing else to
/// do, so that the second core is free (for a commit, but for the log write beside it).
const PARALLEL_FROM: usize = 1 << 16;

/// Sorts the `parts` (start and end, past `offset`) of `items` by [`sort_packed`].
fn sort_parts(items: &mut [u128], scratch: &mut [u128], parts: &[(usize, usize)], offset: usize) {
    for &(start, end) in parts {
        let range = start - offset..end - offset;
        if let (Some(part), Some(scratch)) = (items.get_mut(range.clone()), scratch.get_mut(range))
        {
            sort_packed(part, scratch);
        }
    }
}

/// [`sort_parts`] with the parts divided in two runs of about as many heads, the first sorted
/// on a thread of its own (or on this one, if none can be started).
fn sort_parts_on_two_threads(items: &mut [u128], scratch: &mut [u128], parts: &[(usize, usize)]) {
    let half = items.len() / 2;
    let split = parts.partition_point(|&(_, end)| end <= half);
    let (first, second) = parts.split_at(split);
    let mid = first.last().map_or(0, |&(_, end)| end);
    let (items_first, items_second) = items.split_at_mut(mid);
    let (scratch_first, scratch_second) = scratch.split_at_mut(mid);
    // Taken by the thread, or by this one if no thread could be started.
    let first_job = Mutex::new(Some((items_first, scratch_first)));
    let run_first = || {
        let job = first_job
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some((items, scratch)) = job {
            sort_parts(items, scratch, first, 0);
        }
    };
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("moraine-seal".into())
            .spawn_scoped(scope, run_first);
        sort_parts(items_second, scratch_second, second, mid);
        if let Err(err) = spawned {
            tracing::debug!(%err, "no second thread for the seal's sort; sorting on this one");
            run_first();
        }
    });
}

/// Moves `from` into `to` (as long), stably, in the order of the packed heads' byte `byte`;
/// returns where each byte's heads start and end.
#[allow(
    clippy::cast_possible_truncation,
    reason = "a digit is one byte of the packed head"
)]
fn scatter(from: &[u128], to: &mut [u128], byte: u32) -> ([usize; 256], [usize; 256]) {
    let digit = |item: u128| usize::from((item >> (32 + 8 * byte)) as u8);
    let mut counts = [0_usize; 256];
    for &item in from {
        if let Some(count) = counts.get_mut(digit(item)) {
            *count += 1;
        }
    }
    let mut starts = [0_usize; 256];
    let mut total = 0;
    for (start, count) in starts.iter_mut().zip(counts) {
        *start = total;
        total += count;
    }
    let mut next = starts;
    for &item in from {
        if let Some(place) = next.get_mut(digit(item))
            && let Some(slot) = to.get_mut(*place)
        {
            *slot = item;
            *place += 1;
        }
    }
    (starts, next)
}

/// Sorts `heads` in place by their bytes at `digits` (the bytes in which some two differ,
/// most significant first), for heads that differ in too many bytes to be packed: a radix
/// sort most significant byte first, with no second buffer. Each pass counts one byte of a
/// run of heads and moves every head of the run to its byte's bucket by swaps, then sorts
/// each bucket by the next byte; a run shorter than [`RADIX_RUN_FROM`] is sorted by
/// comparison.
fn sort_by_digits(heads: &mut [Head], digits: &[(usize, u32)]) {
    if heads.len() < RADIX_RUN_FROM {
        heads.sort_unstable_by_key(|&(head, _)| head);
        return;
    }
    let Some((&(word, shift), rest)) = digits.split_first() else {
        return;
    };
    let digit = |(head, _): &Head| {
        let [.., low] = (head.get(word).copied().unwrap_or_default() >> shift).to_be_bytes();
        usize::from(low)
    };
    let mut ends = [0_usize; 256];
    for head in &*heads {
        if let Some(count) = ends.get_mut(digit(head)) {
            *count += 1;
        }
    }
    if ends.contains(&heads.len()) {
        // One bucket holds the whole run: on to the next byte.
        sort_by_digits(heads, rest);
        return;
    }
    let mut starts = [0_usize; 256];
    let mut total = 0;
    for (start, end) in starts.iter_mut().zip(&mut ends) {
        *start = total;
        total += *end;
        *end = total;
    }
    // Each bucket fills from its start: a head found in another's place is swapped into the
    // next free place of its own bucket, and the head it displaced is looked at in turn.
    let mut next = starts;
    for bucket in 0..256 {
        while let (Some(&at), Some(&end)) = (next.get(bucket), ends.get(bucket)) {
            if at >= end {
                break;
            }
            let Some(home) = heads.get(at).map(digit) else {
                break;
            };
            if home == bucket {
                if let Some(at) = next.get_mut(bucket) {
                    *at += 1;
                }
            } else if let Some(place) = next.get_mut(home) {
                heads.swap(at, *place);
                *place += 1;
            }
        }
    }
    for (&start, &end) in starts.iter().zip(&ends) {
        if end - start > 1
            && let Some(run) = heads.get_mut(start..end)
        {
            sort_by_digits(run, rest);
        }
    }
}

/// The staged keys, hashed: a staged change finds its key in one probe, however many keys
/// the transaction holds. (An ordered map costs a descent through a tree of cache misses per
/// change, which was most of a bulk load's staging.)
type Entries = Slots<Packed>;

/// The staged writes of one transaction: one [`Staged`] per key.
///
/// The keys and written values are copied into an arena the entries own, in chunks that are
/// appended to and never moved: an entry is 32 bytes beside its key and value (a handle to
/// shared bytes per key and per value made it 88), and a change taken back gives its bytes
/// back.
///
/// Keys are held in a hash map in the order they were first staged, and their key order is
/// kept apart as positions into it: [`seal`](Self::seal) sorts the keys staged since the last
/// seal and merges them into that order, so that a transaction pays for ordering once per
/// key, when it is next read in order (a view of the transaction, a range it holds, the
/// commit), not per change. Reads in key order are right whether or not the writes are
/// sealed; unsealed keys are sorted for each such read.
#[derive(Debug, Clone, Default)]
pub struct StagedWrites {
    entries: Entries,
    /// Positions into `entries` of the keys `0..sealed`, in key order.
    order: Vec<usize>,
    /// How many of the first keys of `entries` `order` holds; the rest are unsealed.
    sealed: usize,
    /// Ranges that must be unchanged at the commit.
    ranges: Vec<RangeRequirement>,
    /// Key and value bytes of every entry, and the bounds of every range requirement.
    bytes: usize,
    /// The store version every requirement was read at, when the writer read them all from
    /// one snapshot that has one ([`KvSnapshot::version`](super::KvSnapshot::version)).
    read_at: Option<u64>,
}

/// The key order of staged writes, worked out apart from them ([`StagedWrites::order_to_seal`]).
#[derive(Debug)]
pub struct KeyOrder {
    positions: Vec<usize>,
}

/// The same keys in the same states, the same range requirements, read at the same version:
/// whatever order the keys were staged in and whether or not they are sealed.
impl PartialEq for StagedWrites {
    fn eq(&self, other: &Self) -> bool {
        self.entries.len() == other.entries.len()
            && self
                .entries
                .spans()
                .map(|(key, packed)| self.view(key, packed))
                .all(|(key, staged)| other.get(key) == Some(staged))
            && self.ranges == other.ranges
            && self.bytes == other.bytes
            && self.read_at == other.read_at
    }
}

impl Eq for StagedWrites {}

impl StagedWrites {
    /// Nothing staged.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Nothing staged yet, by a writer that states, in every requirement it makes, what the
    /// snapshot of store version `version` held (`None`: no such version, or requirements
    /// not all read from one). A backend that numbers its commits then need not check a
    /// requirement on a key no commit after that version wrote: it still holds.
    #[must_use]
    pub fn read_at(version: Option<u64>) -> Self {
        Self {
            read_at: version,
            ..Self::default()
        }
    }

    /// The store version the requirements were read at, if one.
    #[must_use]
    pub fn read_version(&self) -> Option<u64> {
        self.read_at
    }

    /// Keys staged since the last seal.
    #[must_use]
    pub fn unsealed(&self) -> usize {
        self.entries.len() - self.sealed
    }

    /// Whether every key is in the key order, so that reads in order cost nothing more.
    #[must_use]
    pub fn is_sealed(&self) -> bool {
        self.sealed == self.entries.len()
    }

    /// Brings every key staged since the last seal into the key order: they are sorted, and
    /// merged with the keys already in order. Costs the new keys' sort and one pass over the
    /// order; nothing when nothing was staged since.
    pub fn seal(&mut self) {
        if let Some(order) = self.order_to_seal() {
            self.seal_with(order);
        }
    }

    /// Seals `writes` unless they are sealed, copying them first only if another handle (a view
    /// of the transaction) still shares them.
    pub fn seal_shared(writes: &mut Arc<StagedWrites>) {
        if !writes.is_sealed() {
            Arc::make_mut(writes).seal();
        }
    }

    /// The key order [`seal`](Self::seal) would bring the writes to, worked out without
    /// changing them, so that it can be done while something else reads them (a backend's
    /// log write); [`seal_with`](Self::seal_with) then seals them with it at no further cost.
    /// `None` when they are sealed.
    #[must_use]
    pub fn order_to_seal(&self) -> Option<KeyOrder> {
        if self.is_sealed() {
            return None;
        }
        let entries = &self.entries;
        let fresh = sorted_positions(entries, self.sealed..entries.len());
        let positions = if self.order.is_empty() {
            fresh
        } else {
            merge_positions(entries, &self.order, fresh)
        };
        Some(KeyOrder { positions })
    }

    /// Seals the writes with `order`, which [`order_to_seal`](Self::order_to_seal) worked out
    /// from them as they are. An order that does not cover them (they changed since, or it is
    /// another's) is set aside, and they are sealed afresh.
    pub fn seal_with(&mut self, order: KeyOrder) {
        if order.positions.len() == self.entries.len() {
            self.order = order.positions;
            self.sealed = self.entries.len();
        } else {
            self.seal();
        }
    }

    /// Positions of the entries whose keys are in `range`, in key order: a part of the key
    /// order itself when every key is in it, so that a reader that takes a few entries off
    /// the front of a large range (a scan's page) pays for those, not for the whole range.
    fn positions_in(&self, range: (Bound<&[u8]>, Bound<&[u8]>)) -> Cow<'_, [usize]> {
        let entries = &self.entries;
        let key = |at: usize| key_at(entries, at);
        let lo = match range.0 {
            Bound::Included(start) => self
                .order
                .partition_point(|&at| cmp_keys(key(at), start) == Ordering::Less),
            Bound::Excluded(start) => self
                .order
                .partition_point(|&at| cmp_keys(key(at), start) != Ordering::Greater),
            Bound::Unbounded => 0,
        };
        let hi = match range.1 {
            Bound::Included(end) => self
                .order
                .partition_point(|&at| cmp_keys(key(at), end) != Ordering::Greater),
            Bound::Excluded(end) => self
                .order
                .partition_point(|&at| cmp_keys(key(at), end) == Ordering::Less),
            Bound::Unbounded => self.order.len(),
        };
        let sealed = self.order.get(lo..hi.max(lo)).unwrap_or_default();
        if self.is_sealed() {
            return Cow::Borrowed(sealed);
        }
        // Keys staged since the last seal: those in the range, sorted, merged in.
        let fresh: Vec<usize> = (self.sealed..entries.len())
            .filter(|&at| {
                entries
                    .get_index(at)
                    .is_some_and(|(key, _)| in_bounds(key, range))
            })
            .collect();
        Cow::Owned(merge_positions(
            entries,
            sealed,
            sorted_positions(entries, fresh.into_iter()),
        ))
    }

    /// The key of the entry whose key is at `key` in the arena, and what the entry holds, as
    /// read: its requirement (with the digest stored after the key) and its value.
    fn view(&self, key: Span, packed: Packed) -> (&[u8], Staged<'_>) {
        let arena = self.entries.arena();
        let requirement = match packed.need {
            Need::None => Requirement::None,
            Need::Absent => Requirement::Absent,
            Need::Present => Requirement::Present,
            Need::Unchanged => Requirement::Unchanged(Digest::from_bytes(
                arena
                    .get(key, DIGEST_BYTES)
                    .get(key.len()..)
                    .unwrap_or_default(),
            )),
        };
        let write = self.write_of(packed);
        (arena.get(key, 0), Staged { requirement, write })
    }

    /// What an entry leaves at its key: `Some(Some(value))` written, `Some(None)` deleted,
    /// `None` untouched, as [`Staged::write`] and [`read`](Self::read) say it.
    #[allow(
        clippy::option_option,
        reason = "the three states of `Staged::write`, which this decodes"
    )]
    fn write_of(&self, packed: Packed) -> Option<Option<&[u8]>> {
        match packed.write {
            Write::Untouched => None,
            Write::Deleted => Some(None),
            Write::Written => Some(Some(self.entries.arena().get(packed.value(), 0))),
        }
    }

    /// The entry at position `at`, as read.
    fn entry_at(&self, at: usize) -> Option<(&[u8], Staged<'_>)> {
        let (key, packed) = self.entries.span_at(at)?;
        Some(self.view(key, packed))
    }

    /// The entries at `positions`, read as they are taken.
    fn at<'a>(
        &'a self,
        positions: Cow<'a, [usize]>,
    ) -> impl DoubleEndedIterator<Item = (&'a [u8], Staged<'a>)> + 'a {
        (0..positions.len()).filter_map(move |i| positions.get(i).and_then(|&at| self.entry_at(at)))
    }

    /// Every entry, in key order.
    fn ordered(&self) -> impl DoubleEndedIterator<Item = (&[u8], Staged<'_>)> {
        let all = if self.is_sealed() {
            None
        } else {
            Some(self.positions_in((Bound::Unbounded, Bound::Unbounded)))
        };
        let sealed = all
            .is_none()
            .then(|| self.order.iter().filter_map(|&at| self.entry_at(at)));
        sealed
            .into_iter()
            .flatten()
            .chain(all.into_iter().flat_map(|positions| self.at(positions)))
    }

    /// After the keys from position `at` on were taken out: if one was in the key order,
    /// forgets the order, and the next seal sorts every key again. A change taken back
    /// removes the keys it created, which are past the order unless the writes were sealed
    /// in the middle of it.
    fn unseal_from(&mut self, at: usize) {
        if at < self.sealed {
            self.order.clear();
            self.sealed = 0;
        }
    }

    /// Whether these writes change something `reader` requires: a key it requires something
    /// of, or a key inside a range it requires unchanged. When they do not, what `reader`
    /// requires holds after them if it held before them.
    #[must_use]
    pub fn disturbs(&self, reader: &StagedWrites) -> bool {
        let required = |packed: &Packed| packed.need != Need::None;
        let point = if self.entries.len() <= reader.entries.len() {
            self.entries
                .iter()
                .filter(|(_, packed)| packed.write != Write::Untouched)
                .any(|(key, _)| reader.entries.get(key).is_some_and(required))
        } else {
            reader
                .entries
                .iter()
                .filter(|(_, packed)| required(packed))
                .any(|(key, _)| self.read(key).is_some())
        };
        point
            || reader
                .ranges
                .iter()
                .any(|required| self.written_in(&required.range).next().is_some())
    }

    /// Makes room for `additional` more keys at once, so that a batch known to stage that
    /// many grows the table once rather than a doubling at a time.
    pub fn reserve(&mut self, additional: usize) {
        self.entries.reserve(additional);
    }

    /// Keys touched.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no key is touched.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Key and value bytes staged.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Memory the staged writes hold, in bytes: their entries, hash table, key order and
    /// the arena of their keys and values (with what changes since replaced).
    #[must_use]
    pub fn memory(&self) -> usize {
        self.entries.memory()
            + self.order.capacity() * size_of::<usize>()
            + self
                .ranges
                .iter()
                .map(|r| r.range.start.len() + r.range.end.len())
                .sum::<usize>()
    }

    /// The key at position `at` among the staged keys, as
    /// [`insert_new`](Self::insert_new) reported it.
    #[must_use]
    pub fn key_at(&self, at: usize) -> Option<&[u8]> {
        self.entries.get_index(at).map(|(key, _)| key)
    }

    /// What is staged for `key`.
    #[must_use]
    pub fn get(&self, key: &[u8]) -> Option<Staged<'_>> {
        self.entry_at(self.entries.index_of(key)?)
            .map(|(_, staged)| staged)
    }

    /// What a read of `key` through the transaction sees, where the transaction decides it:
    /// `Some(Some(value))` written, `Some(None)` deleted; `None` means "as in the store".
    #[must_use]
    pub fn read(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.write_of(*self.entries.get(key)?)
    }

    /// The keys of `range` the transaction writes or deletes, in key order, with what it
    /// leaves there. Keys only required are left out.
    #[must_use]
    pub fn written(
        &self,
        range: (Bound<&[u8]>, Bound<&[u8]>),
    ) -> impl DoubleEndedIterator<Item = (&[u8], Option<&[u8]>)> {
        let positions = self.positions_in(range);
        (0..positions.len()).filter_map(move |i| {
            let (key, packed) = self.entries.span_at(*positions.get(i)?)?;
            self.written_pair(key, packed)
        })
    }

    /// Every key written or deleted, with what the transaction leaves there, in the order
    /// the keys were first staged: for a reader that needs each key once but not their order
    /// (a log record), which then reads the entries in the order they lie in memory.
    pub fn written_unordered(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.entries
            .spans()
            .filter_map(|(key, packed)| self.written_pair(key, packed))
    }

    /// The key whose span is `key` and what the transaction leaves there, if it writes or
    /// deletes it: a pair read without the requirement.
    fn written_pair(&self, key: Span, packed: Packed) -> Option<(&[u8], Option<&[u8]>)> {
        let value = self.write_of(packed)?;
        Some((self.entries.arena().get(key, 0), value))
    }

    /// The keys of `range` written or deleted, as [`written`](Self::written).
    #[must_use]
    pub fn written_in(
        &self,
        range: &KeyRange,
    ) -> impl DoubleEndedIterator<Item = (&[u8], Option<&[u8]>)> {
        self.written((
            Bound::Included(range.start.as_slice()),
            Bound::Excluded(range.end.as_slice()),
        ))
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Staged<'_>)> {
        self.ordered()
    }

    /// The ranges that must be unchanged at the commit, in the order they were required.
    #[must_use]
    pub fn ranges(&self) -> &[RangeRequirement] {
        &self.ranges
    }

    /// Whether a commit must check anything in the store before it applies.
    #[must_use]
    pub fn has_requirements(&self) -> bool {
        !self.ranges.is_empty()
            || self
                .entries
                .values()
                .any(|packed| packed.need != Need::None)
    }

    /// Requires `key` to be in `requirement`'s state at the commit, writing nothing, unless
    /// the transaction already decided the key (wrote it or required something of it): then
    /// what it decided stands. Callers state what the snapshot showed before they write a
    /// stored record (an update, a delete) or when they depend on a key they do not write.
    ///
    /// # Errors
    /// [`KvError::KeyTooLarge`] for a key of 4 GiB or more.
    pub fn require(
        &mut self,
        key: impl AsRef<[u8]>,
        requirement: Requirement,
        undo: &mut Undo,
    ) -> Result<(), KvError> {
        let key = key.as_ref();
        if let Lookup::Absent(hash) = self.entries.lookup(key) {
            let write = None;
            self.add(hash, key, Staged { requirement, write }, undo)?;
        }
        Ok(())
    }

    /// Requires `range` to hold, at the commit, exactly the pairs whose digest is `digest`:
    /// those of the transaction's snapshot.
    pub fn require_range(&mut self, range: KeyRange, digest: Digest, undo: &mut Undo) {
        if undo.recording {
            undo.ranges_before.get_or_insert(self.ranges.len());
        }
        self.bytes += range.start.len() + range.end.len();
        self.ranges.push(RangeRequirement { range, digest });
    }

    /// The first requirement these writes make that the store does not meet, as a conflict.
    /// `value` reads a key's current value and `range` the current pairs of a range, in key
    /// order, handing them to the function it is given; both see the store as the commit
    /// would find it.
    ///
    /// # Errors
    /// The first error of `value` or `range`.
    pub fn first_unmet<E, V: AsRef<[u8]>>(
        &self,
        mut value: impl FnMut(&[u8]) -> Result<Option<V>, E>,
        mut range: impl FnMut(&KeyRange, &mut dyn FnMut(&[u8], &[u8])) -> Result<(), E>,
    ) -> Result<Option<Conflict>, E> {
        for (key, staged) in self.ordered() {
            let unmet = match staged.requirement {
                Requirement::None => continue,
                Requirement::Absent => value(key)?
                    .is_some()
                    .then(|| Conflict::AlreadyExists { key: key.to_vec() }),
                Requirement::Present => value(key)?
                    .is_none()
                    .then(|| Conflict::Missing { key: key.to_vec() }),
                Requirement::Unchanged(digest) => match value(key)? {
                    None => Some(Conflict::Missing { key: key.to_vec() }),
                    Some(now) => (Digest::of_value(now.as_ref()) != digest)
                        .then(|| Conflict::Changed { key: key.to_vec() }),
                },
            };
            if unmet.is_some() {
                return Ok(unmet);
            }
        }
        for required in &self.ranges {
            let mut digester = Digester::new();
            range(&required.range, &mut |key, value| digester.pair(key, value))?;
            if digester.finish() != required.digest {
                return Ok(Some(Conflict::RangeChanged {
                    start: required.range.start.clone(),
                    end: required.range.end.clone(),
                }));
            }
        }
        Ok(None)
    }

    /// Stages `key = value` whatever was there.
    ///
    /// # Errors
    /// [`KvError::KeyTooLarge`] or [`KvError::ValueTooLarge`] for a key or value of 4 GiB or
    /// more.
    pub fn put(
        &mut self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        undo: &mut Undo,
    ) -> Result<(), KvError> {
        self.step(key.as_ref(), Step::Put(value.as_ref()), undo)
    }

    /// Stages `key = value`, requiring the key to be absent unless this transaction already
    /// deleted it.
    ///
    /// # Errors
    /// [`KvError::ContradictoryWriteSet`] when the transaction already wrote the key; as
    /// [`put`](Self::put).
    pub fn insert(
        &mut self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        undo: &mut Undo,
    ) -> Result<(), KvError> {
        self.step(key.as_ref(), Step::Insert(value.as_ref()), undo)
    }

    /// Stages `key = value` unless the transaction already wrote the key or requires it to
    /// be present, in one look-up; says which, and where the key is among the staged keys
    /// (its place stays the same for as long as the key is staged: see
    /// [`rewrite_at`](Self::rewrite_at)).
    ///
    /// # Errors
    /// As [`put`](Self::put).
    pub fn insert_new(
        &mut self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        undo: &mut Undo,
    ) -> Result<(Prior, usize), KvError> {
        let (key, value) = (key.as_ref(), value.as_ref());
        match self.entries.lookup(key) {
            Lookup::Absent(hash) => {
                let staged = Staged {
                    requirement: Requirement::Absent,
                    write: Some(Some(value)),
                };
                Ok((Prior::Unstaged, self.add(hash, key, staged, undo)?))
            }
            Lookup::At(at) => {
                let Some((_, previous)) = self.entries.span_at(at) else {
                    return Ok((Prior::Unstaged, at));
                };
                let prior = match (previous.write, previous.need) {
                    // Only a check that the key is absent: the insert makes it one.
                    (Write::Untouched, Need::Absent) => Prior::Unstaged,
                    // Deleted here: written over, with what the store must hold unchanged.
                    (Write::Deleted, _) => Prior::Deleted,
                    (Write::Written, _) => return Ok((Prior::Written, at)),
                    (Write::Untouched, _) => return Ok((Prior::Required, at)),
                };
                undo.changing(|| self.entries.arena().mark());
                let value_span = self.push_value(key, value)?;
                self.replace(
                    at,
                    Packed::new(previous.need, Write::Written, value_span),
                    undo,
                );
                Ok((prior, at))
            }
        }
    }

    /// Stages `key`, absent with hash `hash`, as `staged` says, at the next position, which
    /// it returns: its value and key (with the digest of an unchanged requirement after it)
    /// go into the arena.
    fn add(
        &mut self,
        hash: Hash,
        key: &[u8],
        staged: Staged<'_>,
        undo: &mut Undo,
    ) -> Result<usize, KvError> {
        undo.changing(|| self.entries.arena().mark());
        let (write, span) = match staged.write {
            None => (Write::Untouched, Span::default()),
            Some(None) => (Write::Deleted, Span::default()),
            Some(Some(value)) => (Write::Written, self.push_value(key, value)?),
        };
        let (need, digest) = Need::of(staged.requirement);
        let packed = Packed::new(need, write, span);
        let trailer = digest.as_ref().map_or(&[][..], |digest| &digest[..]);
        let at = self
            .entries
            .push(hash, key, trailer, packed)
            .map_err(|full| refused(full, self.entries.len(), self.bytes))?;
        undo.created(at);
        self.bytes += key.len() + packed.value_len();
        Ok(at)
    }

    /// Copies `value`, `key`'s, into the arena.
    fn push_value(&mut self, key: &[u8], value: &[u8]) -> Result<Span, KvError> {
        self.entries
            .arena_mut()
            .push(value)
            .map_err(|len| value_too_large(key, len))
    }

    /// Sets the entry at `at` to `next`, keeping the byte count and recording what it held
    /// in `undo`.
    fn replace(&mut self, at: usize, next: Packed, undo: &mut Undo) {
        if let Some(slot) = self.entries.value_mut(at) {
            let previous = mem::replace(slot, next);
            self.bytes -= previous.value_len();
            self.bytes += next.value_len();
            undo.changed(at, previous);
        }
    }

    /// Replaces the value the transaction wrote at `key` with what `rewrite` makes of it, in
    /// one look-up. Returns whether the key held a written value; `rewrite` may leave it as it
    /// is by returning `None`.
    ///
    /// # Errors
    /// `rewrite`'s error, or a new value of 4 GiB or more; nothing is changed then.
    pub fn rewrite<E: From<KvError>, V: AsRef<[u8]>>(
        &mut self,
        key: &[u8],
        undo: &mut Undo,
        rewrite: impl FnOnce(&[u8]) -> Result<Option<V>, E>,
    ) -> Result<bool, E> {
        match self.entries.index_of(key) {
            Some(at) => self.rewrite_at(at, undo, rewrite),
            None => Ok(false),
        }
    }

    /// As [`rewrite`](Self::rewrite), for the key at position `at` among the staged keys, as
    /// [`insert_new`](Self::insert_new) reported it: no hashing and no probe, which for a
    /// large transaction's keys is a cache miss or two each. A staged key keeps its position
    /// until a change that created it is taken back; `at` past the staged keys is no key.
    ///
    /// # Errors
    /// As [`rewrite`](Self::rewrite).
    pub fn rewrite_at<E: From<KvError>, V: AsRef<[u8]>>(
        &mut self,
        at: usize,
        undo: &mut Undo,
        rewrite: impl FnOnce(&[u8]) -> Result<Option<V>, E>,
    ) -> Result<bool, E> {
        let Some((key, packed)) = self.entries.span_at(at) else {
            return Ok(false);
        };
        if packed.write != Write::Written {
            return Ok(false);
        }
        let Some(new) = rewrite(self.entries.arena().get(packed.value(), 0))? else {
            return Ok(true);
        };
        undo.changing(|| self.entries.arena().mark());
        let span = self
            .entries
            .arena_mut()
            .push(new.as_ref())
            .map_err(|len| value_too_large(self.entries.arena().get(key, 0), len))?;
        self.replace(at, Packed::new(packed.need, Write::Written, span), undo);
        Ok(true)
    }

    /// Stages the removal of `key`, if present.
    ///
    /// # Errors
    /// [`KvError::KeyTooLarge`] for a key of 4 GiB or more.
    pub fn delete(&mut self, key: impl AsRef<[u8]>, undo: &mut Undo) -> Result<(), KvError> {
        self.step(key.as_ref(), Step::Delete, undo)
    }

    /// Requires `key` to be present at the commit, unless the transaction writes it itself.
    ///
    /// # Errors
    /// [`KvError::ContradictoryWriteSet`] when the transaction deleted the key; as
    /// [`delete`](Self::delete).
    pub fn require_present(
        &mut self,
        key: impl AsRef<[u8]>,
        undo: &mut Undo,
    ) -> Result<(), KvError> {
        self.step(key.as_ref(), Step::RequirePresent, undo)
    }

    /// Stages one [`Mutation`].
    ///
    /// # Errors
    /// As the change it is.
    pub fn apply(&mut self, mutation: Mutation, undo: &mut Undo) -> Result<(), KvError> {
        match mutation {
            Mutation::Put { key, value } => self.put(key, value, undo),
            Mutation::Insert { key, value } => self.insert(key, value, undo),
            Mutation::Delete { key } => self.delete(key, undo),
            Mutation::RequirePresent { key } => self.require_present(key, undo),
            Mutation::RequireAbsent { key } => self.require(key, Requirement::Absent, undo),
            Mutation::RequireUnchanged { key, digest } => {
                self.require(key, Requirement::Unchanged(digest), undo)
            }
            Mutation::RequireRange { range, digest } => {
                self.require_range(range, digest, undo);
                Ok(())
            }
        }
    }

    /// Takes back every change `undo` recorded, newest first, and gives back the arena bytes
    /// the changes added.
    pub fn undo(&mut self, undo: Undo) {
        if let Some(before) = undo.ranges_before {
            for range in self.ranges.drain(before..) {
                self.bytes -= range.range.start.len() + range.range.end.len();
            }
        }
        // The keys staged before the change, newest change first so that a key changed twice
        // ends as it was before the first; then the keys it created, from the end.
        for (at, previous) in undo.previous.into_iter().rev() {
            if let Some(now) = self.entries.value_mut(at) {
                let now = mem::replace(now, previous);
                self.bytes += previous.value_len();
                self.bytes -= now.value_len();
            }
        }
        if let Some(from) = undo.created_from {
            let mut removed = 0;
            self.entries
                .truncate(from, |key, now| removed += key.len() + now.value_len());
            self.bytes -= removed;
            self.unseal_from(from);
        }
        // Every entry left names bytes from before the change: what it held then.
        if let Some(mark) = undo.arena_before {
            self.entries.arena_mut().truncate(mark);
        }
    }

    /// Folds a change of `key` into what is staged for it. The state the key is in at this
    /// point is known when the transaction wrote it; otherwise it is the store's.
    fn step(&mut self, key: &[u8], step: Step<'_>, undo: &mut Undo) -> Result<(), KvError> {
        match self.entries.lookup(key) {
            Lookup::Absent(hash) => {
                let (requirement, write) = match step {
                    Step::Put(value) => (Requirement::None, Some(Some(value))),
                    Step::Insert(value) => (Requirement::Absent, Some(Some(value))),
                    Step::Delete => (Requirement::None, Some(None)),
                    Step::RequirePresent => (Requirement::Present, None),
                };
                self.add(hash, key, Staged { requirement, write }, undo)?;
            }
            Lookup::At(at) => {
                let Some((_, now)) = self.entries.span_at(at) else {
                    return Ok(());
                };
                let contradiction = |reason| KvError::ContradictoryWriteSet {
                    key: key.to_vec(),
                    reason,
                };
                let present_here = match (now.write, now.need) {
                    (Write::Written, _) | (Write::Untouched, Need::Present | Need::Unchanged) => {
                        Some(true)
                    }
                    (Write::Deleted, _) | (Write::Untouched, Need::Absent) => Some(false),
                    (Write::Untouched, Need::None) => None,
                };
                let need = match (step, present_here) {
                    (Step::Insert(_), Some(true)) => {
                        return Err(contradiction("inserted after it was written"));
                    }
                    (Step::RequirePresent, Some(false)) => {
                        return Err(contradiction("required after it was deleted"));
                    }
                    (Step::Insert(_), None) => Need::Absent,
                    (Step::RequirePresent, None) => Need::Present,
                    _ => now.need,
                };
                undo.changing(|| self.entries.arena().mark());
                let next = match step {
                    Step::Put(value) | Step::Insert(value) => {
                        Packed::new(need, Write::Written, self.push_value(key, value)?)
                    }
                    Step::Delete => Packed::new(need, Write::Deleted, Span::default()),
                    Step::RequirePresent => now.with_need(need),
                };
                self.replace(at, next, undo);
            }
        }
        Ok(())
    }

    /// Checks the limits a store puts on one commit.
    ///
    /// # Errors
    /// [`KvError::WriteSetTooLarge`], [`KvError::KeyTooLarge`] or [`KvError::ValueTooLarge`].
    pub(crate) fn check(&self, limits: &StoreLimits) -> Result<(), KvError> {
        let ops = self.entries.len();
        if ops > limits.max_write_set_ops || self.bytes > limits.max_write_set_bytes {
            return Err(KvError::WriteSetTooLarge {
                ops,
                bytes: self.bytes,
                max_ops: limits.max_write_set_ops,
                max_bytes: limits.max_write_set_bytes,
            });
        }
        for (key, packed) in self.entries.iter() {
            if key.len() > limits.max_key_bytes {
                return Err(KvError::KeyTooLarge {
                    len: key.len(),
                    max: limits.max_key_bytes,
                });
            }
            if packed.value_len() > limits.max_value_bytes {
                return Err(KvError::ValueTooLarge {
                    key: key.to_vec(),
                    len: packed.value_len(),
                    max: limits.max_value_bytes,
                });
            }
        }
        Ok(())
    }

    /// These writes with every key passed through `key`, which must keep their order (a
    /// backend that puts its keys under a prefix of its own).
    ///
    /// # Errors
    /// [`KvError::KeyTooLarge`] for a mapped key of 4 GiB or more, and
    /// [`KvError::ContradictoryWriteSet`] for two keys mapped to one.
    pub fn map_keys<K: AsRef<[u8]>>(
        &self,
        key: impl Fn(&[u8]) -> K,
    ) -> Result<StagedWrites, KvError> {
        let mut mapped = StagedWrites::default();
        mapped.reserve(self.entries.len());
        // In key order, so that the new keys, in the same order, are sealed as they are.
        for (k, staged) in self.ordered() {
            mapped.copy_in(key(k).as_ref(), staged)?;
        }
        let mut undo = Undo::off();
        for required in &self.ranges {
            let range = KeyRange::new(
                key(&required.range.start).as_ref().to_vec(),
                key(&required.range.end).as_ref().to_vec(),
            );
            mapped.require_range(range, required.digest, &mut undo);
        }
        // Keys that kept their order are sealed; keys that did not are sorted again.
        let in_order = mapped
            .entries
            .keys()
            .zip(mapped.entries.keys().skip(1))
            .all(|(a, b)| cmp_keys(a, b) == Ordering::Less);
        if in_order {
            mapped.order = (0..mapped.entries.len()).collect();
            mapped.sealed = mapped.entries.len();
        }
        mapped.seal();
        Ok(mapped)
    }

    /// Stages `key`, not staged yet, as `staged` says: for copying entries whole
    /// ([`map_keys`](Self::map_keys)), not a change a transaction makes.
    fn copy_in(&mut self, key: &[u8], staged: Staged<'_>) -> Result<(), KvError> {
        let Lookup::Absent(hash) = self.entries.lookup(key) else {
            return Err(KvError::ContradictoryWriteSet {
                key: key.to_vec(),
                reason: "staged twice under one key",
            });
        };
        self.add(hash, key, staged, &mut Undo::off())?;
        Ok(())
    }
}

/// The error for a value of `len` bytes, `key`'s, that the arena cannot hold in one piece.
fn value_too_large(key: &[u8], len: usize) -> KvError {
    KvError::ValueTooLarge {
        key: key.to_vec(),
        len,
        max: u32::MAX as usize,
    }
}

/// The error for a key the staged writes cannot add.
fn refused(full: Full, keys: usize, bytes: usize) -> KvError {
    match full {
        Full::Key(len) => KvError::KeyTooLarge {
            len,
            max: u32::MAX as usize,
        },
        Full::Keys => KvError::WriteSetTooLarge {
            ops: keys + 1,
            bytes,
            max_ops: keys,
            max_bytes: usize::MAX,
        },
    }
}

mod arena;
mod slots;
#[cfg(test)]
mod tests;
