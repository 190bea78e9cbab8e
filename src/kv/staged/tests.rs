use super::*;

fn b(text: &str) -> Vec<u8> {
    text.as_bytes().to_vec()
}

#[test]
fn changes_fold_per_key_and_undo_restores_exactly() {
    let mut staged = StagedWrites::new();
    let mut first = Undo::new();
    staged.insert(b("a"), b("1"), &mut first).expect("insert");
    staged.require_present(b("b"), &mut first).expect("require");
    let before = staged.clone();

    let mut second = Undo::new();
    staged.delete(b("a"), &mut second).expect("delete");
    staged
        .insert(b("a"), b("22"), &mut second)
        .expect("re-insert");
    staged.put(b("b"), b("3"), &mut second).expect("put");
    staged.put(b("c"), b("4"), &mut second).expect("put");
    assert_eq!(staged.read(b"a"), Some(Some(&b"22"[..])));
    assert_eq!(
        staged.get(b"a").map(|s| s.requirement),
        Some(Requirement::Absent),
        "still an insert-if-absent against the store"
    );
    assert_eq!(
        staged.get(b"b").map(|s| s.requirement),
        Some(Requirement::Present)
    );
    assert_eq!(staged.bytes(), 3 + 2 + 2);
    staged.undo(second);
    assert_eq!(staged, before);
    assert_eq!(staged.bytes(), 2 + 1);
}

/// A change that creates keys logs nothing per created key, nor per later change to one: they
/// go back as one truncation. Only keys staged before the change are logged, once per change
/// to them.
#[test]
fn created_keys_are_taken_back_without_a_log_entry_each() {
    let mut staged = StagedWrites::new();
    let mut first = Undo::new();
    staged.put(b("old"), b("1"), &mut first).expect("put");
    let before = staged.clone();

    let mut change = Undo::new();
    for i in 0..100 {
        let key = format!("new{i:03}").into_bytes();
        staged.insert(&key, b("v"), &mut change).expect("insert");
        let rewritten = staged.rewrite(&key, &mut change, |_| Ok::<_, KvError>(Some(b("vv"))));
        assert_eq!(rewritten, Ok(true));
    }
    assert_eq!(change.logged(), 0, "created keys are not logged one by one");
    staged.put(b("old"), b("2"), &mut change).expect("put");
    staged.delete(b("old"), &mut change).expect("delete");
    assert_eq!(
        change.logged(),
        2,
        "a key staged before the change is logged per change"
    );
    staged.seal();
    staged.undo(change);
    assert_eq!(staged, before);
    assert_eq!(staged.len(), 1);
    assert_eq!(
        staged.iter().count(),
        1,
        "the key order forgets the created keys"
    );
    assert_eq!(staged.read(b"old"), Some(Some(&b"1"[..])));
}

#[test]
fn contradictions_are_refused() {
    let mut staged = StagedWrites::new();
    let mut undo = Undo::new();
    staged.put(b("a"), b("1"), &mut undo).expect("put");
    assert!(matches!(
        staged.insert(b("a"), b("2"), &mut undo),
        Err(KvError::ContradictoryWriteSet { .. })
    ));
    staged.delete(b("z"), &mut undo).expect("delete");
    assert!(matches!(
        staged.require_present(b("z"), &mut undo),
        Err(KvError::ContradictoryWriteSet { .. })
    ));
}

#[test]
fn written_leaves_out_requirements() {
    let mut staged = StagedWrites::new();
    let mut undo = Undo::new();
    staged.require_present(b("a"), &mut undo).expect("require");
    staged.delete(b("b"), &mut undo).expect("delete");
    staged.put(b("c"), b("3"), &mut undo).expect("put");
    let range = KeyRange::new(b"a".to_vec(), b"z".to_vec());
    let seen: Vec<_> = staged
        .written_in(&range)
        .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
        .collect();
    assert_eq!(seen, vec![(b("b"), None), (b("c"), Some(b("3")))]);
}

