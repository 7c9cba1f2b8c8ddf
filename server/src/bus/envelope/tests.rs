use super::*;

#[test]
fn envelopes_round_trip_and_garbage_is_refused() {
    let all = [
        Envelope::Open {
            from: "n1".into(),
            conn: 7,
            doc: "team/notes".into(),
            auth: Credential {
                user: Some("ann".into()),
                can_write: true,
                expires_at: Some(1_800_000_000),
                seen_change: 3,
                hocuspocus: false,
                profile: Some(("Ann".into(), "#e11d48".into())),
            },
        },
        Envelope::Open {
            from: "n1".into(),
            conn: 9,
            doc: "tiptap".into(),
            auth: Credential {
                user: Some("ann".into()),
                can_write: true,
                expires_at: None,
                seen_change: 0,
                hocuspocus: true,
                profile: None,
            },
        },
        Envelope::Open {
            from: "n1".into(),
            conn: 8,
            doc: "d".into(),
            auth: Credential {
                user: None,
                can_write: false,
                expires_at: None,
                seen_change: 3,
                hocuspocus: false,
                profile: None,
            },
        },
        Envelope::Reauth {
            from: "n1".into(),
            conn: 9,
            auth: Credential {
                user: Some("ann".into()),
                can_write: false,
                expires_at: Some(1_800_000_000),
                seen_change: 4,
                ..Credential::default()
            },
        },
        Envelope::Reauth {
            from: "n1".into(),
            conn: 9,
            auth: Credential {
                user: None,
                can_write: true,
                expires_at: None,
                seen_change: 0,
                ..Credential::default()
            },
        },
        Envelope::Frame {
            from: "n2".into(),
            conn: u64::MAX,
            seq: 3,
            data: Bytes::from_static(&[0, 1, 2]),
        },
        Envelope::Alive {
            from: "n2".into(),
            conn: 1,
            sent: 9,
        },
        Envelope::Close {
            from: "n2".into(),
            conn: 1,
        },
        Envelope::Out {
            conn: 3,
            seq: 1,
            data: Bytes::from_static(b"xyz"),
        },
        Envelope::Beat { conn: 3, sent: 4 },
        Envelope::Kill {
            conn: 3,
            code: 1012,
            reason: "moved".into(),
        },
        Envelope::Changed {
            from: "n1".into(),
            at_ms: 1_800_000_000_000,
            doc: "a/b".into(),
            change: Change::Deleted,
        },
        Envelope::Changed {
            from: "n1".into(),
            at_ms: 1,
            doc: "a/b".into(),
            change: Change::Access {
                user: "ann".into(),
                id: 7,
            },
        },
        Envelope::Request(Forwarded {
            from: "n2".into(),
            id: 11,
            nonce: "0f1e2d3c".into(),
            sent_at_ms: 1_800_000_000_000,
            principal: r#"{"user":"ann"}"#.into(),
            method: "POST".into(),
            uri: "/api/v1/docs/3/update".into(),
            headers: vec![("content-type".into(), "application/octet-stream".into())],
            body: Bytes::from_static(&[0, 0]),
        }),
        Envelope::Response(ForwardAnswer {
            id: 11,
            status: 200,
            headers: vec![],
            body: Bytes::from_static(b"{\"seq\":4}"),
        }),
    ];
    for env in all {
        assert_eq!(Envelope::decode(env.encode()), Some(env));
    }
    assert_eq!(Envelope::decode(Bytes::from_static(&[1, 2, 3])), None);
    assert_eq!(Envelope::decode(Bytes::from_static(&[9; 20])), None);
    // Cut into the change id, or (without one) into the user's name.
    for seen_change in [3, 0] {
        let mut truncated = Envelope::Open {
            from: "n1".into(),
            conn: 1,
            doc: "doc".into(),
            auth: Credential {
                user: Some("user".into()),
                can_write: true,
                expires_at: None,
                seen_change,
                hocuspocus: false,
                profile: None,
            },
        }
        .encode();
        truncated.truncate(truncated.len() - 3);
        assert_eq!(Envelope::decode(truncated), None, "{seen_change}");
    }
}

#[test]
fn only_messages_signed_with_the_cluster_key_for_their_subject_are_read() {
    let key = ClusterKey::new("a-cluster-key-of-some-length").expect("key");
    let other = ClusterKey::new("another-cluster-key-entirely").expect("key");
    let body = Envelope::Open {
        from: "n1".into(),
        conn: 1,
        doc: "d".into(),
        auth: Credential {
            user: Some("mallory".into()),
            can_write: true,
            expires_at: None,
            seen_change: 3,
            hocuspocus: false,
            profile: None,
        },
    }
    .encode();
    let sealed = key.seal("quire.node.n2", &body);
    assert_eq!(
        key.open("quire.node.n2", sealed.clone()),
        Some(body.clone())
    );
    // Signed with another key, sent to another node, unsigned, or altered: refused.
    assert_eq!(other.open("quire.node.n2", sealed.clone()), None);
    assert_eq!(key.open("quire.node.n3", sealed.clone()), None);
    assert_eq!(key.open("quire.node.n2", body.clone()), None);
    let mut altered = sealed.to_vec();
    let last = altered.len() - 1;
    altered[last] ^= 1;
    assert_eq!(key.open("quire.node.n2", Bytes::from(altered)), None);
    assert_eq!(
        key.open("quire.node.n2", Bytes::from_static(b"short")),
        None
    );
    assert!(ClusterKey::new("short").is_err());
    assert!(!format!("{key:?}").contains("cluster-key"));
}
