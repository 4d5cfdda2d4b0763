//! The OpenAPI v2 document in the protobuf form client-go asks for
//! (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`, gnostic's
//! `openapi.v2.Document`): kubectl 1.27 and 1.28 read `/openapi/v2` only that way
//! before `kubectl apply`.
//!
//! The encoder covers what kube-apiserver's document uses: paths with their
//! operations and parameters, responses, definitions, top-level parameters, and
//! `x-kubernetes-*` vendor extensions (carried as YAML text, which JSON is).

use serde_json::{Map, Value};

/// A protobuf message being written (fields in the order they are added).
#[derive(Default)]
struct Message(Vec<u8>);

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

impl Message {
    fn key(&mut self, field: u32, wire_type: u8) {
        varint(&mut self.0, (u64::from(field) << 3) | u64::from(wire_type));
    }

    fn bytes(&mut self, field: u32, data: &[u8]) {
        self.key(field, 2);
        varint(&mut self.0, data.len() as u64);
        self.0.extend_from_slice(data);
    }

    fn string(&mut self, field: u32, value: &str) {
        if !value.is_empty() {
            self.bytes(field, value.as_bytes());
        }
    }

    fn message(&mut self, field: u32, message: Message) {
        self.bytes(field, &message.0);
    }

    fn boolean(&mut self, field: u32, value: bool) {
        if value {
            self.key(field, 0);
            varint(&mut self.0, 1);
        }
    }

    fn int64(&mut self, field: u32, value: i64) {
        if value != 0 {
            self.key(field, 0);
            varint(&mut self.0, value as u64);
        }
    }

    fn double(&mut self, field: u32, value: f64) {
        if value != 0.0 {
            self.key(field, 1);
            self.0.extend_from_slice(&value.to_le_bytes());
        }
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn bool_of(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn strings(m: &mut Message, field: u32, v: Option<&Value>) {
    for s in v.and_then(Value::as_array).into_iter().flatten() {
        if let Some(s) = s.as_str() {
            m.bytes(field, s.as_bytes());
        }
    }
}

/// `Any { yaml = 2 }` holding a value's JSON (valid YAML).
fn any(value: &Value) -> Message {
    let mut m = Message::default();
    m.string(2, &serde_json::to_string(value).unwrap_or_default());
    m
}

/// `NamedAny { name = 1, value = 2 }` for every `x-` key of an object.
fn vendor_extensions(m: &mut Message, field: u32, object: &Map<String, Value>) {
    for (name, value) in object.iter().filter(|(k, _)| k.starts_with("x-")) {
        let mut named = Message::default();
        named.string(1, name);
        named.message(2, any(value));
        m.message(field, named);
    }
}

fn schema(v: &Value) -> Message {
    let mut m = Message::default();
    let Some(object) = v.as_object() else {
        return m;
    };
    m.string(1, str_of(v, "$ref"));
    m.string(2, str_of(v, "format"));
    m.string(3, str_of(v, "title"));
    if let Some(default) = v.get("default") {
        m.message(5, any(default));
    }
    if let Some(x) = v.get("maximum").and_then(Value::as_f64) {
        m.double(7, x);
    }
    if let Some(x) = v.get("minimum").and_then(Value::as_f64) {
        m.double(9, x);
    }
    for (key, field) in [
        ("maxLength", 11),
        ("minLength", 12),
        ("maxItems", 14),
        ("minItems", 15),
        ("maxProperties", 17),
        ("minProperties", 18),
    ] {
        if let Some(x) = v.get(key).and_then(Value::as_i64) {
            m.int64(field, x);
        }
    }
    m.string(13, str_of(v, "pattern"));
    m.boolean(16, bool_of(v, "uniqueItems"));
    strings(&mut m, 19, v.get("required"));
    for value in v
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(20, any(value));
    }
    match v.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut item = Message::default();
            item.key(2, 0);
            varint(&mut item.0, u64::from(*b));
            m.message(21, item);
        }
        Some(s @ Value::Object(_)) => {
            let mut item = Message::default();
            item.message(1, schema(s));
            m.message(21, item);
        }
        _ => {}
    }
    match v.get("type") {
        Some(Value::String(t)) => {
            let mut item = Message::default();
            item.string(1, t);
            m.message(22, item);
        }
        Some(Value::Array(_)) => {
            let mut item = Message::default();
            strings(&mut item, 1, v.get("type"));
            m.message(22, item);
        }
        _ => {}
    }
    if let Some(items) = v.get("items") {
        let mut item = Message::default();
        match items {
            Value::Array(list) => list.iter().for_each(|s| item.message(1, schema(s))),
            single => item.message(1, schema(single)),
        }
        m.message(23, item);
    }
    for s in v
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(24, schema(s));
    }
    if let Some(properties) = v.get("properties").and_then(Value::as_object) {
        let mut props = Message::default();
        for (name, s) in properties {
            let mut named = Message::default();
            named.string(1, name);
            named.message(2, schema(s));
            props.message(1, named);
        }
        m.message(25, props);
    }
    m.boolean(27, bool_of(v, "readOnly"));
    vendor_extensions(&mut m, 31, object);
    m
}

