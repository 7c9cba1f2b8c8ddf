//! `QuireText`: a shared text.

use super::*;

/// A shared text (indices count UTF-16 code units, like JavaScript strings).
#[wasm_bindgen]
pub struct QuireText {
    pub(super) text: TextRef,
    pub(super) inner: Rc<Inner>,
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
