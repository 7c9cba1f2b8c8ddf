//! Reading an edit request: each member taken by name and checked for its JSON type, what
//! is left over refused, every refusal naming the operation (or condition) it is in.

use std::collections::HashMap;

use base64::Engine;
use serde_json::{Map as JsonMap, Value};
use yrs::updates::decoder::Decode;
use yrs::{Any, StateVector};

use super::{
    invalid, Contains, EditError, Edits, Node, Op, Part, Replace, MAX_EDIT_NAME, MAX_EDIT_OPS,
};
use crate::history::RootKind;

/// The members of one JSON object, taken one by one; what is left at the end is unknown.
struct Members<'a> {
    at: Part,
    what: &'static str,
    obj: &'a JsonMap<String, Value>,
    taken: Vec<&'static str>,
}

impl<'a> Members<'a> {
    fn new(at: Part, what: &'static str, value: &'a Value) -> Result<Members<'a>, EditError> {
        let obj = value
            .as_object()
            .ok_or_else(|| invalid(at.clone(), format!("{what} must be a JSON object")))?;
        Ok(Members {
            at,
            what,
            obj,
            taken: Vec::new(),
        })
    }

    fn err(&self, reason: impl Into<String>) -> EditError {
        invalid(self.at.clone(), reason)
    }

    fn has(&self, key: &str) -> bool {
        self.obj.contains_key(key)
    }

    fn take(&mut self, key: &'static str) -> Option<&'a Value> {
        self.taken.push(key);
        self.obj.get(key)
    }

    fn string(&mut self, key: &'static str) -> Result<Option<&'a str>, EditError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.err(format!("\"{key}\" must be a string"))),
        }
    }

    fn required_string(&mut self, key: &'static str) -> Result<&'a str, EditError> {
        self.string(key)?
            .ok_or_else(|| self.err(format!("\"{key}\" is missing")))
    }

    fn index(&mut self, key: &'static str) -> Result<Option<u32>, EditError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(format!(
                        "\"{key}\" must be a whole number from 0 to {}",
                        u32::MAX
                    ))
                }),
        }
    }

    fn required_index(&mut self, key: &'static str) -> Result<u32, EditError> {
        self.index(key)?
            .ok_or_else(|| self.err(format!("\"{key}\" is missing")))
    }

    fn flag(&mut self, key: &'static str) -> Result<bool, EditError> {
        match self.take(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(self.err(format!("\"{key}\" must be true or false"))),
        }
    }

    fn name(&mut self, key: &'static str) -> Result<String, EditError> {
        let name = self.required_string(key)?;
        if name.is_empty() || name.len() > MAX_EDIT_NAME {
            return Err(self.err(format!("\"{key}\" must be 1 to {MAX_EDIT_NAME} bytes long")));
        }
        Ok(name.to_owned())
    }

    /// Refuses any member not taken.
    fn done(self) -> Result<(), EditError> {
        let mut unknown: Vec<&String> = self
            .obj
            .keys()
            .filter(|k| !self.taken.contains(&k.as_str()))
            .collect();
        unknown.sort();
        match unknown.first() {
            None => Ok(()),
            Some(key) => {
                let mut allowed = self.taken.clone();
                allowed.sort();
                Err(self.err(format!(
                    "unknown key \"{key}\" for {} (its keys: {})",
                    self.what,
                    allowed.join(", ")
                )))
            }
        }
    }
}

/// Reads an edit request (the body of `POST /docs/{name}/edits`).
pub fn parse(body: &Value) -> Result<Edits, EditError> {
    let mut request = Members::new(Part::Request, "the request", body)?;
    let ops = match request.take("ops") {
        Some(Value::Array(ops)) => ops,
        Some(_) => return Err(request.err("\"ops\" must be an array of operations")),
        None => return Err(request.err("\"ops\" is missing")),
    };
    if ops.len() > MAX_EDIT_OPS {
        return Err(request.err(format!(
            "{} operations; an edit has at most {MAX_EDIT_OPS} (MAX_EDIT_OPS)",
            ops.len()
        )));
    }
    let conditions = match request.take("if_contains") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(c)) => c.as_slice(),
        Some(_) => return Err(request.err("\"if_contains\" must be an array")),
    };
    if conditions.len() > MAX_EDIT_OPS {
        return Err(request.err(format!(
            "\"if_contains\" has at most {MAX_EDIT_OPS} entries"
        )));
    }
    let state_vector = match request.take("state_vector") {
        None | Some(Value::Null) => None,
        Some(Value::String(b64)) => Some(state_vector(b64)?),
        Some(_) => {
            return Err(invalid(
                Part::StateVector(None),
                "must be a base64 Yjs v1 state vector",
            ))
        }
    };
    request.done()?;
    let ops = ops
        .iter()
        .enumerate()
        .map(|(i, op)| parse_op(i, op))
        .collect::<Result<Vec<Op>, EditError>>()?;
    let if_contains = conditions
        .iter()
        .enumerate()
        .map(|(i, c)| parse_contains(i, c))
        .collect::<Result<Vec<Contains>, EditError>>()?;
    Ok(Edits {
        ops,
        if_contains,
        state_vector,
    })
}

