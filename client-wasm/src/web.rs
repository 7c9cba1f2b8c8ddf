//! The browser transport and the JavaScript API (wasm-bindgen). The contract is written out in
//! `quire-client.d.ts`; README.md shows it in use.
//!
//! Everything runs on the page's one thread. Re-entrancy rules:
//! - observers of texts, maps and arrays are queued while a transaction runs and called after it
//!   (like Yjs), so a callback may read or edit the document;
//! - client events (status, synced, saved, awareness, closed) are called after every borrow of
//!   the client's state is released.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
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

use std::sync::Arc;

use crate::session::{Event, Session, Shared, REMOTE};
use crate::{backoff_delay, document_url, is_permanent_close, Status};

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

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct JsOptions {
    token: Option<String>,
    min_backoff_ms: Option<f64>,
    max_backoff_ms: Option<f64>,
}

/// Observer calls waiting for the transaction to end.
type Deferred = Rc<RefCell<Vec<(Function, JsValue, bool)>>>;

struct Socket {
    ws: WebSocket,
    _on_open: Closure<dyn FnMut()>,
    _on_message: Closure<dyn FnMut(MessageEvent)>,
    _on_close: Closure<dyn FnMut(CloseEvent)>,
    _on_error: Closure<dyn FnMut(web_sys::Event)>,
}

impl Socket {
    fn detach(&self) {
        self.ws.set_onopen(None);
        self.ws.set_onmessage(None);
        self.ws.set_onclose(None);
        self.ws.set_onerror(None);
    }
}

#[derive(Default)]
struct Listeners {
    by_event: HashMap<String, Vec<Function>>,
}

struct Inner {
    session: RefCell<Session>,
    /// Counters and awareness, readable without borrowing the session.
    shared: Arc<Shared>,
    doc: Doc,
    deferred: Deferred,
    /// True while deferred observer calls are being delivered (nested calls wait their turn).
    delivering: Cell<bool>,
    server: String,
    document: String,
    token: RefCell<Option<String>>,
    /// `options.tokenProvider`: called before every connection attempt for the token to use.
    token_provider: Option<Function>,
    /// When the current socket last received anything (ms since the epoch).
    heard: Cell<f64>,
    destroyed: Cell<bool>,
    min_backoff: Duration,
    max_backoff: Duration,
    socket: RefCell<Option<Socket>>,
    /// Bumped for every socket, so late events of an old one are ignored.
    generation: Cell<u64>,
    status: Cell<Status>,
    synced: Cell<bool>,
    unsaved: Cell<u64>,
    want_online: Cell<bool>,
    attempt: Cell<u32>,
    reconnect_timer: RefCell<Option<JsValue>>,
    refresh_timer: RefCell<Option<JsValue>>,
    flush_scheduled: Cell<bool>,
    listeners: RefCell<Listeners>,
    /// whenSynced / whenSaved promises: (resolve, reject, wants saved).
    waiters: RefCell<Vec<(Function, Function, bool)>>,
    /// Events collected while state was borrowed, delivered by `dispatch`.
    pending: RefCell<Vec<(String, Vec<JsValue>)>>,
}

/// A client for one document on a Quire server (or any y-websocket server; durable
/// acknowledgements need Quire).
#[wasm_bindgen]
pub struct QuireClient {
    inner: Rc<Inner>,
}

