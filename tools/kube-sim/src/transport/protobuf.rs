//! Decoding of Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`)
//! for the built-in kinds kubectl's generators send that way since 1.32
//! (`kubectl create secret|namespace|role|rolebinding|...`). Responses are always
//! JSON, which those requests accept too.
//!
//! The envelope is the 4-byte magic `k8s\0` followed by a `runtime.Unknown`
//! message {typeMeta{apiVersion=1, kind=2}=1, raw=2, contentEncoding=3,
//! contentType=4}; `raw` is the object's own message. Unknown fields are skipped.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value, json};

const MAGIC: &[u8] = b"k8s\x00";

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or("truncated varint")?;
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("varint too long".into())
    }

    fn field(&mut self) -> Result<Option<(u64, Wire<'a>)>, String> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = key >> 3;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.skip(8)?;
                Wire::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| "length overflow")?;
                let start = self.pos;
                self.skip(len)?;
                Wire::Bytes(&self.buf[start..start + len])
            }
            5 => {
                self.skip(4)?;
                Wire::Fixed
            }
            other => return Err(format!("unsupported protobuf wire type {other}")),
        };
        Ok(Some((number, wire)))
    }

    fn skip(&mut self, n: usize) -> Result<(), String> {
        if self.buf.len() - self.pos < n {
            return Err("truncated field".into());
        }
        self.pos += n;
        Ok(())
    }
}

fn text(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "string field is not UTF-8".to_string())
}

/// Calls `f` for every (field number, wire value) of a message.
fn each<'a>(
    msg: &'a [u8],
    mut f: impl FnMut(u64, Wire<'a>) -> Result<(), String>,
) -> Result<(), String> {
    let mut r = Reader::new(msg);
    while let Some((n, w)) = r.field()? {
        f(n, w)?;
    }
    Ok(())
}

fn bytes_of<'a>(w: Wire<'a>) -> Result<&'a [u8], String> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err("expected a length-delimited field".into()),
    }
}

/// A `map<string, string>` or `map<string, bytes>` entry (key = 1, value = 2).
fn map_entry(b: &[u8]) -> Result<(String, Vec<u8>), String> {
    let mut key = String::new();
    let mut value = Vec::new();
    each(b, |n, w| {
        match n {
            1 => key = text(bytes_of(w)?)?,
            2 => value = bytes_of(w)?.to_vec(),
            _ => {}
        }
        Ok(())
    })?;
    Ok((key, value))
}

fn time(b: &[u8]) -> Result<Value, String> {
    let mut seconds = 0i64;
    each(b, |n, w| {
        if let (1, Wire::Varint(v)) = (n, w) {
            seconds = v as i64;
        }
        Ok(())
    })?;
    Ok(jiff::Timestamp::from_second(seconds)
        .map(|t| json!(t.to_string()))
        .unwrap_or(Value::Null))
}

fn object_meta(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    each(b, |n, w| {
        match (n, w) {
            (1, w) => _ = m.insert("name".into(), json!(text(bytes_of(w)?)?)),
            (2, w) => _ = m.insert("generateName".into(), json!(text(bytes_of(w)?)?)),
            (3, w) => _ = m.insert("namespace".into(), json!(text(bytes_of(w)?)?)),
            (5, w) => _ = m.insert("uid".into(), json!(text(bytes_of(w)?)?)),
            (6, w) => _ = m.insert("resourceVersion".into(), json!(text(bytes_of(w)?)?)),
            (7, Wire::Varint(v)) => _ = m.insert("generation".into(), json!(v as i64)),
            (8, w) => _ = m.insert("creationTimestamp".into(), time(bytes_of(w)?)?),
            (11, w) => {
                let (k, v) = map_entry(bytes_of(w)?)?;
                labels.insert(k, json!(text(&v)?));
            }
            (12, w) => {
                let (k, v) = map_entry(bytes_of(w)?)?;
                annotations.insert(k, json!(text(&v)?));
            }
            (14, w) => finalizers.push(json!(text(bytes_of(w)?)?)),
            _ => {}
        }
        Ok(())
    })?;
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    m.retain(|_, v| !v.is_null() && v != "");
    Ok(Value::Object(m))
}

