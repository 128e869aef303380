//! A deliberately hostile event service (`subscriber` + `http-api`), for
//! `kvwasm serve` tests only.
//!
//! | call                                  | what it does                           |
//! |---------------------------------------|----------------------------------------|
//! | `on-batch` holding an event of worker 666 | panics (trap)                      |
//! | `on-batch`, any other                 | counts the events                      |
//! | `POST /register`                      | 201 (so the host logs and replays it)  |
//! | any request with body `panic`         | panics (trap)                          |
//! | any request with body `hang`          | spins forever (deadline)               |
//! | any request with body `huge:N`        | 200 with an N MiB body                 |
//! | any other request                     | 200 `{"events": <events counted>}`     |

use std::cell::Cell;

use kvwasm_guest_support::events_bindings::exports::kvwasm::events::{http_api, subscriber};
use kvwasm_guest_support::events_bindings::kvwasm::events::types;
use kvwasm_guest_support::export_subscriber;

/// Batches holding an event of this worker panic.
const POISON_WORKER: u64 = 666;

thread_local! {
    static EVENTS: Cell<u64> = const { Cell::new(0) };
}

struct Hostile;

impl subscriber::Guest for Hostile {
    fn on_batch(events: Vec<types::Event>) -> Result<(), String> {
        if events.iter().any(|e| e.worker_id == POISON_WORKER) {
            panic!("hostile subscriber: a batch of worker {POISON_WORKER}");
        }
        EVENTS.set(EVENTS.get() + events.len() as u64);
        Ok(())
    }
}

impl http_api::Guest for Hostile {
    fn handle(request: http_api::Request) -> http_api::Response {
        let command = String::from_utf8_lossy(&request.body).into_owned();
        let body = match command.as_str() {
            "panic" => panic!("hostile subscriber: {} panics", request.path),
            "hang" => loop {
                std::hint::spin_loop();
            },
            _ => match command
                .strip_prefix("huge:")
                .and_then(|n| n.parse::<usize>().ok())
            {
                Some(mib) => vec![b'x'; mib << 20],
                None => format!("{{\"events\": {}}}", EVENTS.get()).into_bytes(),
            },
        };
        let status = if request.path == "/register" {
            201
        } else {
            200
        };
        http_api::Response {
            status,
            content_type: None,
            body,
        }
    }
}

export_subscriber!(Hostile);