#[wasm_bindgen]
impl QuireClient {
    #[wasm_bindgen(constructor)]
    pub fn new(
        server_url: &str,
        document: &str,
        options: Option<JsValue>,
    ) -> Result<QuireClient, JsValue> {
        let token_provider = options
            .as_ref()
            .filter(|v| v.is_object())
            .and_then(|v| Reflect::get(v, &"tokenProvider".into()).ok())
            .and_then(|f| f.dyn_into::<Function>().ok());
        let options: JsOptions = match options {
            Some(v) if !v.is_undefined() && !v.is_null() => {
                serde_wasm_bindgen::from_value(v).map_err(js_err)?
            }
            _ => JsOptions::default(),
        };
        let doc = Doc::with_options(Options {
            // JavaScript strings (and CodeMirror positions) count UTF-16 code units.
            offset_kind: OffsetKind::Utf16,
            ..Options::default()
        });
        let session = Session::new(doc.clone(), now_ms as fn() -> u64, None);
        let ms = |v: Option<f64>, default: Duration| {
            v.filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| Duration::from_millis(v as u64))
                .unwrap_or(default)
        };
        let inner = Rc::new(Inner {
            shared: session.shared().clone(),
            session: RefCell::new(session),
            doc,
            deferred: Rc::default(),
            delivering: Cell::new(false),
            server: server_url.to_owned(),
            document: document.to_owned(),
            token: RefCell::new(options.token),
            token_provider,
            heard: Cell::new(0.0),
            destroyed: Cell::new(false),
            min_backoff: ms(options.min_backoff_ms, crate::MIN_BACKOFF),
            max_backoff: ms(options.max_backoff_ms, crate::MAX_BACKOFF),
            socket: RefCell::new(None),
            generation: Cell::new(0),
            status: Cell::new(Status::Connecting),
            synced: Cell::new(false),
            unsaved: Cell::new(0),
            want_online: Cell::new(true),
            attempt: Cell::new(0),
            reconnect_timer: RefCell::new(None),
            refresh_timer: RefCell::new(None),
            flush_scheduled: Cell::new(false),
            listeners: RefCell::default(),
            waiters: RefCell::default(),
            pending: RefCell::default(),
        });
        Inner::open(&inner);
        Ok(QuireClient { inner })
    }

    #[wasm_bindgen(getter, js_name = clientId)]
    pub fn client_id(&self) -> f64 {
        self.inner.doc.client_id().get() as f64
    }

    #[wasm_bindgen(getter)]
    pub fn status(&self) -> String {
        self.inner.status.get().as_str().to_owned()
    }

    #[wasm_bindgen(getter)]
    pub fn synced(&self) -> bool {
        self.inner.synced.get()
    }

    #[wasm_bindgen(getter)]
    pub fn unsaved(&self) -> f64 {
        self.inner.unsaved.get() as f64
    }

    #[wasm_bindgen(js_name = getText)]
    pub fn get_text(&self, name: &str) -> QuireText {
        QuireText {
            text: self.inner.doc.get_or_insert_text(name),
            inner: self.inner.clone(),
        }
    }

    #[wasm_bindgen(js_name = getMap)]
    pub fn get_map(&self, name: &str) -> QuireMap {
        QuireMap {
            map: self.inner.doc.get_or_insert_map(name),
            inner: self.inner.clone(),
        }
    }

    #[wasm_bindgen(js_name = getArray)]
    pub fn get_array(&self, name: &str) -> QuireArray {
        QuireArray {
            array: self.inner.doc.get_or_insert_array(name),
            inner: self.inner.clone(),
        }
    }

    /// Sets this client's awareness state (a JSON-serialisable object) or clears it (null).
    #[wasm_bindgen(js_name = setLocalState)]
    pub fn set_local_state(&self, state: JsValue) -> Result<(), JsValue> {
        let json = if state.is_null() || state.is_undefined() {
            None
        } else {
            Some(String::from(js_sys::JSON::stringify(&state)?))
        };
        self.inner.set_local_state(json);
        Ok(())
    }

    #[wasm_bindgen(js_name = setLocalStateField)]
    pub fn set_local_state_field(&self, field: &str, value: JsValue) -> Result<(), JsValue> {
        let state = self.get_local_state()?;
        let state = if state.is_object() {
            state
        } else {
            Object::new().into()
        };
        Reflect::set(&state, &JsValue::from_str(field), &value)?;
        self.set_local_state(state)
    }

    #[wasm_bindgen(js_name = getLocalState)]
    pub fn get_local_state(&self) -> Result<JsValue, JsValue> {
        let json = self.inner.shared.local_state();
        match json {
            Some(json) => js_sys::JSON::parse(&json),
            None => Ok(JsValue::NULL),
        }
    }

    /// Every present client's awareness state (this one's included), keyed by client id.
    #[wasm_bindgen(js_name = getStates)]
    pub fn get_states(&self) -> Result<js_sys::Map, JsValue> {
        let states = self.inner.shared.states();
        let map = js_sys::Map::new();
        for (id, json) in states {
            // A peer's state that is not JSON is skipped, not fatal for everyone else.
            if let Ok(state) = js_sys::JSON::parse(&json) {
                map.set(&JsValue::from_f64(id.get() as f64), &state);
            }
        }
        Ok(map)
    }

    /// Subscribes to `status`, `synced`, `saved`, `awareness` or `closed`.
    pub fn on(&self, event: &str, callback: Function) {
        self.inner
            .listeners
            .borrow_mut()
            .by_event
            .entry(event.to_owned())
            .or_default()
            .push(callback);
    }

    pub fn off(&self, event: &str, callback: &Function) {
        if let Some(list) = self.inner.listeners.borrow_mut().by_event.get_mut(event) {
            list.retain(|f| f != callback);
        }
    }

    /// Resolves once connected and synced.
    #[wasm_bindgen(js_name = whenSynced)]
    pub fn when_synced(&self) -> js_sys::Promise {
        self.inner.waiter(false)
    }

    /// Resolves once synced with every local change committed on the server.
    #[wasm_bindgen(js_name = whenSaved)]
    pub fn when_saved(&self) -> js_sys::Promise {
        self.inner.waiter(true)
    }

    /// Goes offline on purpose; edits keep working and are sent by `connect()`.
    pub fn disconnect(&self) {
        self.inner.want_online.set(false);
        Inner::cancel_reconnect(&self.inner);
        Inner::drop_socket(&self.inner, 1000, "disconnect");
        Inner::went_offline(&self.inner);
    }

    /// Back online; also restarts a client stopped by a permanent close (say, after
    /// `setToken` following 4403). Not after `destroy()`.
    pub fn connect(&self) {
        if self.inner.destroyed.get() {
            return;
        }
        self.inner.want_online.set(true);
        self.inner.attempt.set(0);
        if self.inner.socket.borrow().is_none() {
            Inner::cancel_reconnect(&self.inner);
            Inner::open(&self.inner);
        }
    }

    /// The whole document as a Yjs v1 update (to keep unsaved work, e.g. in IndexedDB).
    #[wasm_bindgen(js_name = encodeStateAsUpdate)]
    pub fn encode_state_as_update(&self) -> Result<Vec<u8>, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(txn.encode_state_as_update_v1(&yrs::StateVector::default()))
    }

    /// Applies a Yjs v1 update (from `encodeStateAsUpdate` or Yjs) as a local change: what the
    /// server lacks of it is sent and counts as unsaved until committed.
    #[wasm_bindgen(js_name = applyUpdate)]
    pub fn apply_update(&self, update: &[u8]) -> Result<(), JsValue> {
        let update = yrs::Update::decode_v1(update).map_err(js_err)?;
        {
            let mut txn = self.inner.doc.try_transact_mut().map_err(busy)?;
            txn.apply_update(update).map_err(js_err)?;
        }
        self.inner.changed();
        Ok(())
    }

    /// The token for the next connection (`?token=`); call `connect()` to use it now.
    #[wasm_bindgen(js_name = setToken)]
    pub fn set_token(&self, token: Option<String>) {
        *self.inner.token.borrow_mut() = token;
    }

    /// Sends pending changes, clears this client's awareness state, closes the connection and
    /// stops for good. Pending `whenSynced`/`whenSaved` promises that cannot resolve reject.
    pub fn destroy(&self) {
        let inner = &self.inner;
        if inner.destroyed.replace(true) {
            return;
        }
        let pending = inner.session.borrow_mut().outgoing();
        inner.send_all(pending);
        inner.set_local_state(None);
        Inner::stop(inner);
        Inner::drop_socket(inner, 1000, "client closed");
        inner.set_status(Status::Closed);
        Inner::went_offline(inner);
        inner.dispatch();
        inner.listeners.borrow_mut().by_event.clear();
    }
}