fn secret(raw: &[u8], obj: &mut Map<String, Value>) -> Result<(), String> {
    let mut data = Map::new();
    let mut string_data = Map::new();
    each(raw, |n, w| {
        match (n, w) {
            (1, w) => _ = obj.insert("metadata".into(), object_meta(bytes_of(w)?)?),
            (2, w) => {
                let (k, v) = map_entry(bytes_of(w)?)?;
                data.insert(k, json!(B64.encode(v)));
            }
            (3, w) => _ = obj.insert("type".into(), json!(text(bytes_of(w)?)?)),
            (4, w) => {
                let (k, v) = map_entry(bytes_of(w)?)?;
                string_data.insert(k, json!(text(&v)?));
            }
            (5, Wire::Varint(v)) => _ = obj.insert("immutable".into(), json!(v != 0)),
            _ => {}
        }
        Ok(())
    })?;
    if !data.is_empty() {
        obj.insert("data".into(), Value::Object(data));
    }
    if !string_data.is_empty() {
        obj.insert("stringData".into(), Value::Object(string_data));
    }
    Ok(())
}

fn namespace(raw: &[u8], obj: &mut Map<String, Value>) -> Result<(), String> {
    each(raw, |n, w| {
        match n {
            1 => _ = obj.insert("metadata".into(), object_meta(bytes_of(w)?)?),
            2 => {
                let mut finalizers = Vec::new();
                each(bytes_of(w)?, |n, w| {
                    if n == 1 {
                        finalizers.push(json!(text(bytes_of(w)?)?));
                    }
                    Ok(())
                })?;
                obj.insert("spec".into(), json!({ "finalizers": finalizers }));
            }
            _ => {}
        }
        Ok(())
    })
}

fn strings_field(msg: &[u8], fields: &[(u64, &str)]) -> Result<Map<String, Value>, String> {
    let mut out = Map::new();
    each(msg, |n, w| {
        if let Some((_, name)) = fields.iter().find(|(num, _)| *num == n) {
            out.insert((*name).to_string(), json!(text(bytes_of(w)?)?));
        }
        Ok(())
    })?;
    Ok(out)
}

fn role(raw: &[u8], obj: &mut Map<String, Value>) -> Result<(), String> {
    let mut rules = Vec::new();
    each(raw, |n, w| {
        match n {
            1 => _ = obj.insert("metadata".into(), object_meta(bytes_of(w)?)?),
            2 => {
                let mut rule = Map::new();
                let names = [
                    "verbs",
                    "apiGroups",
                    "resources",
                    "resourceNames",
                    "nonResourceURLs",
                ];
                each(bytes_of(w)?, |n, w| {
                    if let Some(name) = usize::try_from(n)
                        .ok()
                        .and_then(|i| names.get(i.wrapping_sub(1)))
                    {
                        let entry = rule
                            .entry((*name).to_string())
                            .or_insert_with(|| Value::Array(Vec::new()));
                        if let Value::Array(a) = entry {
                            a.push(json!(text(bytes_of(w)?)?));
                        }
                    }
                    Ok(())
                })?;
                rules.push(Value::Object(rule));
            }
            _ => {}
        }
        Ok(())
    })?;
    obj.insert("rules".into(), Value::Array(rules));
    Ok(())
}

fn binding(raw: &[u8], obj: &mut Map<String, Value>) -> Result<(), String> {
    let mut subjects = Vec::new();
    each(raw, |n, w| {
        match n {
            1 => _ = obj.insert("metadata".into(), object_meta(bytes_of(w)?)?),
            2 => subjects.push(Value::Object(strings_field(
                bytes_of(w)?,
                &[(1, "kind"), (2, "apiGroup"), (3, "name"), (4, "namespace")],
            )?)),
            3 => {
                _ = obj.insert(
                    "roleRef".into(),
                    Value::Object(strings_field(
                        bytes_of(w)?,
                        &[(1, "apiGroup"), (2, "kind"), (3, "name")],
                    )?),
                )
            }
            _ => {}
        }
        Ok(())
    })?;
    obj.insert("subjects".into(), Value::Array(subjects));
    Ok(())
}

