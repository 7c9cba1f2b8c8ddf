//! `QuireArray`: a shared array of JSON values.

use super::*;

/// A shared array of JSON values.
#[wasm_bindgen]
pub struct QuireArray {
    pub(super) array: ArrayRef,
    pub(super) inner: Rc<Inner>,
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