/// Calls a token provider: it may return the token or a promise of it.
async fn provide_token(provider: &Function) -> Result<String, JsValue> {
    let mut value = provider.call0(&JsValue::NULL)?;
    if let Some(promise) = value.dyn_ref::<js_sys::Promise>() {
        value = wasm_bindgen_futures::JsFuture::from(promise.clone()).await?;
    }
    value
        .as_string()
        .ok_or_else(|| js_err("tokenProvider must return a string (or a promise of one)"))
}

impl Inner {
    /// Opens a connection: with a token provider, asks it for a token first.
    fn open(this: &Rc<Inner>) {
        let Some(provider) = this.token_provider.clone() else {
            Inner::open_socket(this);
            return;
        };
        let generation = this.generation.get() + 1;
        this.generation.set(generation);
        this.set_status(Status::Connecting);
        this.dispatch();
        let weak = Rc::downgrade(this);
        wasm_bindgen_futures::spawn_local(async move {
            let token = provide_token(&provider).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            // Disconnected, destroyed or reconnected meanwhile: this attempt is void.
            let current = inner.generation.get() == generation
                && inner.want_online.get()
                && inner.socket.borrow().is_none();
            if !current {
                return;
            }
            match token {
                Ok(token) => {
                    *inner.token.borrow_mut() = Some(token);
                    Inner::open_socket(&inner);
                }
                Err(e) => {
                    web_sys::console::warn_2(&JsValue::from_str("quire: tokenProvider failed"), &e);
                    Inner::went_offline(&inner);
                    Inner::schedule_reconnect(&inner);
                    inner.dispatch();
                }
            }
        });
    }

