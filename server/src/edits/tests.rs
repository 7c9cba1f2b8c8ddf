//! Every operation on every root kind, the preconditions and the refusals, on scratch
//! documents with fixed client ids.

use serde_json::{json, Value};
use yrs::types::Attrs;
use yrs::updates::decoder::Decode;
use yrs::{
    Any, Array, Doc, GetString, Map, ReadTxn, StateVector, Text, Transact, Update, Xml,
    XmlElementPrelim, XmlFragment, XmlOut, XmlTextPrelim,
};

use super::*;
use yrs::types::text::YChange;
use yrs::Out;

/// The client id the edits are made as.
pub(super) const EDITOR: u64 = 99;

/// A document by client 1 holding what `fill` writes (it takes its roots, then opens its
/// transaction: yrs takes the store to make a root), as a Yjs v1 state.
pub(super) fn state(fill: impl FnOnce(&Doc)) -> Vec<u8> {
    let doc = Doc::with_client_id(1);
    fill(&doc);
    let state = doc
        .transact()
        .encode_state_as_update_v1(&StateVector::default());
    state
}

/// `content` (text), `meta` (map), `list` (array) and `default` (a Tiptap fragment: a
/// heading and two paragraphs).
pub(super) fn sample() -> Vec<u8> {
    state(|doc| {
        let text = doc.get_or_insert_text("content");
        let meta = doc.get_or_insert_map("meta");
        let list = doc.get_or_insert_array("list");
        let xml = doc.get_or_insert_xml_fragment("default");
        let txn = &mut doc.transact_mut();
        text.insert(txn, 0, "old words and more old words");
        meta.insert(txn, "status", "review");
        meta.insert(txn, "count", 3);
        list.insert_range(txn, 0, [1, 2, 3]);
        let h = xml.push_back(txn, XmlElementPrelim::empty("heading"));
        h.insert_attribute(txn, "level", 1);
        h.push_back(txn, XmlTextPrelim::new("Title"));
        for words in ["first old words", "second old words"] {
            let p = xml.push_back(txn, XmlElementPrelim::empty("paragraph"));
            p.push_back(txn, XmlTextPrelim::new(words));
        }
    })
}

/// Parses and applies `body` to `current`; the document with the update applied, as a client
/// receiving it would hold it, and the outcome.
fn run(current: &[u8], body: Value) -> Result<(Doc, Outcome), EditError> {
    let edits = parse(&body)?;
    let outcome = apply(current, &edits, EDITOR)?;
    let doc = Doc::new();
    for u in [current, &outcome.update] {
        doc.transact_mut()
            .apply_update(Update::decode_v1(u).expect("decodes"))
            .expect("applies");
    }
    Ok((doc, outcome))
}

fn ok(current: &[u8], body: Value) -> (Doc, Outcome) {
    match run(current, body) {
        Ok(done) => done,
        Err(e) => panic!("refused: {e}"),
    }
}

fn err(current: &[u8], body: Value) -> EditError {
    match run(current, body) {
        Ok(_) => panic!("applied"),
        Err(e) => e,
    }
}

fn text(doc: &Doc, root: &str) -> String {
    let t = doc.get_or_insert_text(root);
    let s = t.get_string(&doc.transact());
    s
}

/// The map `meta` and the array `list` as JSON.
fn json(doc: &Doc) -> Value {
    use yrs::types::ToJson;
    let meta = doc.get_or_insert_map("meta");
    let list = doc.get_or_insert_array("list");
    let txn = doc.transact();
    let value = |any: Any| serde_json::to_value(any).expect("json");
    json!({"meta": value(meta.to_json(&txn)), "list": value(list.to_json(&txn))})
}

