//! Reading a script's reply by name: [`Reply`] takes a flat array field
//! by field, each named, for the [`FromRedisValue`] decoders beside the
//! scripts' callers (a queue's counts in `line.rs`, its stock in
//! `stock.rs`, its adaptive window in `adaptive.rs`, its lottery in
//! `lottery.rs`). A caller then asks for a
//! `QueueStats` or a `StockReply` rather than picking a tuple or a `Vec`
//! apart by position, and a reply of any other shape (a field missing,
//! one too many, a text where a number belongs) is refused with an error
//! naming the script and the field, which the store answers as
//! [`crate::store::StoreError::Protocol`] (fail closed), never a default.
//! The line's own rows (join, status, poll) are read in `reply.rs`.

use redis::{FromRedisValue, ParsingError, Value};

/// A script's flat array reply, read one named field at a time.
pub(super) struct Reply {
    script: &'static str,
    fields: std::vec::IntoIter<Value>,
}

impl Reply {
    /// `value` as `script`'s array; anything else is refused.
    pub fn of(script: &'static str, value: Value) -> Result<Self, ParsingError> {
        match value {
            Value::Array(fields) => Ok(Self {
                script,
                fields: fields.into_iter(),
            }),
            other => Err(format!("{script}: not an array: {other:?}").into()),
        }
    }

    /// True when no field is left.
    pub fn is_done(&self) -> bool {
        self.fields.len() == 0
    }

    /// The next field, called `name` in errors.
    pub fn field<T: FromRedisValue>(&mut self, name: &str) -> Result<T, ParsingError> {
        let script = self.script;
        let value = self
            .fields
            .next()
            .ok_or_else(|| format!("{script}: no {name}"))?;
        T::from_redis_value(value).map_err(|e| format!("{script}: {name}: {e}").into())
    }

    /// The next field, a count or a time: a whole number, never below
    /// zero (redis-rs would wrap a negative integer into a huge `u64`).
    pub fn count(&mut self, name: &str) -> Result<u64, ParsingError> {
        let n: i64 = self.field(name)?;
        u64::try_from(n).map_err(|_| format!("{}: {name}: {n} is below zero", self.script).into())
    }

    /// The next field, a 0/1 flag.
    pub fn flag(&mut self, name: &str) -> Result<bool, ParsingError> {
        match self.field::<i64>(name)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("{}: {name}: {other} is not 0 or 1", self.script).into()),
        }
    }

    /// The reply ends here.
    pub fn end(mut self) -> Result<(), ParsingError> {
        match self.fields.next() {
            None => Ok(()),
            Some(extra) => Err(format!("{}: unexpected {extra:?}", self.script).into()),
        }
    }

    /// Refuses the reply: `what` is wrong with it.
    pub fn refuse(&self, what: &str) -> ParsingError {
        format!("{}: {what}", self.script).into()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A reply as a script would send it: numbers as integers, the rest
    /// as bulk strings.
    pub fn reply(fields: &[&str]) -> Value {
        Value::Array(
            fields
                .iter()
                .map(|f| match f.parse::<i64>() {
                    Ok(n) => Value::Int(n),
                    Err(_) => text(f),
                })
                .collect(),
        )
    }

    fn text(f: &str) -> Value {
        Value::BulkString(f.as_bytes().to_vec())
    }

    /// A reply of bulk strings only (what `HMGET` and `HGETALL` give).
    pub fn texts(fields: &[&str]) -> Value {
        Value::Array(fields.iter().map(|f| text(f)).collect())
    }

    /// `value` decoded as `T`, or the error's text.
    pub fn decode<T: FromRedisValue>(value: Value) -> Result<T, String> {
        T::from_redis_value(value).map_err(|e| e.to_string())
    }

    /// A count, a text and a flag, as a decoder would read them.
    fn pair(value: Value) -> Result<(u64, String, bool), ParsingError> {
        let mut r = Reply::of("t.lua", value)?;
        let pair = (r.count("n")?, r.field("name")?, r.flag("on")?);
        r.end()?;
        Ok(pair)
    }

    #[test]
    fn fields_are_read_by_name_and_any_other_shape_is_named() {
        assert_eq!(
            pair(reply(&["3", "x", "1"])).unwrap(),
            (3, "x".to_owned(), true)
        );
        let err = |v| pair(v).unwrap_err().to_string();
        let short = err(reply(&["3", "x"]));
        assert!(short.contains("t.lua: no on"), "{short}");
        let long = err(reply(&["3", "x", "0", "4"]));
        assert!(long.contains("t.lua: unexpected"), "{long}");
        let wrong = err(reply(&["three", "x", "0"]));
        assert!(wrong.contains("t.lua: n:"), "{wrong}");
        let negative = err(reply(&["-3", "x", "0"]));
        assert!(negative.contains("n: -3 is below zero"), "{negative}");
        let flag = err(reply(&["3", "x", "2"]));
        assert!(flag.contains("on: 2 is not 0 or 1"), "{flag}");
        let not_array = err(Value::Int(3));
        assert!(not_array.contains("t.lua: not an array"), "{not_array}");
    }
}
