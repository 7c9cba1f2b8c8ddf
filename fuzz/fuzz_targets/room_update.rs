//! A client's frame through the room: decoded like a connection does, sent to a document room
//! on an in-memory SQLite database, committed (a durable acknowledgement request follows it),
//! then checked: the room still answers a Sync Step 1 with a valid Step 2, and what it serves
//! is what the database holds. See `quire_server::fuzzing::RoomHarness` for the checks.
//!
//! The document persists across inputs (fresh every 1000 inputs or at 4 MiB), so an input
//! meets the state earlier ones left, like a long-lived document meets many clients.
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use quire_server::fuzzing::RoomHarness;

static HARNESS: Mutex<Option<RoomHarness>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let mut harness = HARNESS.lock().unwrap_or_else(|e| e.into_inner());
    harness.get_or_insert_with(RoomHarness::new).feed(data);
});
