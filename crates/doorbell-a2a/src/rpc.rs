//! JSON-RPC 2.0 as A2A 1.0 uses it: the request's frame, the spec's error codes with their
//! `google.rpc.ErrorInfo` detail, and the bounds a request must stay within before anything
//! reads it (its size and its nesting).

use serde_json::{json, Value};

/// The deepest a request's JSON may nest.
pub const MAX_DEPTH: usize = 32;

/// A JSON-RPC error, as the spec numbers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    /// The spec's `ErrorInfo.reason`, e.g. `TASK_NOT_FOUND`.
    pub reason: &'static str,
}

impl RpcError {
    fn new(code: i64, reason: &'static str, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            reason,
        }
    }

    pub fn parse_error(message: impl Into<String>) -> RpcError {
        RpcError::new(-32700, "PARSE_ERROR", message)
    }

    pub fn invalid_request(message: impl Into<String>) -> RpcError {
        RpcError::new(-32600, "INVALID_REQUEST", message)
    }

    pub fn method_not_found(method: &str) -> RpcError {
        RpcError::new(
            -32601,
            "METHOD_NOT_FOUND",
            format!("no method '{method}' (this gateway speaks A2A 1.0: SendMessage, SendStreamingMessage, GetTask, ListTasks, CancelTask, SubscribeToTask)"),
        )
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(-32602, "INVALID_PARAMS", message)
    }

    pub fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new(-32603, "INTERNAL", message)
    }

    pub fn task_not_found(id: &str) -> RpcError {
        RpcError::new(
            -32001,
            "TASK_NOT_FOUND",
            format!("no task '{id}' of yours at this station"),
        )
    }

    pub fn not_cancelable(id: &str, state: &str) -> RpcError {
        RpcError::new(
            -32002,
            "TASK_NOT_CANCELABLE",
            format!("task '{id}' is {state}: a closed task cannot be canceled"),
        )
    }

    pub fn push_not_supported() -> RpcError {
        RpcError::new(
            -32003,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
            "push notifications are not supported: stream with SubscribeToTask",
        )
    }

    pub fn unsupported(message: impl Into<String>) -> RpcError {
        RpcError::new(-32004, "UNSUPPORTED_OPERATION", message)
    }

    pub fn extended_card_not_configured() -> RpcError {
        RpcError::new(
            -32007,
            "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
            "this station has no extended agent card",
        )
    }

    pub fn version_not_supported(version: &str) -> RpcError {
        RpcError::new(
            -32009,
            "VERSION_NOT_SUPPORTED",
            format!("A2A-Version '{version}' is not supported: this gateway speaks 1.0"),
        )
    }

    /// The whole JSON-RPC response carrying this error.
    #[must_use]
    pub fn response(&self, id: &Value) -> Value {
        json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": self.code,
                "message": self.message,
                "data": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.reason,
                    "domain": "a2a-protocol.org",
                }],
            },
        })
    }
}

/// The JSON-RPC response carrying `result`.
#[must_use]
pub fn result(id: &Value, result: &Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// One parsed request.
#[derive(Debug)]
pub struct Call {
    pub id: Value,
    pub method: String,
    pub params: Value,
}

/// Parse a request body: bounded nesting, then JSON, then the JSON-RPC frame. The error
/// comes with the id when the frame had one.
pub fn parse(body: &[u8]) -> Result<Call, (Value, RpcError)> {
    if doorbell_core::judge::nests_deeper_than(body, MAX_DEPTH) {
        return Err((
            Value::Null,
            RpcError::invalid_request(format!("the request nests deeper than {MAX_DEPTH}")),
        ));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| (Value::Null, RpcError::parse_error(format!("not JSON: {e}"))))?;
    let Value::Object(mut object) = value else {
        return Err((
            Value::Null,
            RpcError::invalid_request(
                "a request is one JSON-RPC object (batches are not supported)",
            ),
        ));
    };
    let id = match object.remove("id") {
        Some(id @ (Value::String(_) | Value::Number(_) | Value::Null)) => id,
        None => {
            return Err((
                Value::Null,
                RpcError::invalid_request(
                    "a request needs an id (notifications get no answer here)",
                ),
            ))
        }
        Some(_) => {
            return Err((
                Value::Null,
                RpcError::invalid_request("id must be a string or a number"),
            ))
        }
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id, RpcError::invalid_request("jsonrpc must be \"2.0\"")));
    }
    let Some(Value::String(method)) = object.remove("method") else {
        return Err((id, RpcError::invalid_request("method must be a string")));
    };
    let params = match object.remove("params") {
        None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
        Some(params @ Value::Object(_)) => params,
        Some(_) => {
            return Err((id, RpcError::invalid_params("params must be an object")));
        }
    };
    Ok(Call { id, method, params })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_checked_before_its_method() {
        let call =
            parse(br#"{"jsonrpc":"2.0","id":7,"method":"GetTask","params":{"id":"x"}}"#).unwrap();
        assert_eq!((call.id, call.method.as_str()), (json!(7), "GetTask"));
        let codes = |body: &[u8]| parse(body).unwrap_err().1.code;
        assert_eq!(codes(b"{nope"), -32700);
        assert_eq!(codes(b"[]"), -32600);
        assert_eq!(codes(br#"{"jsonrpc":"2.0","method":"GetTask"}"#), -32600);
        assert_eq!(
            codes(br#"{"jsonrpc":"1.0","id":1,"method":"GetTask"}"#),
            -32600
        );
        assert_eq!(
            codes(br#"{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}"#),
            -32602
        );
        let deep = format!("{}{}", "[".repeat(40), "]".repeat(40));
        assert_eq!(codes(deep.as_bytes()), -32600);
    }
}