/// The top-level nodes of a fragment: (type, attributes as JSON, text).
fn nodes(doc: &Doc, root: &str) -> Vec<(String, Value, String)> {
    let xml = doc.get_or_insert_xml_fragment(root);
    let txn = doc.transact();
    xml.children(&txn)
        .map(|node| match node {
            XmlOut::Element(e) => {
                let attrs: serde_json::Map<String, Value> = e
                    .attributes(&txn)
                    .map(|(k, v)| {
                        let any = match v {
                            Out::Any(any) => any,
                            other => Any::from(other.to_string(&txn)),
                        };
                        (k.to_owned(), serde_json::to_value(&any).expect("json"))
                    })
                    .collect();
                let inner: String = e
                    .children(&txn)
                    .map(|c| match c {
                        XmlOut::Text(t) => t.get_string(&txn),
                        _ => String::new(),
                    })
                    .collect();
                (e.tag().to_string(), Value::Object(attrs), inner)
            }
            XmlOut::Text(t) => ("#text".into(), json!({}), t.get_string(&txn)),
            XmlOut::Fragment(_) => ("#fragment".into(), json!({}), String::new()),
        })
        .collect()
}

fn invalid_at(e: &EditError) -> Part {
    match e {
        EditError::Invalid { at, .. } => at.clone(),
        other => panic!("not a 400: {other}"),
    }
}

fn failed_at(e: &EditError) -> Part {
    match e {
        EditError::Failed { at, .. } => at.clone(),
        other => panic!("not a 409: {other}"),
    }
}

#[test]
fn text_insert_at_an_index_and_at_the_end() {
    let (doc, out) = ok(
        &sample(),
        json!({"ops": [
            {"text": "content", "insert": "NEW ", "at": 0},
            {"text": "content", "insert": "!"},
            {"text": "fresh", "insert": "a new root"}
        ]}),
    );
    assert_eq!(text(&doc, "content"), "NEW old words and more old words!");
    assert_eq!(text(&doc, "fresh"), "a new root");
    let inserted: Vec<u64> = out.changes.iter().map(|c| c.inserted).collect();
    assert_eq!(inserted, vec![4, 1, 10]);
    assert_eq!(out.changes[2].op, 2);
}

#[test]
fn text_indices_count_utf16_code_units() {
    let current = state(|doc| {
        let t = doc.get_or_insert_text("t");
        t.insert(&mut doc.transact_mut(), 0, "a😀b");
    });
    // "😀" is two code units: "b" is at 3.
    let (doc, out) = ok(
        &current,
        json!({"ops": [{"text": "t", "insert": "é", "at": 3}]}),
    );
    assert_eq!(text(&doc, "t"), "a😀éb");
    assert_eq!(out.changes[0].inserted, 1);
    let (doc, _) = ok(
        &current,
        json!({"ops": [{"text": "t", "delete": 2, "at": 1}]}),
    );
    assert_eq!(text(&doc, "t"), "ab");
    // Between the halves of the emoji: refused, never half a character.
    let e = err(
        &current,
        json!({"ops": [{"text": "t", "insert": "x", "at": 2}]}),
    );
    assert_eq!(invalid_at(&e), Part::Op(0));
    assert!(e.to_string().contains("inside a character"), "{e}");
    let e = err(
        &current,
        json!({"ops": [{"text": "t", "delete": 1, "at": 1}]}),
    );
    assert!(e.to_string().contains("inside a character"), "{e}");
}

#[test]
fn text_delete_a_range() {
    let (doc, out) = ok(
        &sample(),
        json!({"ops": [{"text": "content", "delete": 4, "at": 0}]}),
    );
    assert_eq!(text(&doc, "content"), "words and more old words");
    assert_eq!(out.changes[0].deleted, 4);
    let e = err(
        &sample(),
        json!({"ops": [{"text": "content", "delete": 4, "at": 26}]}),
    );
    assert_eq!(invalid_at(&e), Part::Op(0));
    assert!(e.to_string().contains("past the text's end"), "{e}");
}