fn state_vector(b64: &str) -> Result<StateVector, EditError> {
    let engines = [
        base64::engine::general_purpose::STANDARD,
        base64::engine::general_purpose::URL_SAFE,
    ];
    let raw = engines
        .iter()
        .find_map(|e| e.decode(b64).ok())
        .or_else(|| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(b64)
                .ok()
        })
        .ok_or_else(|| invalid(Part::StateVector(None), "not base64"))?;
    crate::counts::check_state_vector(&raw)
        .ok()
        .and_then(|()| StateVector::decode_v1(&raw).ok())
        .ok_or_else(|| invalid(Part::StateVector(None), "not a Yjs v1 state vector"))
}

/// The root an operation names by its kind's key, and that kind.
fn root_of(m: &mut Members) -> Result<(RootKind, String), EditError> {
    let keys = [
        ("text", RootKind::Text),
        ("map", RootKind::Map),
        ("array", RootKind::Array),
        ("xml", RootKind::Xml),
    ];
    let named: Vec<_> = keys.iter().filter(|(k, _)| m.has(k)).collect();
    match named.as_slice() {
        [(key, kind)] => Ok((*kind, m.name(key)?)),
        [] => Err(m.err(
            "names no root: give one of \"text\", \"map\", \"array\" or \"xml\" with the root's name",
        )),
        _ => Err(m.err("names more than one root kind (\"text\", \"map\", \"array\", \"xml\")")),
    }
}

