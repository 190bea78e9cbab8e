use super::*;

fn key_error(f: impl FnOnce(&mut tikv_client::ProtoKeyError)) -> TikvError {
    let mut e = tikv_client::ProtoKeyError::default();
    f(&mut e);
    TikvError::KeyError(Box::new(e))
}

#[test]
#[expect(
    clippy::default_trait_access,
    reason = "tikv-client does not export the protobuf types of KeyError's fields"
)]
fn nested_key_errors_are_classified() {
    let exists = |k: &[u8]| {
        key_error(|e| {
            e.already_exist = Some(Default::default());
            if let Some(a) = e.already_exist.as_mut() {
                a.key = k.to_vec();
            }
        })
    };
    let err = TikvError::ExtractedErrors(vec![TikvError::MultipleKeyErrors(vec![
        exists(b"k9"),
        exists(b"k2"),
    ])]);
    assert_eq!(classify(&err), ErrorClass::AlreadyExists(b"k2".to_vec()));

    let conflict = key_error(|e| e.conflict = Some(Default::default()));
    let err = TikvError::MultipleKeyErrors(vec![TikvError::ExtractedErrors(vec![conflict])]);
    assert!(matches!(classify(&err), ErrorClass::WriteConflict(_)));

    assert_eq!(
        classify(&TikvError::ResolveLockError(Vec::new())),
        ErrorClass::Locked
    );
    assert_eq!(
        classify(&TikvError::StringError("x".into())),
        ErrorClass::Other
    );
}

#[test]
fn open_snapshots_register_and_leave() {
    let registry = Arc::new(OpenSnapshots::default());
    let a = OpenSnapshot::register(&registry, 20);
    let b = OpenSnapshot::register(&registry, 10);
    let c = OpenSnapshot::register(&registry, 10);
    assert_eq!((registry.oldest(), registry.count()), (Some(10), 3));
    drop(b);
    assert_eq!(registry.oldest(), Some(10));
    drop(c);
    assert_eq!(registry.oldest(), Some(20));
    drop(a);
    assert_eq!((registry.oldest(), registry.count()), (None, 0));
}

#[test]
fn failures_name_the_backend() {
    let err = classify_failure(&TikvError::StringError("boom".into()));
    assert!(matches!(
        err,
        KvError::Backend {
            backend: "tikv",
            ..
        }
    ));
    let err = classify_failure(&TikvError::InternalError {
        message: "PD cluster failed to respond".into(),
    });
    assert!(matches!(
        err,
        KvError::Unavailable {
            backend: "tikv",
            ..
        }
    ));
}
