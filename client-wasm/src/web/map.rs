//! `QuireMap`: a shared map of JSON values.

use super::*;

/// A shared map of JSON values.
#[wasm_bindgen]
pub struct QuireMap {
    pub(super) map: MapRef,
    pub(super) inner: Rc<Inner>,
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
