use super::*;

fn b(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
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
    assert_eq!(staged.read(b"a"), Some(Some(&b("22"))));
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
        .map(|(k, v)| (k.clone(), v.cloned()))
        .collect();
    assert_eq!(seen, vec![(b("b"), None), (b("c"), Some(b("3")))]);
}

proptest::proptest! {
    /// Keys compared a word at a time order exactly as their bytes do, at every length.
    #[test]
    fn keys_order_as_their_bytes(
        a in proptest::collection::vec(0_u8..4, 0..40),
        b in proptest::collection::vec(0_u8..4, 0..40),
    ) {
        proptest::prop_assert_eq!(KeyRef::of(&a).cmp(KeyRef::of(&b)), a.cmp(&b));
        proptest::prop_assert_eq!(
            Key(Bytes::from(a.clone())).cmp(&Key(Bytes::from(b.clone()))),
            a.cmp(&b)
        );
    }
}
