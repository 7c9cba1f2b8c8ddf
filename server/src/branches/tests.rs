use super::parse::parse_v1;
use super::view::change_texts;
use super::*;
use crate::storage::branches::Decision;
use yrs::{GetString, StateVector, Text, WriteTxn};

fn doc(client: u64) -> Doc {
    Doc::with_options(Options {
        client_id: yrs::ClientID::new(client),
        ..Options::default()
    })
}

fn row(seq: i64, data: Vec<u8>, author: &str, at: i64) -> BranchLogRow {
    BranchLogRow {
        seq,
        data,
        author: Some(author.into()),
        created_at: at,
        inserted: 0,
        deleted: 0,
    }
}

/// Runs `f` on `d`'s text `content` and returns the update it made.
fn edit(d: &Doc, f: impl FnOnce(&yrs::TextRef, &mut yrs::TransactionMut)) -> Vec<u8> {
    let before = d.transact().state_vector();
    let text = d.get_or_insert_text("content");
    {
        let mut txn = d.transact_mut();
        f(&text, &mut txn);
    }
    d.transact().encode_diff_v1(&before)
}

fn sync(from: &Doc, to: &Doc) {
    let sv = to.transact().state_vector();
    let update = from.transact().encode_diff_v1(&sv);
    to.transact_mut()
        .apply_update(Update::decode_v1(&update).unwrap())
        .unwrap();
}

/// A branch whose base says "Hello world", then: alice inserts " dear" (change 2), bob
/// (another session, another client) deletes "world" and writes "there" (change 3), and
/// alice, later, deletes part of bob's word (change 4, needing 3, and 2 by her clock).
fn branch() -> (Vec<BranchLogRow>, Doc) {
    let base = doc(1);
    let u1 = edit(&base, |t, txn| t.insert(txn, 0, "Hello world"));
    let alice = doc(2);
    let bob = doc(3);
    sync(&base, &alice);
    sync(&base, &bob);
    let u2 = edit(&alice, |t, txn| t.insert(txn, 5, " dear"));
    sync(&alice, &bob);
    let u3 = edit(&bob, |t, txn| {
        t.remove_range(txn, 11, 5);
        t.insert(txn, 11, "there");
    });
    sync(&bob, &alice);
    let u4 = edit(&alice, |t, txn| t.remove_range(txn, 13, 2));
    let rows = vec![
        row(1, u1, "owner", 0),
        row(2, u2, "alice", 10),
        row(3, u3, "bob", 20),
        row(4, u4, "alice", 1_000_000),
    ];
    (rows, alice)
}

#[test]
fn changes_are_sessions_by_author_with_their_dependencies() {
    let (rows, alice) = branch();
    let r = review(&rows, &[], &[], 60_000).unwrap();
    let ids: Vec<i64> = r.changes.iter().map(|c| c.id).collect();
    assert_eq!(ids, vec![2, 3, 4]);
    assert_eq!(r.change(2).unwrap().depends_on, Vec::<i64>::new());
    // bob's "there" refers to the base's items only; alice's deletion of part of it
    // needs it.
    assert_eq!(r.change(3).unwrap().depends_on, Vec::<i64>::new());
    assert_eq!(r.change(4).unwrap().depends_on, vec![3]);
    // The view: concatenated kept + inserted runs are the branch's text.
    let text: String = r.view[0]
        .runs
        .iter()
        .filter(|r| r.kind != "deleted")
        .map(|r| r.text.as_str())
        .collect();
    let t = alice.get_or_insert_text("content");
    assert_eq!(text, t.get_string(&alice.transact()));
    let deleted: Vec<(&str, Option<i64>)> = r.view[0]
        .runs
        .iter()
        .filter(|r| r.kind == "deleted")
        .map(|r| (r.text.as_str(), r.change))
        .collect();
    assert_eq!(deleted, vec![("world", Some(3))]);
    let inserted: Vec<(&str, Option<i64>)> = r.view[0]
        .runs
        .iter()
        .filter(|r| r.kind == "inserted")
        .map(|r| (r.text.as_str(), r.change))
        .collect();
    assert_eq!(inserted, vec![(" dear", Some(2)), ("the", Some(3))]);
    // Change 3's own diff: "world" deleted, "there" inserted, the parent's text around.
    let runs: Vec<(&str, &str)> = r.change(3).unwrap().texts[0]
        .runs
        .iter()
        .map(|r| (r.kind, r.text.as_str()))
        .collect();
    assert_eq!(
        runs,
        vec![
            ("kept", "Hello "),
            ("deleted", "world"),
            ("inserted", "the")
        ]
    );
}

