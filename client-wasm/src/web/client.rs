//! `QuireClient`: the JavaScript class of a client for one document.

use super::*;

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