#[test]
fn text_replace_the_first_or_every_occurrence() {
    let body = |all: bool| json!({"ops": [{"text": "content", "replace": "old words", "with": "new words", "all": all}]});
    let (doc, out) = ok(&sample(), body(false));
    assert_eq!(text(&doc, "content"), "new words and more old words");
    assert_eq!(
        out.changes[0],
        Change {
            op: 0,
            inserted: 9,
            deleted: 9,
            replaced: 1
        }
    );
    let (doc, out) = ok(&sample(), body(true));
    assert_eq!(text(&doc, "content"), "new words and more new words");
    assert_eq!(out.changes[0].replaced, 2);
    // Replaced by nothing: removed.
    let (doc, _) = ok(
        &sample(),
        json!({"ops": [{"text": "content", "replace": " and more old words", "with": ""}]}),
    );
    assert_eq!(text(&doc, "content"), "old words");
    // Nothing to replace: the precondition fails (409), naming the operation.
    let e = err(
        &sample(),
        json!({"ops": [
            {"text": "content", "insert": "x"},
            {"text": "content", "replace": "absent", "with": "y"}
        ]}),
    );
    assert_eq!(failed_at(&e), Part::Op(1));
    assert_eq!(e.current(), Some(json!({"op": 1})));
}

#[test]
fn a_replace_keeps_the_formatting_around_it_and_counts_embeds_as_one() {
    let current = state(|doc| {
        let t = doc.get_or_insert_text("rich");
        let txn = &mut doc.transact_mut();
        t.insert(txn, 0, "plain  end");
        let bold = Attrs::from([("bold".into(), Any::Bool(true))]);
        t.insert_with_attributes(txn, 6, "bold words", bold);
        // An embed (an image, as Quill writes one): one unit.
        let image = Any::from(HashMap::from([("image".to_owned(), Any::from("a.png"))]));
        t.insert_embed(txn, 16, image);
    });
    let (doc, _) = ok(
        &current,
        json!({"ops": [
            {"text": "rich", "replace": "words", "with": "text"},
            {"text": "rich", "insert": "!", "at": 16}
        ]}),
    );
    let t = doc.get_or_insert_text("rich");
    let txn = doc.transact();
    let chunks = t.diff(&txn, YChange::identity);
    let mut rendered = String::new();
    let mut bold = String::new();
    for c in &chunks {
        let s = match &c.insert {
            Out::Any(Any::String(s)) => s.to_string(),
            _ => "[image]".into(),
        };
        if c.attributes
            .as_ref()
            .is_some_and(|a| a.contains_key("bold"))
        {
            bold.push_str(&s);
        }
        rendered.push_str(&s);
    }
    assert_eq!(rendered, "plain bold text[image]! end");
    assert!(
        bold.starts_with("bold text"),
        "the replacement is bold: {bold:?}"
    );
}

#[test]
fn map_set_and_delete() {
    let (doc, out) = ok(
        &sample(),
        json!({"ops": [
            {"map": "meta", "set": "status", "value": "draft"},
            {"map": "meta", "set": "tags", "value": {"a": [1, 2.5, null, true]}},
            {"map": "meta", "delete": "count"},
            {"map": "meta", "delete": "never-there"}
        ]}),
    );
    assert_eq!(
        json(&doc)["meta"],
        json!({"status": "draft", "tags": {"a": [1, 2.5, null, true]}})
    );
    let counts: Vec<(u64, u64)> = out
        .changes
        .iter()
        .map(|c| (c.inserted, c.deleted))
        .collect();
    assert_eq!(counts, vec![(1, 1), (1, 0), (0, 1), (0, 0)]);
    // A whole number stays a number (a Yjs integer), not a string.
    let (doc, _) = ok(
        &sample(),
        json!({"ops": [{"map": "meta", "set": "n", "value": 7}]}),
    );
    let n = doc.get_or_insert_map("meta").get(&doc.transact(), "n");
    assert_eq!(n, Some(Out::Any(Any::from(7))));
}

#[test]
fn array_insert_delete_and_push() {
    let (doc, out) = ok(
        &sample(),
        json!({"ops": [
            {"array": "list", "insert": ["a", {"b": 1}], "at": 1},
            {"array": "list", "delete": 1, "at": 0},
            {"array": "list", "push": [4, [5]]},
            {"array": "new-list", "push": []}
        ]}),
    );
    assert_eq!(json(&doc)["list"], json!(["a", {"b": 1}, 2, 3, 4, [5]]));
    let counts: Vec<(u64, u64)> = out
        .changes
        .iter()
        .map(|c| (c.inserted, c.deleted))
        .collect();
    assert_eq!(counts, vec![(2, 0), (0, 1), (2, 0), (0, 0)]);
    let e = err(
        &sample(),
        json!({"ops": [{"array": "list", "insert": [0], "at": 4}]}),
    );
    assert!(
        e.to_string()
            .contains("op 0: \"at\" 4 is past the array's end"),
        "{e}"
    );
    let e = err(
        &sample(),
        json!({"ops": [{"array": "list", "delete": 2, "at": 2}]}),
    );
    assert_eq!(invalid_at(&e), Part::Op(0));
}

