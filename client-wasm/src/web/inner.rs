//! The client's state and its socket: connecting, reconnecting, sending and receiving, the
//! events and promises, shared by every class through `Rc<Inner>`.

use super::*;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct JsOptions {
    pub(super) token: Option<String>,
    pub(super) min_backoff_ms: Option<f64>,
    pub(super) max_backoff_ms: Option<f64>,
}

/// Observer calls waiting for the transaction to end.
pub(super) type Deferred = Rc<RefCell<Vec<(Function, JsValue, bool)>>>;

pub(super) struct Socket {
    pub(super) ws: WebSocket,
    pub(super) _on_open: Closure<dyn FnMut()>,
    pub(super) _on_message: Closure<dyn FnMut(MessageEvent)>,
    pub(super) _on_close: Closure<dyn FnMut(CloseEvent)>,
    pub(super) _on_error: Closure<dyn FnMut(web_sys::Event)>,
}

impl Socket {
    pub(super) fn detach(&self) {
        self.ws.set_onopen(None);
        self.ws.set_onmessage(None);
        self.ws.set_onclose(None);
        self.ws.set_onerror(None);
    }
}

#[derive(Default)]
pub(super) struct Listeners {
    pub(super) by_event: HashMap<String, Vec<Function>>,
}

pub(super) struct Inner {
    pub(super) session: RefCell<Session>,
    /// Counters and awareness, readable without borrowing the session.
    pub(super) shared: Arc<Shared>,
    pub(super) doc: Doc,
    pub(super) deferred: Deferred,
    /// True while deferred observer calls are being delivered (nested calls wait their turn).
    pub(super) delivering: Cell<bool>,
    pub(super) server: String,
    pub(super) document: String,
    pub(super) token: RefCell<Option<String>>,
    /// `options.tokenProvider`: called before every connection attempt for the token to use.
    pub(super) token_provider: Option<Function>,
    /// When the current socket last received anything (ms since the epoch).
    pub(super) heard: Cell<f64>,
    pub(super) destroyed: Cell<bool>,
    pub(super) min_backoff: Duration,
    pub(super) max_backoff: Duration,
    pub(super) socket: RefCell<Option<Socket>>,
    /// Bumped for every socket, so late events of an old one are ignored.
    pub(super) generation: Cell<u64>,
    pub(super) status: Cell<Status>,
    pub(super) synced: Cell<bool>,
    pub(super) unsaved: Cell<u64>,
    pub(super) want_online: Cell<bool>,
    pub(super) attempt: Cell<u32>,
    pub(super) reconnect_timer: RefCell<Option<JsValue>>,
    pub(super) refresh_timer: RefCell<Option<JsValue>>,
    pub(super) flush_scheduled: Cell<bool>,
    pub(super) listeners: RefCell<Listeners>,
    /// whenSynced / whenSaved promises: (resolve, reject, wants saved).
    pub(super) waiters: RefCell<Vec<(Function, Function, bool)>>,
    /// Events collected while state was borrowed, delivered by `dispatch`.
    pub(super) pending: RefCell<Vec<(String, Vec<JsValue>)>>,
}

/// A client for one document on a Quire server (or any y-websocket server; durable
/// acknowledgements need Quire).
impl Inner {
    /// Opens a connection: with a token provider, asks it for a token first.
    pub(super) fn open(this: &Rc<Inner>) {
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

    pub(super) fn open_socket(this: &Rc<Inner>) {
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

    pub(super) fn opened(this: &Rc<Inner>) {
        this.heard.set(js_sys::Date::now());
        let frames = this.session.borrow_mut().connected();
        this.send_all(frames);
        this.set_status(Status::Connected);
        this.refresh_cells();
        this.dispatch();
    }

    pub(super) fn received(self: &Rc<Inner>, data: JsValue) {
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

    pub(super) fn closed(this: &Rc<Inner>, code: u16, reason: String) {
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

    pub(super) fn went_offline(this: &Rc<Inner>) {
        let events = this.session.borrow_mut().disconnected();
        for event in events {
            this.queue_event(event);
        }
        if this.status.get() != Status::Closed {
            this.set_status(Status::Offline);
        }
        this.refresh_cells();
    }

    pub(super) fn drop_socket(this: &Rc<Inner>, code: u16, reason: &str) {
        this.generation.set(this.generation.get() + 1);
        if let Some(socket) = this.socket.borrow_mut().take() {
            socket.detach();
            if socket.ws.close_with_code_and_reason(code, reason).is_err() {
                let _ = socket.ws.close();
            }
        }
    }

    /// No more reconnects or refreshes.
    pub(super) fn stop(this: &Rc<Inner>) {
        this.want_online.set(false);
        Inner::cancel_reconnect(this);
        if let Some(t) = this.refresh_timer.borrow_mut().take() {
            clear_timeout(&t);
        }
    }

    pub(super) fn schedule_reconnect(this: &Rc<Inner>) {
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

    pub(super) fn cancel_reconnect(this: &Rc<Inner>) {
        if let Some(id) = this.reconnect_timer.borrow_mut().take() {
            clear_timeout(&id);
        }
    }

    pub(super) fn schedule_refresh(this: &Rc<Inner>) {
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

    pub(super) fn send_all(&self, frames: impl IntoIterator<Item = Vec<u8>>) {
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
    pub(super) fn changed(self: &Rc<Inner>) {
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

    pub(super) fn set_local_state(self: &Rc<Inner>, json: Option<String>) {
        let (frame, event) = self.shared.set_local_state(json);
        self.send_all(frame);
        self.queue_event(event);
        self.dispatch();
    }

    pub(super) fn set_status(&self, status: Status) {
        if self.status.replace(status) != status {
            self.queue("status", vec![JsValue::from_str(status.as_str())]);
        }
    }

    /// Copies the session's state into cells readable at any time, queueing change events.
    pub(super) fn refresh_cells(&self) {
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

    pub(super) fn queue_event(&self, event: Event) {
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

    pub(super) fn queue(&self, event: &str, args: Vec<JsValue>) {
        self.pending.borrow_mut().push((event.to_owned(), args));
    }

    pub(super) fn deliver_deferred(&self) {
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
    pub(super) fn dispatch(&self) {
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

    pub(super) fn waiter(self: &Rc<Inner>, saved: bool) -> js_sys::Promise {
        let inner = self.clone();
        js_sys::Promise::new(&mut move |resolve, reject| {
            inner.waiters.borrow_mut().push((resolve, reject, saved));
            inner.resolve_waiters();
        })
    }

    pub(super) fn resolve_waiters(&self) {
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