    fn open_socket(this: &Rc<Inner>) {
        let generation = this.generation.get() + 1;
        this.generation.set(generation);
        this.set_status(Status::Connecting);
        let url = document_url(&this.server, &this.document, this.token.borrow().as_deref());
        if this.refresh_timer.borrow().is_none() {
            Inner::schedule_refresh(this);
        }
        let ws = match WebSocket::new(&url) {
            Ok(ws) => ws,
            Err(e) => {
                web_sys::console::warn_2(&JsValue::from_str("quire: cannot open"), &e);
                Inner::went_offline(this);
                Inner::schedule_reconnect(this);
                this.dispatch();
                return;
            }
        };
        ws.set_binary_type(BinaryType::Arraybuffer);
        let weak = Rc::downgrade(this);
        let on_open = Closure::<dyn FnMut()>::new({
            let weak = weak.clone();
            move || with_live(&weak, generation, Inner::opened)
        });
        let on_message = Closure::<dyn FnMut(MessageEvent)>::new({
            let weak = weak.clone();
            move |e: MessageEvent| {
                let data = e.data();
                with_live(&weak, generation, |inner| inner.received(data))
            }
        });
        let on_close = Closure::<dyn FnMut(CloseEvent)>::new({
            let weak = weak.clone();
            move |e: CloseEvent| {
                let (code, reason) = (e.code(), e.reason());
                with_live(&weak, generation, |inner| {
                    Inner::closed(inner, code, reason)
                })
            }
        });
        // A close event follows every error; the handler only keeps an unhandled error event
        // from being fatal (Node's `ws` throws those).
        let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(|_e: web_sys::Event| {});
        ws.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        ws.set_onopen(Some(on_open.as_ref().unchecked_ref()));
        ws.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
        ws.set_onclose(Some(on_close.as_ref().unchecked_ref()));
        *this.socket.borrow_mut() = Some(Socket {
            ws,
            _on_open: on_open,
            _on_message: on_message,
            _on_close: on_close,
            _on_error: on_error,
        });
        this.dispatch();
    }

    fn opened(this: &Rc<Inner>) {
        this.heard.set(js_sys::Date::now());
        let frames = this.session.borrow_mut().connected();
        this.send_all(frames);
        this.set_status(Status::Connected);
        this.refresh_cells();
        this.dispatch();
    }

    fn received(self: &Rc<Inner>, data: JsValue) {
        let Some(buffer) = data.dyn_ref::<js_sys::ArrayBuffer>() else {
            return; // text frames are not part of the protocol
        };
        self.heard.set(js_sys::Date::now());
        let bytes = Uint8Array::new(buffer).to_vec();
        let result = self.session.borrow_mut().receive(&bytes);
        match result {
            Ok((replies, events)) => {
                self.send_all(replies);
                let more = self.session.borrow_mut().outgoing();
                self.send_all(more);
                for event in events {
                    self.queue_event(event);
                }
            }
            Err(e) => {
                web_sys::console::warn_1(&JsValue::from_str(&format!("quire: {e}")));
                // Browsers only let scripts close with 1000 or 3000-4999.
                Inner::drop_socket(self, 4000, "malformed message");
                Inner::went_offline(self);
                Inner::schedule_reconnect(self);
            }
        }
        self.refresh_cells();
        self.dispatch();
    }

    fn closed(this: &Rc<Inner>, code: u16, reason: String) {
        if let Some(socket) = this.socket.borrow_mut().take() {
            socket.detach();
            // This handler belongs to the socket: drop it after the handler returns.
            wasm_bindgen_futures::spawn_local(async move { drop(socket) });
        }
        if is_permanent_close(code) {
            Inner::stop(this);
            this.set_status(Status::Closed);
            Inner::went_offline(this);
            let info = Object::new();
            let _ = Reflect::set(&info, &"code".into(), &JsValue::from(code));
            let _ = Reflect::set(&info, &"reason".into(), &JsValue::from_str(&reason));
            this.queue("closed", vec![info.into()]);
        } else {
            if this.session.borrow().synced() {
                this.attempt.set(0);
            }
            Inner::went_offline(this);
            Inner::schedule_reconnect(this);
        }
        this.refresh_cells();
        this.dispatch();
    }

    fn went_offline(this: &Rc<Inner>) {
        let events = this.session.borrow_mut().disconnected();
        for event in events {
            this.queue_event(event);
        }
        if this.status.get() != Status::Closed {
            this.set_status(Status::Offline);
        }
        this.refresh_cells();
    }

    fn drop_socket(this: &Rc<Inner>, code: u16, reason: &str) {
        this.generation.set(this.generation.get() + 1);
        if let Some(socket) = this.socket.borrow_mut().take() {
            socket.detach();
            if socket.ws.close_with_code_and_reason(code, reason).is_err() {
                let _ = socket.ws.close();
            }
        }
    }

    /// No more reconnects or refreshes.
    fn stop(this: &Rc<Inner>) {
        this.want_online.set(false);
        Inner::cancel_reconnect(this);
        if let Some(t) = this.refresh_timer.borrow_mut().take() {
            clear_timeout(&t);
        }
    }