/// The one action key of an operation among `actions`.
fn action_of(m: &Members, kind: &str, actions: &[&'static str]) -> Result<&'static str, EditError> {
    let given: Vec<&'static str> = actions.iter().copied().filter(|a| m.has(a)).collect();
    match given.as_slice() {
        [one] => Ok(one),
        [] => Err(m.err(format!(
            "a {kind} operation needs one of {}",
            quoted(actions)
        ))),
        _ => Err(m.err(format!(
            "a {kind} operation takes only one of {}",
            quoted(actions)
        ))),
    }
}

fn quoted(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| format!("\"{k}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_op(i: usize, value: &Value) -> Result<Op, EditError> {
    let mut m = Members::new(Part::Op(i), "an operation", value)?;
    let (kind, root) = root_of(&mut m)?;
    let op = match kind {
        RootKind::Text => match action_of(&m, "text", &["insert", "delete", "replace"])? {
            "insert" => {
                m.what = "a text insert";
                let text = m.required_string("insert")?.to_owned();
                let at = m.index("at")?;
                Op::TextInsert { root, text, at }
            }
            "delete" => {
                m.what = "a text delete";
                let len = m.required_index("delete")?;
                let at = m.required_index("at")?;
                Op::TextDelete { root, len, at }
            }
            _ => {
                m.what = "a text replace";
                let replace = parse_replace(&mut m)?;
                Op::TextReplace { root, replace }
            }
        },
        RootKind::Map => match action_of(&m, "map", &["set", "delete"])? {
            "set" => {
                m.what = "a map set";
                let key = m.required_string("set")?.to_owned();
                let value = m
                    .take("value")
                    .ok_or_else(|| m.err("\"value\" is missing"))?;
                let size = json_size(value) + key.len();
                Op::MapSet {
                    root,
                    key,
                    value: any(value),
                    size,
                }
            }
            _ => {
                m.what = "a map delete";
                let key = m.required_string("delete")?.to_owned();
                Op::MapDelete { root, key }
            }
        },
        RootKind::Array => match action_of(&m, "array", &["insert", "delete", "push"])? {
            "delete" => {
                m.what = "an array delete";
                let len = m.required_index("delete")?;
                let at = m.required_index("at")?;
                Op::ArrayDelete { root, len, at }
            }
            action => {
                let push = action == "push";
                m.what = if push {
                    "an array push"
                } else {
                    "an array insert"
                };
                let values = match m.take(if push { "push" } else { "insert" }) {
                    Some(Value::Array(values)) => values,
                    _ => return Err(m.err(format!("\"{action}\" must be an array of values"))),
                };
                let at = if push {
                    None
                } else {
                    Some(m.required_index("at")?)
                };
                Op::ArrayInsert {
                    root,
                    size: values.iter().map(json_size).sum(),
                    values: values.iter().map(any).collect(),
                    at,
                }
            }
        },
        RootKind::Xml => match action_of(&m, "xml", &["append", "insert", "replace"])? {
            "replace" => {
                m.what = "an XML replace";
                let replace = parse_replace(&mut m)?;
                let element = m.index("element")?;
                Op::XmlReplace {
                    root,
                    replace,
                    element,
                }
            }
            action => {
                let append = action == "append";
                m.what = if append {
                    "an XML append"
                } else {
                    "an XML insert"
                };
                let node = m.take(action).unwrap_or(&Value::Null);
                let node = parse_node(i, node)?;
                let at = if append {
                    None
                } else {
                    Some(m.required_index("at")?)
                };
                Op::XmlInsert { root, node, at }
            }
        },
    };
    m.done()?;
    Ok(op)
}

fn parse_replace(m: &mut Members) -> Result<Replace, EditError> {
    let old = m.required_string("replace")?;
    if old.is_empty() {
        return Err(m.err("\"replace\" must not be empty"));
    }
    let new = m.required_string("with")?;
    let all = m.flag("all")?;
    Ok(Replace {
        old: old.to_owned(),
        new: new.to_owned(),
        all,
    })
}

/// A node to insert: `{"type": "heading", "attrs": {"level": 2}, "text": "Title"}`.
fn parse_node(i: usize, value: &Value) -> Result<Node, EditError> {
    let mut m = Members::new(Part::Op(i), "an XML node", value)?;
    let kind = m.name("type")?;
    let valid = kind.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && kind
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':'));
    if !valid {
        return Err(m.err(format!(
            "\"type\" {kind:?} is not a node type name (a letter, then letters, digits, '_', '-' or ':')"
        )));
    }
    let mut size = kind.len();
    let mut attrs = Vec::new();
    match m.take("attrs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (key, value) in map {
                if key.is_empty() || key.len() > MAX_EDIT_NAME {
                    return Err(m.err(format!(
                        "an attribute name must be 1 to {MAX_EDIT_NAME} bytes long"
                    )));
                }
                // y-prosemirror leaves a null attribute out; so does this.
                if !value.is_null() {
                    size += key.len() + json_size(value);
                    attrs.push((key.clone(), any(value)));
                }
            }
        }
        Some(_) => return Err(m.err("\"attrs\" must be an object")),
    }
    let text = m.string("text")?.map(str::to_owned);
    size += text.as_ref().map_or(0, String::len);
    m.done()?;
    Ok(Node {
        kind,
        attrs,
        text,
        size,
    })
}

fn parse_contains(i: usize, value: &Value) -> Result<Contains, EditError> {
    let mut m = Members::new(Part::IfContains(i), "a condition", value)?;
    let (kind, root) = match (m.has("text"), m.has("xml")) {
        (true, false) => (RootKind::Text, m.name("text")?),
        (false, true) => (RootKind::Xml, m.name("xml")?),
        _ => {
            return Err(m.err(
                "a condition names one text or XML root: {\"text\": root, \"value\": \"...\"}",
            ))
        }
    };
    let value = m.required_string("value")?.to_owned();
    m.done()?;
    Ok(Contains { root, kind, value })
}

/// A JSON value as a Yjs value: objects and arrays as plain (not shared) maps and arrays,
/// whole numbers as integers, others as floats.
fn any(value: &Value) -> Any {
    match value {
        Value::Null => Any::Null,
        Value::Bool(b) => Any::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Any::from(i),
            None => Any::from(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => Any::from(s.as_str()),
        Value::Array(items) => Any::from(items.iter().map(any).collect::<Vec<Any>>()),
        Value::Object(map) => Any::from(
            map.iter()
                .map(|(k, v)| (k.clone(), any(v)))
                .collect::<HashMap<String, Any>>(),
        ),
    }
}

/// Bytes of a value as JSON.
fn json_size(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(0, |v| v.len())
}
