//! Every request body of the HTTP API, through the real router (`http::router` over the state
//! `run_with_stores` builds) on an in-memory SQLite database. The first byte picks the route
//! and the variant (credential, Idempotency-Key, If-Match); the rest is the body. See
//! `quire_server::fuzzing::HttpHarness` for the routes and the checks (no 5xx but 503; errors
//! are problem+json with the right status; a created document reads back).
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use quire_server::fuzzing::HttpHarness;

static HARNESS: Mutex<Option<HttpHarness>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let mut harness = HARNESS.lock().unwrap_or_else(|e| e.into_inner());
    harness
        .get_or_insert_with(HttpHarness::new)
        .request(selector, body);
});