    fn schedule_reconnect(this: &Rc<Inner>) {
        if !this.want_online.get() {
            return;
        }
        let attempt = this.attempt.get();
        this.attempt.set(attempt.saturating_add(1));
        let delay = backoff_delay(attempt, this.min_backoff, this.max_backoff, fastrand::f64());
        let weak = Rc::downgrade(this);
        let callback = Closure::once_into_js(move || {
            if let Some(inner) = weak.upgrade() {
                inner.reconnect_timer.borrow_mut().take();
                if inner.want_online.get() && inner.socket.borrow().is_none() {
                    Inner::open(&inner);
                }
            }
        });
        let id = set_timeout(&callback, delay.as_millis() as f64);
        if let Some(old) = this.reconnect_timer.borrow_mut().replace(id) {
            clear_timeout(&old);
        }
    }

    fn cancel_reconnect(this: &Rc<Inner>) {
        if let Some(id) = this.reconnect_timer.borrow_mut().take() {
            clear_timeout(&id);
        }
    }

    fn schedule_refresh(this: &Rc<Inner>) {
        let weak = Rc::downgrade(this);
        let callback = Closure::once_into_js(move || {
            if let Some(inner) = weak.upgrade() {
                inner.refresh_timer.borrow_mut().take();
                if inner.status.get() == Status::Closed {
                    return;
                }
                let idle = js_sys::Date::now() - inner.heard.get();
                if inner.status.get() == Status::Connected
                    && idle >= crate::IDLE_TIMEOUT.as_millis() as f64
                {
                    // A half-open connection (sleep, network change): open a new one.
                    Inner::drop_socket(&inner, 4000, "idle");
                    Inner::went_offline(&inner);
                    Inner::schedule_reconnect(&inner);
                } else {
                    let mut frames: Vec<Vec<u8>> = inner
                        .session
                        .borrow_mut()
                        .refresh_awareness()
                        .into_iter()
                        .collect();
                    // Its echo proves the connection works (scripts cannot see pings).
                    frames.extend(inner.session.borrow().keepalive());
                    inner.send_all(frames);
                }
                inner.dispatch();
                Inner::schedule_refresh(&inner);
            }
        });
        let id = set_timeout(&callback, crate::AWARENESS_REFRESH.as_millis() as f64);
        *this.refresh_timer.borrow_mut() = Some(id);
    }

    fn send_all(&self, frames: impl IntoIterator<Item = Vec<u8>>) {
        let socket = self.socket.borrow();
        let Some(socket) = socket.as_ref() else {
            return;
        };
        if socket.ws.ready_state() != WebSocket::OPEN {
            return;
        }
        for frame in frames {
            if let Err(e) = socket.ws.send_with_u8_array(&frame) {
                web_sys::console::warn_2(&JsValue::from_str("quire: send failed"), &e);
            }
        }
    }

    /// After a local change: send it (batched with others made in the same task).
    fn changed(self: &Rc<Inner>) {
        self.deliver_deferred();
        self.refresh_cells();
        if self.flush_scheduled.replace(true) {
            self.dispatch();
            return;
        }
        let weak = Rc::downgrade(self);
        wasm_bindgen_futures::spawn_local(async move {
            if let Some(inner) = weak.upgrade() {
                inner.flush_scheduled.set(false);
                let frames = inner.session.borrow_mut().outgoing();
                inner.send_all(frames);
                inner.refresh_cells();
                inner.dispatch();
            }
        });
        self.dispatch();
    }

    fn set_local_state(self: &Rc<Inner>, json: Option<String>) {
        let (frame, event) = self.shared.set_local_state(json);
        self.send_all(frame);
        self.queue_event(event);
        self.dispatch();
    }

    fn set_status(&self, status: Status) {
        if self.status.replace(status) != status {
            self.queue("status", vec![JsValue::from_str(status.as_str())]);
        }
    }

    /// Copies the session's state into cells readable at any time, queueing change events.
    fn refresh_cells(&self) {
        let (synced, unsaved) = {
            let mut session = self.session.borrow_mut();
            (session.synced(), session.unsaved_changed())
        };
        if self.synced.replace(synced) != synced {
            self.queue("synced", vec![JsValue::from_bool(synced)]);
        }
        if let Some(unsaved) = unsaved {
            self.unsaved.set(unsaved);
            self.queue("saved", vec![JsValue::from_f64(unsaved as f64)]);
        }
    }