#[test]
fn xml_append_and_insert_paragraphs_and_headings_as_tiptap_stores_them() {
    let (doc, out) = ok(
        &sample(),
        json!({"ops": [
            {"xml": "default", "append": {"type": "paragraph", "text": "the end"}},
            {"xml": "default", "insert": {"type": "heading", "attrs": {"level": 2, "id": null}, "text": "Part two"}, "at": 1},
            {"xml": "default", "append": {"type": "horizontalRule"}}
        ]}),
    );
    assert_eq!(
        nodes(&doc, "default"),
        vec![
            ("heading".into(), json!({"level": 1}), "Title".into()),
            ("heading".into(), json!({"level": 2}), "Part two".into()),
            ("paragraph".into(), json!({}), "first old words".into()),
            ("paragraph".into(), json!({}), "second old words".into()),
            ("paragraph".into(), json!({}), "the end".into()),
            ("horizontalRule".into(), json!({}), String::new()),
        ]
    );
    assert!(out.changes.iter().all(|c| c.inserted == 1));
    // The level is a number, as y-prosemirror writes it (not the string "2").
    let xml = doc.get_or_insert_xml_fragment("default");
    let txn = doc.transact();
    let Some(XmlOut::Element(heading)) = xml.get(&txn, 1) else {
        panic!("an element");
    };
    assert_eq!(
        heading.get_attribute(&txn, "level"),
        Some(Out::Any(Any::from(2)))
    );
    // An XML root that does not exist yet is made.
    let (doc, _) = ok(
        &sample(),
        json!({"ops": [{"xml": "notes", "append": {"type": "paragraph", "text": "hi"}}]}),
    );
    assert_eq!(
        nodes(&doc, "notes"),
        vec![("paragraph".into(), json!({}), "hi".into())]
    );
    let e = err(
        &sample(),
        json!({"ops": [{"xml": "default", "insert": {"type": "paragraph"}, "at": 4}]}),
    );
    assert!(e.to_string().contains("past the fragment's end"), "{e}");
}

#[test]
fn xml_replace_text_inside_the_fragment_or_one_element() {
    let replace = |all: bool, element: Option<u32>| {
        let mut op = json!({"xml": "default", "replace": "old", "with": "new", "all": all});
        if let Some(e) = element {
            op["element"] = json!(e);
        }
        json!({ "ops": [op] })
    };
    let texts = |doc: &Doc| -> Vec<String> {
        nodes(doc, "default")
            .into_iter()
            .map(|(_, _, t)| t)
            .collect()
    };
    let (doc, out) = ok(&sample(), replace(false, None));
    assert_eq!(
        texts(&doc),
        vec!["Title", "first new words", "second old words"]
    );
    assert_eq!(out.changes[0].replaced, 1);
    let (doc, out) = ok(&sample(), replace(true, None));
    assert_eq!(
        texts(&doc),
        vec!["Title", "first new words", "second new words"]
    );
    assert_eq!(out.changes[0].replaced, 2);
    let (doc, _) = ok(&sample(), replace(true, Some(2)));
    assert_eq!(
        texts(&doc),
        vec!["Title", "first old words", "second new words"]
    );
    // Not in the heading: 409 naming the op; no node 7: 400.
    let e = err(&sample(), replace(false, Some(0)));
    assert_eq!(failed_at(&e), Part::Op(0));
    let e = err(&sample(), replace(false, Some(7)));
    assert_eq!(invalid_at(&e), Part::Op(0));
    assert!(e.to_string().contains("past the fragment's end"), "{e}");
}