proptest::proptest! {
    /// Keys compared a word at a time order exactly as their bytes do, at every length; so
    /// do their heads past the prefix they share, where the heads differ.
    #[test]
    fn keys_order_as_their_bytes(
        prefix in proptest::collection::vec(0_u8..4, 0..12),
        a in proptest::collection::vec(0_u8..4, 0..40),
        b in proptest::collection::vec(0_u8..4, 0..40),
    ) {
        let (a, b) = ([prefix.as_slice(), &a].concat(), [prefix.as_slice(), &b].concat());
        proptest::prop_assert_eq!(cmp_keys(&a, &b), a.cmp(&b));
        let skip = shared_prefix([a.as_slice(), &b].into_iter());
        let naive = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        proptest::prop_assert_eq!(skip, naive);
        // Heads that differ order as the keys do; equal heads leave it to the keys.
        for skip in [0, skip] {
            let (x, y) = (head(&a, skip), head(&b, skip));
            if x != y {
                proptest::prop_assert_eq!(x.cmp(&y), a.cmp(&b));
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

    /// Enough keys for the seal to sort them by radix come out in key order: keys that share
    /// a prefix, keys whose heads are equal and only their tails differ, keys that are a
    /// prefix of others, and keys staged again or taken back.
    #[test]
    fn many_keys_seal_in_key_order(
        prefix in proptest::collection::vec(0_u8..3, 0..12),
        keys in proptest::collection::vec(
            (proptest::collection::vec(0_u8..3, 0..30), 0_u8..4),
            RADIX_FROM..RADIX_FROM + 600,
        ),
        taken_back in 0_usize..200,
    ) {
        let mut staged = StagedWrites::new();
        let mut expected = std::collections::BTreeSet::new();
        let kept = keys.len().saturating_sub(taken_back);
        let (first, last) = keys.split_at(kept);
        for (tail, value) in first {
            let key = [prefix.as_slice(), tail].concat();
            staged.put(&key, [*value], &mut Undo::off()).expect("put");
            expected.insert(key);
        }
        let mut undo = Undo::new();
        for (tail, value) in last {
            let key = [prefix.as_slice(), tail].concat();
            staged.put(key, [*value], &mut undo).expect("put");
        }
        staged.undo(undo);
        staged.seal();
        // The key order holds its positions, not the sort's larger buffer.
        proptest::prop_assert_eq!(staged.order.capacity(), staged.order.len());
        let sealed: Vec<Vec<u8>> = staged.iter().map(|(key, _)| key.to_vec()).collect();
        proptest::prop_assert_eq!(sealed, expected.into_iter().collect::<Vec<_>>());
    }
}

/// One change of a randomized run over a few keys, so that keys are staged again, taken back
/// and re-staged: what the ordering must survive.
#[derive(Debug, Clone)]
enum Action {
    Put(u8, u8),
    Insert(u8, u8),
    Delete(u8),
    RequirePresent(u8),
    Rewrite(u8, u8),
    Seal,
    /// Ends the open request, keeping it or taking it back, and opens another.
    EndRequest(bool),
}

fn action() -> impl proptest::strategy::Strategy<Value = Action> {
    use proptest::prelude::*;
    let key = 0_u8..24;
    prop_oneof![
        4 => (key.clone(), any::<u8>()).prop_map(|(k, v)| Action::Put(k, v)),
        4 => (key.clone(), any::<u8>()).prop_map(|(k, v)| Action::Insert(k, v)),
        2 => key.clone().prop_map(Action::Delete),
        1 => key.clone().prop_map(Action::RequirePresent),
        2 => (key, any::<u8>()).prop_map(|(k, v)| Action::Rewrite(k, v)),
        1 => Just(Action::Seal),
        2 => any::<bool>().prop_map(Action::EndRequest),
    ]
}

/// Keys of varied lengths that share prefixes, some longer than a sort head, so that the
/// word-wise order and the sort's ties are exercised.
fn key_of(k: u8) -> Vec<u8> {
    let mut key = vec![7_u8; usize::from(k % 3) * 12];
    key.push(k / 3);
    key.extend(std::iter::repeat_n(k, usize::from(k % 4)));
    key
}

proptest::proptest! {
    /// Whatever the changes, seals and take-backs, the staged writes read exactly as writes
    /// staged again from scratch with every change applied in order would: every key's state,
    /// every range in key order, the byte count.
    #[test]
    fn reads_in_order_whatever_was_sealed_or_taken_back(
        actions in proptest::collection::vec(action(), 0..120),
        lo in 0_u8..24,
        len in 0_u8..24,
    ) {
        let mut staged = StagedWrites::new();
        let mut undo = Undo::new();
        // The model: the same changes with nothing taken back but what the request undid.
        let mut kept: Vec<Action> = Vec::new();
        let mut open: Vec<Action> = Vec::new();
        let apply = |staged: &mut StagedWrites, undo: &mut Undo, action: &Action| match action {
            Action::Put(k, v) => drop(staged.put(key_of(*k), [*v], undo)),
            Action::Insert(k, v) => drop(staged.insert(key_of(*k), [*v], undo)),
            Action::Delete(k) => drop(staged.delete(key_of(*k), undo)),
            Action::RequirePresent(k) => drop(staged.require_present(key_of(*k), undo)),
            Action::Rewrite(k, v) => {
                let _ = staged.rewrite(&key_of(*k), undo, |_| Ok::<_, KvError>(Some([*v, *v])));
            }
            Action::Seal => staged.seal(),
            Action::EndRequest(_) => {}
        };
        for action in &actions {
            match action {
                Action::EndRequest(keep) => {
                    let done = std::mem::take(&mut undo);
                    if *keep {
                        kept.append(&mut open);
                    } else {
                        staged.undo(done);
                        open.clear();
                    }
                }
                other => {
                    apply(&mut staged, &mut undo, other);
                    open.push(other.clone());
                }
            }
        }
        kept.append(&mut open);
        let mut model = StagedWrites::new();
        let mut model_undo = Undo::off();
        for action in &kept {
            apply(&mut model, &mut model_undo, action);
        }
        proptest::prop_assert_eq!(&staged, &model);
        let in_order: Vec<(&[u8], Staged<'_>)> = staged.iter().collect();
        let mut expected: Vec<(&[u8], Staged<'_>)> = model
            .entries
            .spans()
            .map(|(key, packed)| model.view(key, packed))
            .collect();
        expected.sort_by(|a, b| a.0.cmp(b.0));
        proptest::prop_assert_eq!(&in_order, &expected);
        let (start, end) = (key_of(lo), key_of(lo.saturating_add(len)));
        let range = (Bound::Included(start.as_ref()), Bound::Excluded(end.as_ref()));
        let written: Vec<(&[u8], Option<&[u8]>)> = staged.written(range).collect();
        let want: Vec<(&[u8], Option<&[u8]>)> = expected
            .iter()
            .filter(|(k, _)| *k >= start.as_slice() && *k < end.as_slice())
            .filter_map(|(k, s)| Some((*k, s.write?)))
            .collect();
        proptest::prop_assert_eq!(&written, &want);
        let mut sealed = staged.clone();
        sealed.seal();
        let sealed: Vec<(&[u8], Option<&[u8]>)> = sealed.written(range).collect();
        proptest::prop_assert_eq!(sealed, want);
    }
}

/// An order worked out apart from the writes seals them as `seal` does, and leaves nothing
/// to seal; one that no longer covers them (worked out before another key was staged) is set
/// aside, and they are sealed afresh.
#[test]
fn an_order_worked_out_apart_seals_as_seal_does() {
    let mut staged = StagedWrites::new();
    let mut undo = Undo::off();
    for key in ["e", "c", "i"] {
        staged.put(b(key), b("v"), &mut undo).expect("put");
    }
    staged.seal();
    for key in ["a", "g", "d"] {
        staged.put(b(key), b("v"), &mut undo).expect("put");
    }
    let keys = |staged: &StagedWrites| -> Vec<Vec<u8>> {
        staged
            .order
            .iter()
            .filter_map(|&at| staged.key_at(at))
            .map(<[u8]>::to_vec)
            .collect()
    };
    let mut sealed = staged.clone();
    sealed.seal();
    let mut apart = staged.clone();
    apart.seal_with(staged.order_to_seal().expect("unsealed keys"));
    assert!(apart.is_sealed());
    assert_eq!(apart.order, sealed.order);
    assert_eq!(keys(&apart), ["a", "c", "d", "e", "g", "i"].map(b));
    assert!(apart.order_to_seal().is_none());

    let stale = staged.order_to_seal().expect("unsealed keys");
    staged.put(b("b"), b("v"), &mut undo).expect("put");
    staged.seal_with(stale);
    assert!(staged.is_sealed());
    assert_eq!(keys(&staged), ["a", "b", "c", "d", "e", "g", "i"].map(b));
}

/// `insert_new` says where it staged a key, and `rewrite_at` reaches that key there: after
/// other keys are staged and sealed, and after the key is deleted and inserted again. A
/// place a taken-back change had created holds no key until one is staged there again.
#[test]
fn a_key_is_rewritten_where_insert_new_staged_it() {
    let mut staged = StagedWrites::new();
    let mut undo = Undo::new();
    let (prior, at_b) = staged
        .insert_new(b("b"), b("1"), &mut undo)
        .expect("insert");
    assert_eq!(prior, Prior::Unstaged);
    let (_, at_a) = staged
        .insert_new(b("a"), b("2"), &mut undo)
        .expect("insert");
    staged.seal();
    assert_eq!(staged.key_at(at_b), Some(&b"b"[..]));
    assert_eq!(staged.key_at(at_a), Some(&b"a"[..]));
    let rewrite = |to: &'static str| move |_: &[u8]| Ok::<_, KvError>(Some(b(to)));
    assert_eq!(staged.rewrite_at(at_b, &mut undo, rewrite("11")), Ok(true));
    assert_eq!(staged.read(b"b"), Some(Some(&b"11"[..])));
    assert_eq!(staged.read(b"a"), Some(Some(&b"2"[..])), "only b's record");

    staged.delete(b("b"), &mut undo).expect("delete");
    assert_eq!(
        staged.rewrite_at(at_b, &mut undo, rewrite("x")),
        Ok(false),
        "a deleted key holds no value to rewrite"
    );
    let (prior, again) = staged
        .insert_new(b("b"), b("3"), &mut undo)
        .expect("insert");
    assert_eq!((prior, again), (Prior::Deleted, at_b), "the same place");

    let mut change = Undo::new();
    let (_, at_c) = staged
        .insert_new(b("c"), b("4"), &mut change)
        .expect("insert");
    staged.undo(change);
    assert_eq!(staged.key_at(at_c), None);
    assert_eq!(staged.rewrite_at(at_c, &mut undo, rewrite("y")), Ok(false));
    let (_, at_d) = staged
        .insert_new(b("d"), b("5"), &mut undo)
        .expect("insert");
    assert_eq!(at_d, at_c, "the place is staged again");
    assert_eq!(staged.rewrite_at(at_d, &mut undo, rewrite("55")), Ok(true));
    assert_eq!(staged.read(b"d"), Some(Some(&b"55"[..])));
    assert_eq!(staged.read(b"c"), None);
}

/// Sealed writes hand out a range's positions as a part of their key order, not a copy of
/// it: a reader taking a page off the front of a large range pays for the page. Unsealed
/// keys are sorted into a copy, and read the same.
#[test]
fn a_sealed_range_is_read_in_place() {
    let mut staged = StagedWrites::new();
    let mut undo = Undo::new();
    for key in ["d", "b", "a", "c"] {
        staged.put(b(key), b("v"), &mut undo).expect("put");
    }
    let range = (Bound::Included(&b"b"[..]), Bound::Excluded(&b"d"[..]));
    let unsealed: Vec<Vec<u8>> = staged.written(range).map(|(key, _)| key.to_vec()).collect();
    assert!(matches!(staged.positions_in(range), Cow::Owned(_)));
    staged.seal();
    assert!(matches!(staged.positions_in(range), Cow::Borrowed(_)));
    let sealed: Vec<Vec<u8>> = staged.written(range).map(|(key, _)| key.to_vec()).collect();
    assert_eq!(sealed, [b("b"), b("c")]);
    assert_eq!(unsealed, sealed);
}

/// A key required unchanged keeps the digest it was required with (stored after the key in
/// the arena) through later writes to it, comparisons and a copy under other keys, and the
/// commit's check reads that digest.
#[test]
fn a_key_required_unchanged_keeps_its_digest() {
    let read = Digest::of_value(b"as read");
    let mut staged = StagedWrites::new();
    let mut undo = Undo::new();
    staged
        .require(b("k"), Requirement::Unchanged(read), &mut undo)
        .expect("require");
    staged.put(b("k"), b("new"), &mut undo).expect("put");
    staged.put(b("j"), b("other"), &mut undo).expect("put");
    let expected = Staged {
        requirement: Requirement::Unchanged(read),
        write: Some(Some(&b"new"[..])),
    };
    assert_eq!(staged.get(b"k"), Some(expected));

    let mapped = staged
        .map_keys(|key| [&b"p/"[..], key].concat())
        .expect("map");
    assert_eq!(mapped.get(b"p/k"), Some(expected));
    assert_eq!(
        mapped.get(b"p/j").and_then(|s| s.write),
        Some(Some(&b"other"[..]))
    );
    assert_ne!(mapped, staged);
    assert_eq!(
        mapped.map_keys(|key| key[2..].to_vec()).expect("map"),
        staged
    );

    let store = |value: &'static [u8]| {
        staged.first_unmet(
            |key| Ok::<_, ()>((key == b"k").then_some(value)),
            |_, _| Ok(()),
        )
    };
    assert_eq!(store(b"as read"), Ok(None));
    assert_eq!(
        store(b"changed since"),
        Ok(Some(Conflict::Changed { key: b("k") }))
    );
}

/// A change taken back gives back the arena bytes it added, with the keys it created and
/// the values it wrote over keys staged before it.
#[test]
fn a_change_taken_back_gives_its_arena_bytes_back() {
    let mut staged = StagedWrites::new();
    staged
        .put(b("kept"), b("1"), &mut Undo::off())
        .expect("put");
    let (capacity, bytes) = (staged.entries.arena().capacity(), staged.bytes());
    let mut change = Undo::new();
    for i in 0..20_000_u32 {
        staged
            .insert(i.to_be_bytes(), [7_u8; 100], &mut change)
            .expect("insert");
    }
    staged
        .put(b("kept"), vec![9_u8; 4 << 20], &mut change)
        .expect("put");
    assert!(staged.entries.arena().capacity() > capacity + (5 << 20));
    staged.undo(change);
    assert_eq!(staged.entries.arena().capacity(), capacity);
    assert_eq!(staged.bytes(), bytes);
    assert_eq!(staged.read(b"kept"), Some(Some(&b"1"[..])));
    assert_eq!(staged.len(), 1);
}

/// A deterministic stream of pseudo-random numbers from `seed` (xorshift64).
fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// Both radix sorts order heads as a comparison sort does, through runs large enough to be
/// split again at several bytes (skewed tables, ids that share their high bytes, equal
/// heads), and keep every position once: the in-place sort of whole heads, and the sort of
/// heads packed into the bytes in which they differ (enough of them for its parts to be
/// sorted on two threads).
#[test]
fn radix_sorts_order_heads_as_a_comparison_sort_does() {
    let mut next = xorshift(0x2545_f491_4f6c_dd1d_u64);
    let mut heads: Vec<Head> = (0..PARALLEL_FROM + 4_000)
        .map(|at| {
            let r = next();
            let kind = r % 3;
            // A few tables own most keys.
            let table = if r % 10 < 7 {
                (r >> 8) % 3
            } else {
                (r >> 8) % 500
            };
            let id = (r >> 20) % 400_000;
            ([(kind << 56) | table, id << 8, r % 2], at)
        })
        .collect();
    let mut expected: Vec<[u64; 3]> = heads.iter().map(|(head, _)| *head).collect();
    expected.sort_unstable();
    let digits = varying_digits(heads.iter().map(|&(head, _)| head));
    // Kind, two bytes of table, three of id and the last byte: few enough to pack, and more
    // than one split of the packed sort takes by the least significant byte first.
    assert!(
        (LSD_PASSES + 1..=PACKED_DIGITS).contains(&digits.len()),
        "{digits:?}"
    );
    let head_at: Vec<[u64; 3]> = heads.iter().map(|&(head, _)| head).collect();

    let mut packed: Vec<u128> = heads
        .iter()
        .map(|&(head, at)| pack(&head, &digits, at))
        .collect();
    sort_packed(&mut packed, &mut vec![0; PARALLEL_FROM + 4_000]);
    let sorted: Vec<[u64; 3]> = packed
        .iter()
        .filter_map(|&item| head_at.get(unpack(item)).copied())
        .collect();
    assert_eq!(sorted, expected);
    let mut positions: Vec<usize> = packed.iter().map(|&item| unpack(item)).collect();
    positions.sort_unstable();
    assert!(positions.iter().copied().eq(0..PARALLEL_FROM + 4_000));

    sort_by_digits(&mut heads, &digits);
    let sorted: Vec<[u64; 3]> = heads.iter().map(|(head, _)| *head).collect();
    assert_eq!(sorted, expected);
    let mut positions: Vec<usize> = heads.iter().map(|&(_, at)| at).collect();
    positions.sort_unstable();
    assert!(positions.iter().copied().eq(0..PARALLEL_FROM + 4_000));
}

/// Row keys of many tables (a kind, a table and an id past a shared prefix, as the keyspace
/// lays them out) seal in key order through the packed sort, including keys whose heads are
/// equal: keys longer than a head that differ only past it, and a key that is a prefix of
/// another.
#[test]
fn row_keys_seal_in_key_order_through_the_packed_sort() {
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15_u64);
    let mut staged = StagedWrites::new();
    let mut expected = std::collections::BTreeSet::new();
    for _ in 0..RADIX_FROM * 4 {
        let r = next();
        let mut key = b"deployment/".to_vec();
        key.push(u8::try_from(r % 2).expect("a kind"));
        key.extend_from_slice(&((r >> 8) % 700).to_be_bytes());
        key.extend_from_slice(&((r >> 20) % 50_000).to_be_bytes());
        let mut keys = vec![key.clone()];
        if r.is_multiple_of(5) {
            // Past the head, which ends with seven zero bytes here, keys that differ only
            // there: their heads equal each other's and the shorter key's.
            for last in [3, 1] {
                let mut longer = key.clone();
                longer.extend_from_slice(&[0; 7]);
                longer.push(last);
                keys.push(longer);
            }
        }
        for key in keys {
            staged.put(&key, b"v", &mut Undo::off()).expect("put");
            expected.insert(key);
        }
    }
    let skip = shared_prefix(expected.iter().map(Vec::as_slice));
    assert_eq!(skip, b"deployment/".len());
    assert!(varying_digits(expected.iter().map(|key| head(key, skip))).len() <= PACKED_DIGITS);
    staged.seal();
    let sealed: Vec<Vec<u8>> = staged.iter().map(|(key, _)| key.to_vec()).collect();
    assert_eq!(sealed, expected.into_iter().collect::<Vec<_>>());
}

/// A small transaction holds little: one staged key costs a few KiB (its arena's first chunk,
/// a short first entry chunk, a small table), not a whole chunk of entries, so that a low
/// `--txn-max-bytes` still lets it through.
#[test]
fn one_staged_key_holds_a_few_kib() {
    let mut staged = StagedWrites::new();
    staged
        .put(b("key"), b("value"), &mut Undo::off())
        .expect("put");
    staged.seal();
    assert!(staged.memory() < 8 << 10, "{} bytes", staged.memory());
}