    fn queue_event(&self, event: Event) {
        match event {
            Event::Synced(_) => {} // reported by refresh_cells
            Event::Awareness {
                added,
                updated,
                removed,
                local,
            } => {
                let ids = |v: Vec<yrs::ClientID>| -> JsValue {
                    v.into_iter()
                        .map(|id| JsValue::from_f64(id.get() as f64))
                        .collect::<Array>()
                        .into()
                };
                let change = Object::new();
                let _ = Reflect::set(&change, &"added".into(), &ids(added));
                let _ = Reflect::set(&change, &"updated".into(), &ids(updated));
                let _ = Reflect::set(&change, &"removed".into(), &ids(removed));
                let origin = if local { "local" } else { "remote" };
                self.queue("awareness", vec![change.into(), origin.into()]);
            }
            Event::PermissionDenied(reason) => {
                web_sys::console::warn_1(&JsValue::from_str(&format!(
                    "quire: the server refused a change: {reason}"
                )));
                self.queue("denied", vec![JsValue::from_str(&reason)]);
            }
        }
    }

    fn queue(&self, event: &str, args: Vec<JsValue>) {
        self.pending.borrow_mut().push((event.to_owned(), args));
    }

    fn deliver_deferred(&self) {
        // A callback's own edit queues more calls; the running loop delivers them after the
        // current batch, so every observer sees one transaction's delta before the next one.
        if self.delivering.replace(true) {
            return;
        }
        loop {
            let calls = std::mem::take(&mut *self.deferred.borrow_mut());
            if calls.is_empty() {
                self.delivering.set(false);
                return;
            }
            for (callback, delta, local) in calls {
                if let Err(e) = callback.call2(&JsValue::NULL, &delta, &JsValue::from_bool(local)) {
                    web_sys::console::error_2(&JsValue::from_str("quire: observer threw"), &e);
                }
            }
        }
    }

    /// Calls the listeners of every queued event, with no state borrowed.
    fn dispatch(&self) {
        self.deliver_deferred();
        loop {
            let events = std::mem::take(&mut *self.pending.borrow_mut());
            if events.is_empty() {
                break;
            }
            for (name, args) in events {
                let listeners = self
                    .listeners
                    .borrow()
                    .by_event
                    .get(&name)
                    .cloned()
                    .unwrap_or_default();
                let args: Array = args.into_iter().collect();
                for listener in listeners {
                    if let Err(e) = listener.apply(&JsValue::NULL, &args) {
                        web_sys::console::error_2(&JsValue::from_str("quire: listener threw"), &e);
                    }
                }
            }
        }
        self.resolve_waiters();
    }

    fn waiter(self: &Rc<Inner>, saved: bool) -> js_sys::Promise {
        let inner = self.clone();
        js_sys::Promise::new(&mut move |resolve, reject| {
            inner.waiters.borrow_mut().push((resolve, reject, saved));
            inner.resolve_waiters();
        })
    }

    fn resolve_waiters(&self) {
        let synced = self.synced.get();
        let saved = self.unsaved.get() == 0;
        let closed = self.status.get() == Status::Closed;
        let done: Vec<(Function, Function, bool)> = {
            let mut waiters = self.waiters.borrow_mut();
            let (done, wait): (Vec<_>, Vec<_>) =
                waiters.drain(..).partition(|(_, _, want_saved)| {
                    closed || if *want_saved { synced && saved } else { synced }
                });
            *waiters = wait;
            done
        };
        for (resolve, reject, want_saved) in done {
            let ok = if want_saved {
                saved && (synced || closed)
            } else {
                synced
            };
            if ok {
                let _ = resolve.call0(&JsValue::NULL);
            } else {
                let _ = reject.call1(&JsValue::NULL, &js_err("the client closed"));
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Freed without destroy(): close the socket and stop the timers.
        if let Some(socket) = self.socket.borrow_mut().take() {
            socket.detach();
            let _ = socket.ws.close();
        }
        for timer in [&self.reconnect_timer, &self.refresh_timer] {
            if let Some(t) = timer.borrow_mut().take() {
                clear_timeout(&t);
            }
        }
    }
}

/// Runs `f` if the client still exists and `generation` is its current socket.
fn with_live(weak: &Weak<Inner>, generation: u64, f: impl FnOnce(&Rc<Inner>)) {
    if let Some(inner) = weak.upgrade() {
        if inner.generation.get() == generation {
            f(&inner);
        }
    }
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

/// A shared text (indices count UTF-16 code units, like JavaScript strings).
#[wasm_bindgen]
pub struct QuireText {
    text: TextRef,
    inner: Rc<Inner>,
}

#[wasm_bindgen]
impl QuireText {
    pub fn insert(&self, index: u32, chunk: &str) -> Result<(), JsValue> {
        {
            let mut txn = self.inner.doc.try_transact_mut().map_err(busy)?;
            if index > self.text.len(&txn) {
                return Err(js_err("index out of range"));
            }
            self.text.insert(&mut txn, index, chunk);
        }
        self.inner.changed();
        Ok(())
    }

    pub fn delete(&self, index: u32, length: u32) -> Result<(), JsValue> {
        {
            let mut txn = self.inner.doc.try_transact_mut().map_err(busy)?;
            if index.saturating_add(length) > self.text.len(&txn) {
                return Err(js_err("range out of bounds"));
            }
            self.text.remove_range(&mut txn, index, length);
        }
        self.inner.changed();
        Ok(())
    }

    #[wasm_bindgen(js_name = toString)]
    pub fn to_js_string(&self) -> Result<String, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(self.text.get_string(&txn))
    }

    #[wasm_bindgen(getter)]
    pub fn length(&self) -> Result<u32, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(self.text.len(&txn))
    }

    /// `callback(delta, local)` after every transaction that changed the text.
    pub fn observe(&self, callback: Function) -> Result<u32, JsValue> {
        let deferred = self.inner.deferred.clone();
        let id = next_subscription();
        self.text
            .observe(id.to_string(), move |txn, e: &TextEvent| {
                let delta: Array = e
                    .delta(txn)
                    .iter()
                    .map(|d| delta_to_js(d, |v| v.clone().to_string(txn)))
                    .collect();
                deferred
                    .borrow_mut()
                    .push((callback.clone(), delta.into(), is_local(txn)));
            });
        Ok(id)
    }

    pub fn unobserve(&self, id: u32) {
        self.text.unobserve(id.to_string());
    }

    /// A position that moves with the text (Yjs RelativePosition JSON). `assoc` < 0 sticks to
    /// the character before the index, otherwise to the one after.
    #[wasm_bindgen(js_name = stickyIndex)]
    pub fn sticky_index(&self, index: u32, assoc: i32) -> Result<JsValue, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        let assoc = if assoc < 0 {
            Assoc::Before
        } else {
            Assoc::After
        };
        let index = index.min(self.text.len(&txn));
        // At the end of the text (or in an empty one) there is no character after the index:
        // the position then refers to the text itself, as in Yjs.
        let pos = self
            .text
            .sticky_index(&txn, index, assoc)
            .unwrap_or_else(|| StickyIndex::from_type(&txn, &self.text, assoc));
        relative_position_js(&pos)
    }

