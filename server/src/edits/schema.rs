//! The OpenAPI schema of an edit request, given by the types [`parse`](super::parse) fills:
//! [`Edits`] is the request (`EditRequest`), [`Contains`] a precondition (`Condition`), each
//! in the JSON form the parser reads.

use std::borrow::Cow;

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::{Contains, Edits};

/// The operations `parse` reads, by the key naming each one's root.
const OPS: &str = "Operations, applied in order in one transaction, each naming its root by its \
kind's\nkey: text `{\"text\": R, \"insert\": \"s\", \"at\"?: i}`, `{\"text\": R, \"delete\": n, \
\"at\": i}`,\n`{\"text\": R, \"replace\": \"old\", \"with\": \"new\", \"all\"?: false}`; map \
`{\"map\": R, \"set\":\n\"key\", \"value\": json}`, `{\"map\": R, \"delete\": \"key\"}`; array \
`{\"array\": R, \"insert\":\n[json], \"at\": i}`, `{\"array\": R, \"delete\": n, \"at\": i}`, \
`{\"array\": R, \"push\":\n[json]}`; XML `{\"xml\": R, \"append\": {\"type\": \"paragraph\", \
\"attrs\"?: {}, \"text\"?:\n\"s\"}}`, `{\"xml\": R, \"insert\": {...}, \"at\": i}`, `{\"xml\": \
R, \"replace\": \"old\", \"with\":\n\"new\", \"all\"?: false, \"element\"?: i}`. Indices count \
UTF-16 code units. At most 1000.";

/// A string, or `null`.
fn nullable_string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Null]))
}

impl PartialSchema for Edits {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The request, as the OpenAPI document shows it (the handler reads it as JSON \
                 and\n`crate::edits::parse` checks it, naming the operation a problem is in).",
            ))
            .property(
                "ops",
                ArrayBuilder::new()
                    .items(ObjectBuilder::new().schema_type(Type::Object))
                    .description(Some(OPS)),
            )
            .required("ops")
            .property(
                "if_contains",
                ArrayBuilder::new()
                    .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
                    .items(Ref::from_schema_name(Contains::name()))
                    .description(Some("Applied only if each names text its root contains.")),
            )
            .property(
                "state_vector",
                nullable_string().description(Some(
                    "Applied only onto this state (base64 Yjs v1 state vector).",
                )),
            )
            .into()
    }
}

impl ToSchema for Edits {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EditRequest")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Contains::name().into_owned(), Contains::schema()));
    }
}

impl PartialSchema for Contains {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "A precondition: the text root `text` (or a text node of the XML root `xml`) \
                 contains\n`value`.",
            ))
            .property("text", nullable_string())
            .property("xml", nullable_string())
            .property("value", ObjectBuilder::new().schema_type(Type::String))
            .required("value")
            .into()
    }
}

impl ToSchema for Contains {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Condition")
    }
}
