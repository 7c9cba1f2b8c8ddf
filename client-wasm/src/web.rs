//! The browser transport and the JavaScript API (wasm-bindgen). The contract is written out in
//! `quire-client.d.ts`; README.md shows it in use.
//!
//! Everything runs on the page's one thread. Re-entrancy rules:
//! - observers of texts, maps and arrays are queued while a transaction runs and called after it
//!   (like Yjs), so a callback may read or edit the document;
//! - client events (status, synced, saved, awareness, closed) are called after every borrow of
//!   the client's state is released.
//!
//! One file per JavaScript class: `client.rs` (`QuireClient`), `text.rs` (`QuireText`),
//! `map.rs` (`QuireMap`), `array.rs` (`QuireArray`); `inner.rs` holds the client's state and
//! its socket, which the classes share.

mod array;
mod client;
mod inner;
mod map;
mod text;

pub use array::QuireArray;
pub use map::QuireMap;
pub use text::QuireText;

use inner::{Inner, JsOptions};

use crate::session::{Event, Session, Shared, REMOTE};
use crate::{backoff_delay, document_url, is_permanent_close, Status};

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use js_sys::{Array, Function, Object, Reflect, Uint8Array};
use serde::Deserialize;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{BinaryType, CloseEvent, MessageEvent, WebSocket};
use yrs::types::text::TextEvent;
use yrs::types::{Change, Delta, EntryChange, ToJson};
use yrs::updates::decoder::Decode;
use yrs::ReadTxn;
use yrs::{
    Any, Array as _, ArrayRef, Assoc, Doc, GetString, IndexedSequence, Map as _, MapRef,
    Observable, OffsetKind, Options, Origin, Out, StickyIndex, Text as _, TextRef, Transact,
    TransactionMut,
};

#[wasm_bindgen]
extern "C" {
    #[wasm_bindgen(js_name = setTimeout)]
    fn set_timeout(callback: &JsValue, ms: f64) -> JsValue;
    #[wasm_bindgen(js_name = clearTimeout)]
    fn clear_timeout(id: &JsValue);
}

fn now_ms() -> u64 {
    js_sys::Date::now() as u64
}

fn js_err(msg: impl std::fmt::Display) -> JsValue {
    js_sys::Error::new(&msg.to_string()).into()
}

fn to_js<T: serde::Serialize + ?Sized>(value: &T) -> Result<JsValue, JsValue> {
    value
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .map_err(js_err)
}

fn is_local(txn: &TransactionMut) -> bool {
    txn.origin() != Some(&Origin::from(REMOTE))
}

fn busy(e: impl std::fmt::Display) -> JsValue {
    js_err(format!("the document is busy: {e}"))
}

fn out_to_js(txn: &impl yrs::ReadTxn, value: &Out) -> Result<JsValue, JsValue> {
    to_js(&value.to_json(txn))
}

fn any_from_js(value: JsValue) -> Result<Any, JsValue> {
    serde_wasm_bindgen::from_value(value).map_err(js_err)
}

thread_local! {
    static SUBSCRIPTIONS: Cell<u32> = const { Cell::new(0) };
}

fn next_subscription() -> u32 {
    SUBSCRIPTIONS.with(|c| {
        let id = c.get() + 1;
        c.set(id);
        id
    })
}