    /// The current index of a position from `stickyIndex` (or from Yjs), or undefined.
    #[wasm_bindgen(js_name = resolveStickyIndex)]
    pub fn resolve_sticky_index(&self, json: JsValue) -> Result<Option<u32>, JsValue> {
        let Ok(pos) = serde_wasm_bindgen::from_value::<StickyIndex>(json) else {
            return Ok(None);
        };
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(pos.get_offset(&txn).map(|o| o.index))
    }
}

/// A sticky index in the shape of a Yjs `RelativePosition` object: all four keys, `null` where
/// unset. y-codemirror.next shares those objects in awareness and reads every key back.
fn relative_position_js(pos: &StickyIndex) -> Result<JsValue, JsValue> {
    let value = to_js(pos)?;
    for key in ["type", "tname", "item"] {
        let key = JsValue::from_str(key);
        if !Reflect::has(&value, &key)? {
            Reflect::set(&value, &key, &JsValue::NULL)?;
        }
    }
    Ok(value)
}

fn delta_to_js(delta: &Delta, text: impl Fn(&Out) -> String) -> JsValue {
    let obj = Object::new();
    let _ = match delta {
        Delta::Inserted(value, _) => {
            Reflect::set(&obj, &"insert".into(), &JsValue::from_str(&text(value)))
        }
        Delta::Deleted(n) => Reflect::set(&obj, &"delete".into(), &JsValue::from(*n)),
        Delta::Retain(n, _) => Reflect::set(&obj, &"retain".into(), &JsValue::from(*n)),
    };
    obj.into()
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

/// A shared map of JSON values.
#[wasm_bindgen]
pub struct QuireMap {
    map: MapRef,
    inner: Rc<Inner>,
}

#[wasm_bindgen]
impl QuireMap {
    pub fn set(&self, key: &str, value: JsValue) -> Result<(), JsValue> {
        let value = any_from_js(value)?;
        {
            let mut txn = self.inner.doc.try_transact_mut().map_err(busy)?;
            self.map.insert(&mut txn, key, value);
        }
        self.inner.changed();
        Ok(())
    }

    pub fn get(&self, key: &str) -> Result<JsValue, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        match self.map.get(&txn, key) {
            Some(v) => out_to_js(&txn, &v),
            None => Ok(JsValue::UNDEFINED),
        }
    }

    pub fn delete(&self, key: &str) -> Result<(), JsValue> {
        {
            let mut txn = self.inner.doc.try_transact_mut().map_err(busy)?;
            self.map.remove(&mut txn, key);
        }
        self.inner.changed();
        Ok(())
    }

    pub fn has(&self, key: &str) -> Result<bool, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(self.map.contains_key(&txn, key))
    }

    pub fn keys(&self) -> Result<Vec<String>, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(self.map.keys(&txn).map(str::to_owned).collect())
    }

    #[wasm_bindgen(getter)]
    pub fn size(&self) -> Result<u32, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(self.map.len(&txn))
    }

    #[wasm_bindgen(js_name = toJSON)]
    pub fn to_json(&self) -> Result<JsValue, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        to_js(&self.map.to_json(&txn))
    }

    /// `callback(changedKeys, local)` after every transaction that changed the map.
    pub fn observe(&self, callback: Function) -> u32 {
        let deferred = self.inner.deferred.clone();
        let id = next_subscription();
        self.map.observe(id.to_string(), move |txn, e| {
            let keys: Array = e
                .keys(txn)
                .iter()
                .map(|(k, change)| {
                    let obj = Object::new();
                    let action = match change {
                        EntryChange::Inserted(_) => "add",
                        EntryChange::Updated(_, _) => "update",
                        EntryChange::Removed(_) => "delete",
                    };
                    let _ = Reflect::set(&obj, &"key".into(), &JsValue::from_str(k));
                    let _ = Reflect::set(&obj, &"action".into(), &action.into());
                    JsValue::from(obj)
                })
                .collect();
            deferred
                .borrow_mut()
                .push((callback.clone(), keys.into(), is_local(txn)));
        });
        id
    }

    pub fn unobserve(&self, id: u32) {
        self.map.unobserve(id.to_string());
    }
}