#[test]
fn if_contains_holds_or_nothing_is_applied() {
    let body = |value: &str| {
        json!({
            "ops": [{"text": "content", "insert": "!"}],
            "if_contains": [{"text": "content", "value": "more"}, {"xml": "default", "value": value}]
        })
    };
    ok(&sample(), body("second old"));
    let e = err(&sample(), body("third"));
    assert_eq!(failed_at(&e), Part::IfContains(1));
    assert_eq!(e.current(), Some(json!({"if_contains": 1})));
    // A missing root contains nothing.
    let e = err(
        &sample(),
        json!({"ops": [], "if_contains": [{"text": "nowhere", "value": "x"}]}),
    );
    assert_eq!(failed_at(&e), Part::IfContains(0));
    // A condition on a root of another kind is malformed.
    let e = err(
        &sample(),
        json!({"ops": [], "if_contains": [{"text": "meta", "value": "x"}]}),
    );
    assert_eq!(invalid_at(&e), Part::IfContains(0));
}

#[test]
fn a_state_vector_precondition_holds_only_at_that_state() {
    let current = sample();
    let doc = Doc::new();
    doc.transact_mut()
        .apply_update(Update::decode_v1(&current).expect("u"))
        .expect("apply");
    let sv =
        base64::engine::general_purpose::STANDARD.encode(doc.transact().state_vector().encode_v1());
    let body = |sv: &str| json!({"ops": [{"text": "content", "insert": "!"}], "state_vector": sv});
    let (_, out) = ok(&current, body(&sv));
    assert_eq!(out.base, doc.transact().state_vector());
    // The state vector of the empty document: the document has moved on since.
    let e = err(&current, body("AA=="));
    assert_eq!(e.current(), Some(json!({"state_vector": sv})));
    let e = err(&current, body("not base64!"));
    assert_eq!(invalid_at(&e), Part::StateVector(None));
}

#[test]
fn every_op_goes_into_one_update_by_the_given_client() {
    let (doc, out) = ok(
        &sample(),
        json!({"ops": [
            {"text": "content", "replace": "old words", "with": "new words"},
            {"map": "meta", "set": "status", "value": "draft"},
            {"array": "list", "push": [4]},
            {"xml": "default", "append": {"type": "paragraph", "text": "more"}}
        ]}),
    );
    let update = Update::decode_v1(&out.update).expect("u");
    let clients: Vec<u64> = update
        .state_vector_lower()
        .iter()
        .map(|(c, _)| c.get())
        .collect();
    assert_eq!(clients, vec![EDITOR]);
    assert_eq!(
        StateVector::decode_v1(&out.state_vector).expect("sv"),
        doc.transact().state_vector()
    );
    assert_eq!(json(&doc)["meta"]["status"], "draft");
}

#[test]
fn a_root_is_used_as_the_kind_it_holds() {
    // A text op on a map.
    let e = err(
        &sample(),
        json!({"ops": [{"text": "content", "insert": "ok"}, {"text": "meta", "insert": "x"}]}),
    );
    assert_eq!(invalid_at(&e), Part::Op(1));
    assert!(
        e.to_string().contains("root \"meta\" is a map, not a text"),
        "{e}"
    );
    // A Tiptap fragment read from an update (no declared type) is XML, not an array.
    let e = err(
        &sample(),
        json!({"ops": [{"array": "default", "push": [1]}]}),
    );
    assert!(e.to_string().contains("is an XML fragment"), "{e}");
    // Two ops using a new root as two kinds.
    let e = err(
        &sample(),
        json!({"ops": [{"map": "new", "set": "a", "value": 1}, {"array": "new", "push": [1]}]}),
    );
    assert!(
        e.to_string()
            .contains("op 1: root \"new\" is used as a map by op 0"),
        "{e}"
    );
    // A root emptied of everything takes any kind.
    let emptied = state(|doc| {
        let t = doc.get_or_insert_text("gone");
        let txn = &mut doc.transact_mut();
        t.insert(txn, 0, "abc");
        t.remove_range(txn, 0, 3);
    });
    let (doc, _) = ok(
        &emptied,
        json!({"ops": [{"text": "gone", "insert": "back"}]}),
    );
    assert_eq!(text(&doc, "gone"), "back");
}