#[test]
fn a_merge_of_a_closed_set_applies_cleanly_and_an_open_one_names_what_is_missing() {
    let (rows, _) = branch();
    let r = review(&rows, &[], &[], 60_000).unwrap();
    let only4: BTreeSet<i64> = [4].into();
    assert_eq!(r.missing(&only4), [3].into());
    let only3: BTreeSet<i64> = [3].into();
    assert!(r.missing(&only3).is_empty());
    // The parent: the base, then change 3 alone.
    let parent = doc(9);
    parent
        .transact_mut()
        .apply_update(Update::decode_v1(&rows[0].data).unwrap())
        .unwrap();
    for (_, update) in r.merge_plan(&rows, &only3).unwrap() {
        parent
            .transact_mut()
            .apply_update(Update::decode_v1(&update).unwrap())
            .unwrap();
    }
    assert!(!parent.transact().has_missing_updates());
    let t = parent.get_or_insert_text("content");
    assert_eq!(t.get_string(&parent.transact()), "Hello there");
    // Merged changes no longer count as missing.
    let decided = [DecisionRow {
        change_id: 3,
        last_seq: 3,
        decision: Decision::Merged,
        decided_by: None,
        parent_seq: None,
        created_at: 0,
    }];
    let r = review(&rows, &decided, &[], 60_000).unwrap();
    assert_eq!(r.change(3).unwrap().state, "merged");
    assert!(r.missing(&only4).is_empty());
}

#[test]
fn a_decided_change_keeps_its_rows_and_later_ones_start_another() {
    let (mut rows, _) = branch();
    rows[3].created_at = 15; // alice's second edit within her session
    let r = review(&rows, &[], &[], 60_000).unwrap();
    assert_eq!(r.change(2).unwrap().last_seq, 4);
    let decided = [DecisionRow {
        change_id: 2,
        last_seq: 2,
        decision: Decision::Rejected,
        decided_by: None,
        parent_seq: None,
        created_at: 0,
    }];
    let r = review(&rows, &decided, &[], 60_000).unwrap();
    assert_eq!(r.change(2).unwrap().last_seq, 2);
    assert_eq!(r.change(2).unwrap().state, "rejected");
    assert_eq!(r.change(4).unwrap().state, "open");
}

#[test]
fn a_changes_diff_shows_the_parents_text_around_it_cut_to_the_context() {
    let run = |kind, text: &str, change| ViewRun {
        kind,
        text: text.into(),
        change,
        author: change.map(|c: i64| format!("a{c}")),
        of: None,
    };
    let long = "x".repeat(100);
    let view = TextView {
        root: "content".into(),
        runs: vec![
            run("kept", &long, None),
            run("inserted", "other", Some(9)),
            run("inserted", "MINE", Some(7)),
            run("deleted", "gone", Some(9)),
            run("kept", "short", None),
            run("deleted", "cut", Some(7)),
            run("kept", &long, None),
        ],
    };
    let texts = change_texts(&view);
    let mine: Vec<(&str, String)> = texts[&7]
        .runs
        .iter()
        .map(|r| (r.kind, r.text.clone()))
        .collect();
    let forty = "x".repeat(40);
    assert_eq!(
        mine,
        vec![
            ("kept", format!("…{forty}")),
            ("inserted", "MINE".into()),
            // Another change's deletion is the parent's text to this one.
            ("kept", "goneshort".into()),
            ("deleted", "cut".into()),
            ("kept", format!("{forty}…")),
        ]
    );
    let theirs: Vec<&str> = texts[&9].runs.iter().map(|r| r.kind).collect();
    assert_eq!(theirs, vec!["kept", "inserted", "deleted", "kept"]);
}

#[test]
fn parsing_reads_every_block_of_a_real_update() {
    let d = doc(5);
    let map = d.get_or_insert_map("meta");
    let xml = d.get_or_insert_xml_fragment("default");
    {
        let mut txn = d.transact_mut();
        yrs::Map::insert(&map, &mut txn, "k", "v");
        let p =
            yrs::XmlFragment::push_back(&xml, &mut txn, yrs::XmlElementPrelim::empty("paragraph"));
        yrs::XmlFragment::push_back(&p, &mut txn, yrs::XmlTextPrelim::new("hi 😀"));
        let _ = txn.get_or_insert_text("content");
    }
    let update = d
        .transact()
        .encode_state_as_update_v1(&StateVector::default());
    let parsed = parse_v1(&update).unwrap();
    let total: u32 = parsed.blocks.iter().map(|b| b.len).sum();
    // map entry, paragraph, text node, "hi 😀" (5 UTF-16 units).
    assert_eq!(total, 1 + 1 + 1 + 5);
    assert_eq!(
        parsed.blocks.iter().map(|b| b.start + b.len).max(),
        d.transact()
            .state_vector()
            .get(&yrs::ClientID::new(5))
            .into()
    );
}
