//! The OpenAPI 3.1 document of the API, served at `GET /v1/openapi.json`.

use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::format::Format;
use crate::reports::catalog;

pub(super) async fn openapi() -> Response {
    axum::Json(openapi_document()).into_response()
}

/// What every route may answer: a wrong method, a request head past the limits.
pub(super) const HEAD_ERRORS: &[&str] = &["405", "414", "431"];

/// Every `/v1` route: the same, and a missing token.
pub(super) const V1_ERRORS: &[&str] = &["401", "405", "414", "431"];

/// A route that runs a query.
pub(super) const QUERY_ERRORS: &[&str] = &[
    "400", "401", "404", "405", "408", "414", "422", "431", "500", "503",
];

/// A route that reads a body.
pub(super) const BODY_ERRORS: &[&str] = &["413", "415"];

/// `responses` with the documented error answer for each of `codes`.
pub(super) fn with_errors(mut responses: serde_json::Value, codes: &[&str]) -> serde_json::Value {
    if let Some(map) = responses.as_object_mut() {
        for code in codes {
            map.insert(
                (*code).to_owned(),
                json!({"$ref": "#/components/responses/Error"}),
            );
        }
    }
    responses
}

/// The OpenAPI 3.1 document of this API.
pub fn openapi_document() -> serde_json::Value {
    let formats = json!({
        "name": "format", "in": "query", "required": false,
        "description": "answer format (default: from Accept, else json); json is bounded by the row limit, the others stream",
        "schema": {"type": "string", "enum": Format::NAMES}
    });
    let answer = json!({
        "200": {"description": "the rows", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Rows"}},
            "text/csv": {"schema": {"type": "string"}},
            "application/vnd.apache.arrow.stream": {"schema": {"type": "string", "format": "binary"}},
            "application/vnd.apache.parquet": {"schema": {"type": "string", "format": "binary"}}
        }},
    });
    let answer = with_errors(answer, QUERY_ERRORS);
    // The replays' range and the keys they list (what-if; the recommendations also take the
    // review's parameters, which `/v1/reports` lists).
    let replay_params = json!([
        {"name": "from", "in": "query", "required": false, "description": "start, inclusive (default: to minus 7 days)", "schema": {"type": "string"}},
        {"name": "to", "in": "query", "required": false, "description": "end, exclusive (default: the next full hour)", "schema": {"type": "string"}},
        {"name": "keys", "in": "query", "required": false, "description": "keys whose refusals change most to list (default 10, at most 10000)", "schema": {"type": "integer"}}
    ]);
    let mut what_if_params = replay_params.clone();
    if let Some(list) = what_if_params.as_array_mut() {
        list.push(json!({"name": "sample_keys", "in": "query", "required": false, "description": format!("keys replayed whole (default {}): past it in the range, a sample of about that many keys, chosen by key hash, is replayed and the counts are estimates, each limit's with its bound (`sample`, `bound`)", crate::whatif::SAMPLE_KEYS), "schema": {"type": "integer", "minimum": 1}}));
    }
    let mut recommendation_params = replay_params.clone();
    if let Some(list) = recommendation_params.as_array_mut() {
        list.push(json!({"name": crate::recommend::PROOF_SAMPLE_KEYS, "in": "query", "required": false, "description": format!("keys of a limit its proof replays whole (default {}): past it, a sample of about that many of the limit's keys, chosen by key hash, each replayed whole; each proof says its `sample_rate`", crate::prove::SAMPLE_KEYS), "schema": {"type": "integer", "minimum": 1}}));
    }
    let mut report_params = vec![
        json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string", "enum": catalog().iter().map(|r| r.name).collect::<Vec<_>>()}}),
        formats.clone(),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for r in catalog() {
        for p in r.params {
            if seen.insert(p.name) {
                report_params.push(json!({"name": p.name, "in": "query", "required": false, "description": p.doc, "schema": {"type": "string"}}));
            }
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "verdict query service", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Read-only SQL and named reports over the rate limiter's decisions: decisions, denied_hourly, overage, policies."},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sql": {"post": {
                "summary": "Run one read-only SQL query (SELECT or EXPLAIN of one)",
                "parameters": [formats,
                    {"name": "version", "in": "query", "required": false, "schema": {"type": "integer", "minimum": 0},
                     "description": "time travel: `decisions` reads this version of the raw table's Delta log (the other tables as they are now)"},
                    {"name": "as_of", "in": "query", "required": false, "schema": {"type": "string", "format": "date-time"},
                     "description": "time travel: `decisions` reads the newest version committed at or before this time; not with version"}],
                "requestBody": {"required": true, "content": {
                    "text/plain": {"schema": {"type": "string"}},
                    "application/json": {"schema": {"type": "object", "required": ["sql"], "properties": {"sql": {"type": "string"}}}}
                }},
                "responses": with_errors(answer.clone(), BODY_ERRORS)
            }},
            "/v1/reports": {"get": {"summary": "The named reports and their parameters",
                "responses": with_errors(json!({"200": {"description": "reports", "content": {"application/json": {}}}}), V1_ERRORS)}},
            "/v1/reports/{name}": {"get": {"summary": "Run a named report", "parameters": report_params, "responses": answer}},
            "/v1/what-if": {"post": {
                "summary": "Replay the recorded requests of a range under a candidate policy (the limiter's decision core): per tier × route class, what it would have refused beside what was refused, and the keys that change most",
                "parameters": what_if_params,
                "requestBody": {"required": true, "content": {"application/toml": {"schema": {"type": "string"}}, "text/plain": {"schema": {"type": "string"}}}},
                "responses": with_errors(
                    with_errors(json!({"200": {"description": "the replay", "content": {"application/json": {}}}}), QUERY_ERRORS),
                    BODY_ERRORS
                )
            }},
            "/v1/recommendations": {"get": {
                "summary": "The limit review's recommendations, each proven by replaying the range under it (share of requests and keys refused, in force and recommended), the policy in force with them put in (`policy`, TOML) and the `verdict policy set-limit` commands that apply them (`commands`)",
                "parameters": recommendation_params,
                "responses": with_errors(json!({"200": {"description": "the proven recommendations", "content": {"application/json": {}}}}), QUERY_ERRORS)
            }},
            "/v1/tables": {"get": {"summary": "The tables and their columns",
                "responses": with_errors(json!({"200": {"description": "tables", "content": {"application/json": {}}}}), &["401", "405", "414", "431", "500"])}},
            "/v1/openapi.json": {"get": {"summary": "This document", "responses": with_errors(json!({"200": {"description": "OpenAPI 3.1"}}), V1_ERRORS)}},
            "/healthz": {"get": {"summary": "Liveness", "security": [], "responses": with_errors(json!({"200": {"description": "ok"}}), HEAD_ERRORS)}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [], "responses": with_errors(json!({"200": {"description": "text format 0.0.4"}}), HEAD_ERRORS)}}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Rows": {"type": "object", "properties": {
                    "columns": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "type": {"type": "string"}}}},
                    "rows": {"type": "array", "items": {"type": "object"}},
                    "row_count": {"type": "integer"}
                }},
                "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
                    "kind": {"type": "string", "enum": ["refused", "invalid_query", "query_too_large", "bad_request", "method_not_allowed", "body_too_large", "uri_too_long", "headers_too_large", "unsupported_media_type", "not_found", "memory_limit", "time_limit", "row_limit", "answer_too_large", "value_too_large", "busy", "internal", "unauthorized"]},
                    "message": {"type": "string"}
                }}}}
            },
            "responses": {"Error": {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}
        }
    })
}
