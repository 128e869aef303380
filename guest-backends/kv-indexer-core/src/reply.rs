//! The API's answers: a status and a JSON body, errors as Dynamo's axum
//! extractors classify them.

use serde::{Deserialize, Serialize};

pub(crate) type Reply = Result<(u16, Vec<u8>), (u16, Vec<u8>)>;

pub(crate) fn json(status: u16, value: &impl Serialize) -> (u16, Vec<u8>) {
    (
        status,
        serde_json::to_vec(value).expect("plain data serialises"),
    )
}

pub(crate) fn error(status: u16, message: String) -> (u16, Vec<u8>) {
    json(status, &serde_json::json!({ "error": message }))
}

pub(crate) fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, (u16, Vec<u8>)> {
    serde_json::from_slice(body).map_err(rejection)
}

/// A body serde_json refused, answered as axum's `Json` extractor answers
/// Dynamo's: 422 for valid JSON of the wrong shape, 400 otherwise (its
/// messages too; the body stays `{"error": …}` as every kvwasm error).
pub(crate) fn rejection(e: serde_json::Error) -> (u16, Vec<u8>) {
    match e.classify() {
        serde_json::error::Category::Data => error(
            422,
            format!("Failed to deserialize the JSON body into the target type: {e}"),
        ),
        _ => error(
            400,
            format!("Failed to parse the request body as JSON: {e}"),
        ),
    }
}