fn review(kind: &str, raw: &[u8], obj: &mut Map<String, Value>) -> Result<(), String> {
    each(raw, |n, w| {
        match n {
            1 => _ = obj.insert("metadata".into(), object_meta(bytes_of(w)?)?),
            2 if kind == "SelfSubjectRulesReview" => {
                _ = obj.insert(
                    "spec".into(),
                    Value::Object(strings_field(bytes_of(w)?, &[(1, "namespace")])?),
                )
            }
            2 => {
                let mut spec = Map::new();
                let mut groups = Vec::new();
                each(bytes_of(w)?, |n, w| {
                    match n {
                        1 => {
                            _ = spec.insert(
                                "resourceAttributes".into(),
                                Value::Object(strings_field(
                                    bytes_of(w)?,
                                    &[
                                        (1, "namespace"),
                                        (2, "verb"),
                                        (3, "group"),
                                        (4, "version"),
                                        (5, "resource"),
                                        (6, "subresource"),
                                        (7, "name"),
                                    ],
                                )?),
                            )
                        }
                        2 => {
                            _ = spec.insert(
                                "nonResourceAttributes".into(),
                                Value::Object(strings_field(
                                    bytes_of(w)?,
                                    &[(1, "path"), (2, "verb")],
                                )?),
                            )
                        }
                        3 => _ = spec.insert("user".into(), json!(text(bytes_of(w)?)?)),
                        4 => groups.push(json!(text(bytes_of(w)?)?)),
                        6 => _ = spec.insert("uid".into(), json!(text(bytes_of(w)?)?)),
                        _ => {}
                    }
                    Ok(())
                })?;
                if !groups.is_empty() {
                    spec.insert("groups".into(), Value::Array(groups));
                }
                obj.insert("spec".into(), Value::Object(spec));
            }
            _ => {}
        }
        Ok(())
    })
}

/// Decodes a protobuf-encoded object into its JSON form.
pub(crate) fn decode(body: &[u8]) -> Result<Value, String> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or("not a Kubernetes protobuf body (missing the k8s\\0 prefix)")?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    let mut encoding = String::new();
    each(envelope, |n, w| {
        match n {
            1 => {
                let tm = strings_field(bytes_of(w)?, &[(1, "apiVersion"), (2, "kind")])?;
                api_version = tm
                    .get("apiVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                kind = tm
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
            }
            2 => raw = bytes_of(w)?,
            3 => encoding = text(bytes_of(w)?)?,
            _ => {}
        }
        Ok(())
    })?;
    if !encoding.is_empty() {
        return Err(format!(
            "unsupported protobuf content encoding {encoding:?}"
        ));
    }
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    match kind.as_str() {
        "Secret" => secret(raw, &mut obj)?,
        "Namespace" => namespace(raw, &mut obj)?,
        "Role" | "ClusterRole" => role(raw, &mut obj)?,
        "RoleBinding" | "ClusterRoleBinding" => binding(raw, &mut obj)?,
        "SubjectAccessReview"
        | "LocalSubjectAccessReview"
        | "SelfSubjectAccessReview"
        | "SelfSubjectRulesReview" => review(&kind, raw, &mut obj)?,
        other => {
            return Err(format!(
                "protobuf bodies are understood for Secret, Namespace, RBAC and access review kinds only, not {other:?}; send JSON"
            ));
        }
    }
    Ok(Value::Object(obj))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn bytes_field(n: u64, b: &[u8], out: &mut Vec<u8>) {
        varint(n << 3 | 2, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    fn entry(k: &str, v: &[u8]) -> Vec<u8> {
        let mut e = Vec::new();
        bytes_field(1, k.as_bytes(), &mut e);
        bytes_field(2, v, &mut e);
        e
    }

    #[test]
    fn decodes_a_secret() {
        let mut meta = Vec::new();
        bytes_field(1, b"s1", &mut meta);
        bytes_field(3, b"default", &mut meta);
        bytes_field(11, &entry("app", b"web"), &mut meta);
        let mut secret = Vec::new();
        bytes_field(1, &meta, &mut secret);
        bytes_field(2, &entry("a", &[0, 255]), &mut secret);
        bytes_field(3, b"Opaque", &mut secret);
        let mut tm = Vec::new();
        bytes_field(1, b"v1", &mut tm);
        bytes_field(2, b"Secret", &mut tm);
        let mut unknown = Vec::new();
        bytes_field(1, &tm, &mut unknown);
        bytes_field(2, &secret, &mut unknown);
        let mut body = MAGIC.to_vec();
        body.extend_from_slice(&unknown);
        let v = decode(&body).unwrap();
        assert_eq!(v["kind"], "Secret");
        assert_eq!(v["metadata"]["name"], "s1");
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert_eq!(v["data"]["a"], B64.encode([0u8, 255]));
        assert_eq!(v["type"], "Opaque");
        assert!(decode(b"{}").is_err());
        assert!(decode(&body[..body.len() - 3]).is_err());
    }
}
