//! A table's Arrow schema as Delta's schema (`metaData.schemaString`): a JSON struct type
//! whose primitive types are Delta's. Each Arrow type maps to the Delta type that engines
//! read the Parquet column as (Spark reads an unsigned 8-bit column as `short`, a 64-bit
//! one as `decimal(20,0)`), so a Delta reader asks each file for what is in it.

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use serde_json::{Value, json};

/// Why a schema has no Delta spelling.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {column}: Arrow type {data_type} has no Delta type")]
pub struct SchemaError {
    /// The column.
    pub column: String,
    /// Its type.
    pub data_type: String,
}

/// The Delta type of an Arrow type.
pub fn delta_type(t: &DataType) -> Option<&'static str> {
    Some(match t {
        DataType::Boolean => "boolean",
        DataType::Int8 => "byte",
        DataType::Int16 | DataType::UInt8 => "short",
        DataType::Int32 | DataType::UInt16 => "integer",
        DataType::Int64 | DataType::UInt32 => "long",
        DataType::UInt64 => "decimal(20,0)",
        DataType::Float32 => "float",
        DataType::Float64 => "double",
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string",
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => "binary",
        DataType::Date32 => "date",
        DataType::Timestamp(TimeUnit::Millisecond | TimeUnit::Microsecond, Some(_)) => "timestamp",
        _ => return None,
    })
}

fn field_json(f: &Field) -> Result<Value, SchemaError> {
    let t = delta_type(f.data_type()).ok_or_else(|| SchemaError {
        column: f.name().clone(),
        data_type: f.data_type().to_string(),
    })?;
    Ok(json!({"name": f.name(), "type": t, "nullable": f.is_nullable(), "metadata": {}}))
}

/// The schema string of a table whose files hold `schema` and whose partition columns
/// (not in the files; values in each `add`) are `partitions`, in that order.
pub fn schema_string(schema: &Schema, partitions: &[Field]) -> Result<String, SchemaError> {
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let mut fields = Vec::new();
    for f in schema.fields() {
        fields.push(field_json(f)?);
    }
    for p in partitions
        .iter()
        .filter(|p| !names.contains(&p.name().as_str()))
    {
        fields.push(field_json(p)?);
    }
    Ok(json!({"type": "struct", "fields": fields}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_columns_then_partition_columns_in_delta_types() {
        let schema = Schema::new(vec![
            Field::new(
                "event_time",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                false,
            ),
            Field::new("key_id", DataType::FixedSizeBinary(16), false),
            Field::new("tier", DataType::UInt8, false),
            Field::new("n", DataType::UInt64, true),
        ]);
        let parts = [
            Field::new("date", DataType::Date32, false),
            Field::new("hour", DataType::Int32, false),
        ];
        let s: Value = serde_json::from_str(&schema_string(&schema, &parts).unwrap()).unwrap();
        let types: Vec<(&str, &str)> = s["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["name"].as_str().unwrap(), f["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            types,
            [
                ("event_time", "timestamp"),
                ("key_id", "binary"),
                ("tier", "short"),
                ("n", "decimal(20,0)"),
                ("date", "date"),
                ("hour", "integer"),
            ]
        );
        assert_eq!(s["fields"][3]["nullable"], true);
        // A partition column that is also in the files (the overage's `date`) is listed once.
        let overage = Schema::new(vec![Field::new("date", DataType::Date32, false)]);
        let s: Value =
            serde_json::from_str(&schema_string(&overage, &parts[..1]).unwrap()).unwrap();
        assert_eq!(s["fields"].as_array().unwrap().len(), 1);
        let bad = Schema::new(vec![Field::new("x", DataType::Float16, false)]);
        assert_eq!(
            schema_string(&bad, &[]).unwrap_err().column,
            "x".to_string()
        );
    }
}
