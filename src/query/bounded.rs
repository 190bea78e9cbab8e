//! Functions whose output size a number argument sets (`repeat('x', 300000000)`,
//! `lpad`, `array_repeat`, `range`), bounded before they run.
//!
//! The memory pool sees what operators hold (sorts, joins, aggregates), not what a scalar
//! function allocates while it evaluates a batch. These functions can be asked for gigabytes
//! by a few bytes of SQL, so each is replaced by a wrapper that computes what a call would
//! make for the whole batch, from its arguments, and refuses past [`MAX_COMPUTED_BYTES`]
//! before the function allocates anything. Every other function's output is bounded by its
//! inputs.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray as _};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::FunctionRegistry as _;
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature,
};

/// Most bytes one call of a bounded function may make for one batch.
pub const MAX_COMPUTED_BYTES: u128 = 64 << 20;

/// How a function's output size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Size {
    /// `repeat(text, n)`: the text's length times `n`.
    Repeat,
    /// `lpad(text, n [, fill])`, `rpad`: `n` characters of up to 4 bytes.
    Pad,
    /// `array_repeat(value, n)`: `n` elements.
    ArrayRepeat,
    /// `range([start,] stop [, step])`, `generate_series`: one 8-byte element per step.
    Range,
}

const BOUNDED: [(&str, Size); 6] = [
    ("repeat", Size::Repeat),
    ("lpad", Size::Pad),
    ("rpad", Size::Pad),
    ("array_repeat", Size::ArrayRepeat),
    ("range", Size::Range),
    ("generate_series", Size::Range),
];

/// Replaces the session's size-amplifying functions with bounded ones.
pub fn register(state: &mut SessionState) {
    for (name, size) in BOUNDED {
        let Some(inner) = state.scalar_functions().get(name).cloned() else {
            continue;
        };
        let bounded = ScalarUDF::new_from_impl(Bounded { inner, size });
        // Registering under the same name (and aliases) replaces the original.
        let _ = state.register_udf(Arc::new(bounded));
    }
}

/// A function refused before it runs when its batch's output would be too large.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: Arc<ScalarUDF>,
    size: Size,
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bytes = output_bytes(self.size, &args.args, args.number_rows)?;
        if bytes > MAX_COMPUTED_BYTES {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{} would make {bytes} bytes for one batch, over the server's limit of \
                 {MAX_COMPUTED_BYTES} bytes for one function call",
                self.name()
            )));
        }
        self.inner.invoke_with_args(args)
    }
}

/// What a call of a function of `size` with `args` over `rows` rows would make, in bytes, at
/// most (saturating).
fn output_bytes(size: Size, args: &[ColumnarValue], rows: usize) -> Result<u128> {
    let int = |at: usize| -> Result<Vec<Option<i64>>> {
        args.get(at)
            .map_or(Ok(vec![None; rows]), |arg| ints(arg, rows))
    };
    let positive = |n: Option<i64>| u128::from(n.unwrap_or(0).max(0).unsigned_abs());
    let total = match size {
        Size::Repeat => {
            let lengths = args
                .first()
                .map_or(vec![0; rows], |arg| text_lengths(arg, rows));
            lengths
                .iter()
                .zip(int(1)?)
                .map(|(len, n)| (*len as u128).saturating_mul(positive(n)))
                .fold(0_u128, u128::saturating_add)
        }
        Size::Pad => int(1)?
            .into_iter()
            .map(|n| positive(n).saturating_mul(4))
            .fold(0, u128::saturating_add),
        Size::ArrayRepeat => int(1)?
            .into_iter()
            .map(|n| positive(n).saturating_mul(16))
            .fold(0, u128::saturating_add),
        Size::Range => {
            let (firsts, lasts, strides) = match args.len() {
                1 => (vec![Some(0); rows], int(0)?, vec![Some(1); rows]),
                2 => (int(0)?, int(1)?, vec![Some(1); rows]),
                _ => (int(0)?, int(1)?, int(2)?),
            };
            firsts
                .into_iter()
                .zip(lasts)
                .zip(strides)
                .map(|((first, last), stride)| {
                    let span = i128::from(last.unwrap_or(0)) - i128::from(first.unwrap_or(0));
                    let stride = i128::from(stride.unwrap_or(1)).max(1);
                    (span.unsigned_abs() / stride.unsigned_abs() + 1).saturating_mul(8)
                })
                .fold(0, u128::saturating_add)
        }
    };
    Ok(total)
}