/// `Parameter` (body or non-body), or a `JsonReference` wrapped in `ParametersItem`.
fn parameter(v: &Value) -> Message {
    let mut p = Message::default();
    let where_ = str_of(v, "in");
    if where_ == "body" {
        let mut body = Message::default();
        body.string(2, str_of(v, "name"));
        body.string(3, where_);
        body.boolean(4, bool_of(v, "required"));
        if let Some(s) = v.get("schema") {
            body.message(5, schema(s));
        }
        p.message(1, body);
        return p;
    }
    // Query and path sub-schemas share the first fields; their type, format and
    // uniqueItems sit one number apart.
    let (oneof, type_field, format_field, unique_field) = match where_ {
        "path" => (4, 5, 6, 19),
        "header" => (1, 5, 6, 19),
        "formData" => (2, 6, 7, 20),
        _ => (3, 6, 7, 20),
    };
    let mut sub = Message::default();
    sub.boolean(1, bool_of(v, "required"));
    sub.string(2, where_);
    sub.string(4, str_of(v, "name"));
    sub.string(type_field, str_of(v, "type"));
    sub.string(format_field, str_of(v, "format"));
    sub.boolean(unique_field, bool_of(v, "uniqueItems"));
    let mut non_body = Message::default();
    non_body.message(oneof, sub);
    p.message(2, non_body);
    p
}

fn parameters_item(v: &Value) -> Message {
    let mut item = Message::default();
    match v.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let mut json_reference = Message::default();
            json_reference.string(1, reference);
            item.message(2, json_reference);
        }
        None => item.message(1, parameter(v)),
    }
    item
}

fn operation(v: &Value) -> Message {
    let mut op = Message::default();
    strings(&mut op, 1, v.get("tags"));
    op.string(5, str_of(v, "operationId"));
    strings(&mut op, 6, v.get("produces"));
    strings(&mut op, 7, v.get("consumes"));
    for p in v
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        op.message(8, parameters_item(p));
    }
    if let Some(responses) = v.get("responses").and_then(Value::as_object) {
        let mut all = Message::default();
        for (code, response) in responses {
            let mut body = Message::default();
            if let Some(s) = response.get("schema") {
                let mut item = Message::default();
                item.message(1, schema(s));
                body.message(2, item);
            }
            let mut value = Message::default();
            value.message(1, body);
            let mut named = Message::default();
            named.string(1, code);
            named.message(2, value);
            all.message(1, named);
        }
        op.message(9, all);
    }
    strings(&mut op, 10, v.get("schemes"));
    op.boolean(11, bool_of(v, "deprecated"));
    if let Some(object) = v.as_object() {
        vendor_extensions(&mut op, 13, object);
    }
    op
}

fn path_item(v: &Value) -> Message {
    let mut item = Message::default();
    for (method, field) in [
        ("get", 2),
        ("put", 3),
        ("post", 4),
        ("delete", 5),
        ("options", 6),
        ("head", 7),
        ("patch", 8),
    ] {
        if let Some(op) = v.get(method) {
            item.message(field, operation(op));
        }
    }
    for p in v
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        item.message(9, parameters_item(p));
    }
    item
}

/// Encodes an OpenAPI v2 (Swagger) JSON document as gnostic's `openapi.v2.Document`.
pub(crate) fn encode(doc: &Value) -> Vec<u8> {
    let mut d = Message::default();
    d.string(1, str_of(doc, "swagger"));
    if let Some(info) = doc.get("info") {
        let mut i = Message::default();
        i.string(1, str_of(info, "title"));
        i.string(2, str_of(info, "version"));
        d.message(2, i);
    }
    if let Some(paths) = doc.get("paths").and_then(Value::as_object) {
        let mut all = Message::default();
        for (path, item) in paths {
            let mut named = Message::default();
            named.string(1, path);
            named.message(2, path_item(item));
            all.message(2, named);
        }
        d.message(8, all);
    }
    if let Some(definitions) = doc.get("definitions").and_then(Value::as_object) {
        let mut all = Message::default();
        for (name, s) in definitions {
            let mut named = Message::default();
            named.string(1, name);
            named.message(2, schema(s));
            all.message(1, named);
        }
        d.message(9, all);
    }
    if let Some(parameters) = doc.get("parameters").and_then(Value::as_object) {
        let mut all = Message::default();
        for (name, p) in parameters {
            let mut named = Message::default();
            named.string(1, name);
            named.message(2, parameter(p));
            all.message(1, named);
        }
        d.message(10, all);
    }
    d.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_are_written_with_gnostic_numbers() {
        let doc = json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "1.36"}});
        let bytes = encode(&doc);
        // swagger = 1 ("2.0"), info = 2 { title = 1, version = 2 }.
        assert_eq!(&bytes[..5], b"\x0a\x032.0");
        assert_eq!(bytes[5], 0x12);
        assert_eq!(&bytes[7..9], b"\x0a\x0a");
        let param = parameter(
            &json!({"in": "query", "name": "fieldValidation", "type": "string", "uniqueItems": true}),
        );
        // Parameter.non_body_parameter = 2 { query_parameter_sub_schema = 3 { in = 2, name = 4, type = 6, unique_items = 20 } }.
        assert_eq!(param.0[0], 0x12);
        assert_eq!(param.0[2], 0x1a);
        assert!(param.0.windows(17).any(|w| w == b"\x22\x0ffieldValidation"));
        assert!(param.0.ends_with(&[0xa0, 0x01, 0x01]), "{:?}", param.0);
    }
}