#[test]
fn malformed_requests_name_the_op_and_the_reason() {
    let cases = [
        (
            json!([]),
            Part::Request,
            "the request must be a JSON object",
        ),
        (json!({}), Part::Request, "\"ops\" is missing"),
        (
            json!({"ops": {}}),
            Part::Request,
            "\"ops\" must be an array",
        ),
        (
            json!({"ops": [], "extra": 1}),
            Part::Request,
            "unknown key \"extra\"",
        ),
        (
            json!({"ops": [7]}),
            Part::Op(0),
            "an operation must be a JSON object",
        ),
        (
            json!({"ops": [{"insert": "x"}]}),
            Part::Op(0),
            "names no root",
        ),
        (
            json!({"ops": [{"text": "a", "map": "b", "insert": "x"}]}),
            Part::Op(0),
            "more than one root kind",
        ),
        (
            json!({"ops": [{"text": "a"}]}),
            Part::Op(0),
            "needs one of \"insert\", \"delete\", \"replace\"",
        ),
        (
            json!({"ops": [{"text": "a", "insert": "x", "delete": 1}]}),
            Part::Op(0),
            "takes only one of",
        ),
        (
            json!({"ops": [{"text": "a", "insert": "x", "at": 0, "with": "y"}]}),
            Part::Op(0),
            "unknown key \"with\" for a text insert (its keys: at, insert, text)",
        ),
        (
            json!({"ops": [{"text": "a", "insert": 5}]}),
            Part::Op(0),
            "\"insert\" must be a string",
        ),
        (
            json!({"ops": [{"text": "a", "insert": "x", "at": -1}]}),
            Part::Op(0),
            "\"at\" must be a whole number",
        ),
        (
            json!({"ops": [{"text": "a", "insert": "x", "at": 1.5}]}),
            Part::Op(0),
            "\"at\" must be a whole number",
        ),
        (
            json!({"ops": [{"text": "a", "delete": 1}]}),
            Part::Op(0),
            "\"at\" is missing",
        ),
        (
            json!({"ops": [{"text": "a", "replace": "x"}]}),
            Part::Op(0),
            "\"with\" is missing",
        ),
        (
            json!({"ops": [{"text": "a", "replace": "", "with": "y"}]}),
            Part::Op(0),
            "must not be empty",
        ),
        (
            json!({"ops": [{"text": "a", "replace": "x", "with": "y", "all": "yes"}]}),
            Part::Op(0),
            "\"all\" must be true or false",
        ),
        (
            json!({"ops": [{"text": "", "insert": "x"}]}),
            Part::Op(0),
            "\"text\" must be 1 to 255 bytes",
        ),
        (
            json!({"ops": [{"map": "m", "set": "k"}]}),
            Part::Op(0),
            "\"value\" is missing",
        ),
        (
            json!({"ops": [{"map": "m", "delete": 3}]}),
            Part::Op(0),
            "\"delete\" must be a string",
        ),
        (
            json!({"ops": [{"array": "l", "insert": 1, "at": 0}]}),
            Part::Op(0),
            "\"insert\" must be an array of values",
        ),
        (
            json!({"ops": [{"array": "l", "insert": [1]}]}),
            Part::Op(0),
            "\"at\" is missing",
        ),
        (
            json!({"ops": [{"array": "l", "push": [1], "at": 0}]}),
            Part::Op(0),
            "unknown key \"at\" for an array push",
        ),
        (
            json!({"ops": [{"xml": "x", "append": "text"}]}),
            Part::Op(0),
            "an XML node must be a JSON object",
        ),
        (
            json!({"ops": [{"xml": "x", "append": {"text": "t"}}]}),
            Part::Op(0),
            "\"type\" is missing",
        ),
        (
            json!({"ops": [{"xml": "x", "append": {"type": "<p>"}}]}),
            Part::Op(0),
            "is not a node type name",
        ),
        (
            json!({"ops": [{"xml": "x", "append": {"type": "p", "attrs": [1]}}]}),
            Part::Op(0),
            "\"attrs\" must be an object",
        ),
        (
            json!({"ops": [{"xml": "x", "append": {"type": "p", "marks": []}}]}),
            Part::Op(0),
            "unknown key \"marks\" for an XML node",
        ),
        (
            json!({"ops": [{"xml": "x", "insert": {"type": "p"}}]}),
            Part::Op(0),
            "\"at\" is missing",
        ),
        (
            json!({"ops": [{"xml": "x", "replace": "a", "with": "b", "element": "1"}]}),
            Part::Op(0),
            "\"element\" must be a whole number",
        ),
        (
            json!({"ops": [], "if_contains": [{"map": "m", "value": "x"}]}),
            Part::IfContains(0),
            "names one text or XML root",
        ),
        (
            json!({"ops": [], "if_contains": [{"text": "t"}]}),
            Part::IfContains(0),
            "\"value\" is missing",
        ),
        (
            json!({"ops": [], "state_vector": 5}),
            Part::StateVector(None),
            "must be a base64",
        ),
    ];
    for (body, at, reason) in cases {
        let e = match parse(&body) {
            Ok(_) => panic!("accepted {body}"),
            Err(e) => e,
        };
        assert_eq!(invalid_at(&e), at, "{body}: {e}");
        assert!(
            e.to_string().contains(reason),
            "{body}: {e} (wanted {reason:?})"
        );
    }
    // The index of the bad op, after good ones.
    let e = parse(&json!({"ops": [
        {"text": "a", "insert": "x"},
        {"map": "m", "set": "k", "value": 1},
        {"array": "l", "remove": 1}
    ]}))
    .expect_err("refused");
    assert_eq!(e.current(), Some(json!({"op": 2})));
    assert!(e.to_string().starts_with("op 2: "), "{e}");
}