/// An argument's values as integers, row by row.
///
/// # Errors
/// When it is not of an integer type (`range` over dates or timestamps): refused, since its
/// size cannot be told before it runs.
fn ints(arg: &ColumnarValue, rows: usize) -> Result<Vec<Option<i64>>> {
    let not_integer = |data_type: &DataType| {
        DataFusionError::NotImplemented(format!(
            "this server bounds the size of range, repeat and padding functions and only \
             takes integer counts and bounds for them, not {data_type}"
        ))
    };
    match arg {
        ColumnarValue::Scalar(value) => {
            if value.is_null() {
                return Ok(vec![None; rows]);
            }
            let data_type = value.data_type();
            if !data_type.is_integer() {
                return Err(not_integer(&data_type));
            }
            let Ok(ScalarValue::Int64(n)) = value.cast_to(&DataType::Int64) else {
                return Err(not_integer(&data_type));
            };
            Ok(vec![n; rows])
        }
        ColumnarValue::Array(array) => {
            if !array.data_type().is_integer() && array.data_type() != &DataType::Null {
                return Err(not_integer(array.data_type()));
            }
            let array = cast(array, &DataType::Int64)?;
            Ok(array.as_primitive::<Int64Type>().iter().collect())
        }
    }
}

/// An argument's byte lengths, row by row: of its text, or 16 for other values.
fn text_lengths(arg: &ColumnarValue, rows: usize) -> Vec<usize> {
    match arg {
        ColumnarValue::Scalar(value) => {
            let len = match value {
                ScalarValue::Utf8(text)
                | ScalarValue::LargeUtf8(text)
                | ScalarValue::Utf8View(text) => text.as_ref().map_or(0, String::len),
                _ => 16,
            };
            vec![len; rows]
        }
        ColumnarValue::Array(array) => match array.data_type() {
            DataType::Utf8 => array.as_string::<i32>().iter().map(len_of).collect(),
            DataType::LargeUtf8 => array.as_string::<i64>().iter().map(len_of).collect(),
            DataType::Utf8View => array.as_string_view().iter().map(len_of).collect(),
            _ => vec![16; array.len()],
        },
    }
}

fn len_of(text: Option<&str>) -> usize {
    text.map_or(0, str::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_arguments() {
        let text = |s: &str| ColumnarValue::Scalar(ScalarValue::Utf8(Some(s.into())));
        let int = |n: i64| ColumnarValue::Scalar(ScalarValue::Int64(Some(n)));
        let bytes = |size, args: &[ColumnarValue], rows| output_bytes(size, args, rows).unwrap();
        assert_eq!(bytes(Size::Repeat, &[text("ab"), int(10)], 3), 60);
        assert_eq!(bytes(Size::Repeat, &[text("ab"), int(-5)], 3), 0);
        assert_eq!(bytes(Size::Pad, &[text("x"), int(100)], 1), 400);
        assert_eq!(bytes(Size::Range, &[int(1), int(100), int(10)], 1), 8 * 10);
        assert_eq!(
            bytes(Size::Range, &[int(i64::MIN), int(i64::MAX)], 2),
            (2 * 8) << 64
        );
        let lengths =
            ColumnarValue::Array(Arc::new(datafusion::arrow::array::StringArray::from(vec![
                Some("abc"),
                None,
                Some("z"),
            ])));
        assert_eq!(bytes(Size::Repeat, &[lengths, int(2)], 3), 8);
        let dates = ColumnarValue::Scalar(ScalarValue::Date32(Some(1)));
        assert!(output_bytes(Size::Range, &[dates.clone(), dates], 1).is_err());
    }
}