/// A shared array of JSON values.
#[wasm_bindgen]
pub struct QuireArray {
    array: ArrayRef,
    inner: Rc<Inner>,
}

#[wasm_bindgen]
impl QuireArray {
    pub fn insert(&self, index: u32, values: Vec<JsValue>) -> Result<(), JsValue> {
        let values = values
            .into_iter()
            .map(any_from_js)
            .collect::<Result<Vec<_>, _>>()?;
        {
            let mut txn = self.inner.doc.try_transact_mut().map_err(busy)?;
            if index > self.array.len(&txn) {
                return Err(js_err("index out of range"));
            }
            self.array.insert_range(&mut txn, index, values);
        }
        self.inner.changed();
        Ok(())
    }

    pub fn push(&self, values: Vec<JsValue>) -> Result<(), JsValue> {
        let len = self.length()?;
        self.insert(len, values)
    }

    pub fn delete(&self, index: u32, length: u32) -> Result<(), JsValue> {
        {
            let mut txn = self.inner.doc.try_transact_mut().map_err(busy)?;
            if index.saturating_add(length) > self.array.len(&txn) {
                return Err(js_err("range out of bounds"));
            }
            self.array.remove_range(&mut txn, index, length);
        }
        self.inner.changed();
        Ok(())
    }

    pub fn get(&self, index: u32) -> Result<JsValue, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        match self.array.get(&txn, index) {
            Some(v) => out_to_js(&txn, &v),
            None => Ok(JsValue::UNDEFINED),
        }
    }

    #[wasm_bindgen(getter)]
    pub fn length(&self) -> Result<u32, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        Ok(self.array.len(&txn))
    }

    #[wasm_bindgen(js_name = toJSON)]
    pub fn to_json(&self) -> Result<JsValue, JsValue> {
        let txn = self.inner.doc.try_transact().map_err(busy)?;
        to_js(&self.array.to_json(&txn))
    }

    /// `callback(delta, local)`: `{insert: [...]}`, `{delete: n}`, `{retain: n}`.
    pub fn observe(&self, callback: Function) -> u32 {
        let deferred = self.inner.deferred.clone();
        let id = next_subscription();
        self.array.observe(id.to_string(), move |txn, e| {
            let delta: Array = e
                .delta(txn)
                .iter()
                .map(|c| {
                    let obj = Object::new();
                    let _ = match c {
                        Change::Added(values) => {
                            let values: Array = values
                                .iter()
                                .map(|v| out_to_js(txn, v).unwrap_or(JsValue::NULL))
                                .collect();
                            Reflect::set(&obj, &"insert".into(), &values)
                        }
                        Change::Removed(n) => {
                            Reflect::set(&obj, &"delete".into(), &JsValue::from(*n))
                        }
                        Change::Retain(n) => {
                            Reflect::set(&obj, &"retain".into(), &JsValue::from(*n))
                        }
                    };
                    JsValue::from(obj)
                })
                .collect();
            deferred
                .borrow_mut()
                .push((callback.clone(), delta.into(), is_local(txn)));
        });
        id
    }

    pub fn unobserve(&self, id: u32) {
        self.array.unobserve(id.to_string());
    }
}