#[test]
fn the_bounds_are_held() {
    let many: Vec<Value> = (0..=MAX_EDIT_OPS)
        .map(|_| json!({"text": "t", "insert": "x"}))
        .collect();
    let e = parse(&json!({ "ops": many })).expect_err("too many");
    assert!(e.to_string().contains("MAX_EDIT_OPS"), "{e}");
    // A replace of every occurrence cannot multiply a body into more than the budget.
    let current = state(|doc| {
        let t = doc.get_or_insert_text("t");
        t.insert(&mut doc.transact_mut(), 0, &"a".repeat(100));
    });
    let big = "x".repeat(MAX_EDIT_INSERT_BYTES / 50);
    let e = err(
        &current,
        json!({"ops": [{"text": "t", "replace": "a", "with": big, "all": true}]}),
    );
    assert_eq!(invalid_at(&e), Part::Op(0));
    assert!(e.to_string().contains("MAX_EDIT_INSERT_BYTES"), "{e}");
}

#[test]
fn ops_apply_in_order_each_on_what_the_ones_before_left() {
    let (doc, _) = ok(
        &sample(),
        json!({"ops": [
            {"text": "content", "delete": 28, "at": 0},
            {"text": "content", "insert": "abc", "at": 0},
            {"text": "content", "insert": "X", "at": 3},
            {"text": "content", "replace": "bcX", "with": "-"}
        ]}),
    );
    assert_eq!(text(&doc, "content"), "a-");
    // An index valid before an earlier op shortened the text is not valid after it.
    let e = err(
        &sample(),
        json!({"ops": [
            {"text": "content", "delete": 20, "at": 0},
            {"text": "content", "insert": "x", "at": 20}
        ]}),
    );
    assert_eq!(invalid_at(&e), Part::Op(1));
}

#[test]
fn a_state_that_does_not_decode_is_no_edit() {
    let edits = parse(&json!({"ops": []})).expect("parse");
    assert!(matches!(
        apply(b"\xff\xff\xff", &edits, EDITOR),
        Err(EditError::Stored(_))
    ));
    // The empty document takes edits (its state is the empty update).
    let (doc, _) = ok(&[0, 0], json!({"ops": [{"text": "t", "insert": "first"}]}));
    assert_eq!(text(&doc, "t"), "first");
}
