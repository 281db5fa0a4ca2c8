//! The API as a contract: an OpenAPI 3.1 document generated from the
//! handlers' own `#[utoipa::path]` annotations, served at
//! `/api/openapi.json`.
//!
//! Every module registers its handlers with `utoipa_axum::routes!`, which
//! takes the route's path and method from the annotation: a route cannot
//! be served without being documented, nor documented at a path it is not
//! served at. `scripts/test` runs schemathesis against the document.
//!
//! Added here, where the handlers cannot say it: the two bearer schemes,
//! the event stream's events (OpenAPI 3.1 has no words for Server-Sent
//! Events: the `text/event-stream` answer's schema describes one event,
//! its `data` a JSON string with a `contentSchema`, as OpenAPI 3.2 spells
//! an `itemSchema`; schemathesis checks every event against it), and the
//! links a client (or schemathesis) follows: from a join to position,
//! events and leave (the ticket) and to an order or a token claim (the
//! entry token); from a claim to its consume or release; from an order to
//! the order.

use std::sync::LazyLock;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use bytes::Bytes;
use utoipa::openapi::link::{Link, LinkBuilder};
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{OpenApi as Document, Ref, RefOr};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use super::AppState;
use super::wire::{GoneEvent, QueueStatus, ReadyEvent};
use crate::error::{ErrorBody, ErrorCode};

/// The document's frame: what no handler states.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "waitroom",
        description = "A virtual waiting room in front of an order API: a fair queue, \
            the buyer's place live over Server-Sent Events, a short-lived entry token, \
            and a gate that lets each token buy exactly once. Errors are always \
            `{\"error\": \"<code>\", \"message\": \"...\"}`."
    ),
    components(schemas(ErrorBody, ErrorCode, StreamEvent)),
    modifiers(&BearerSchemes),
    tags(
        (name = "queue", description = "Join, look up one's place, follow it live, leave."),
        (name = "orders", description = "The demo order service, behind the gate."),
        (name = "tokens", description = "The token API for order services in other languages."),
        (name = "pass", description = "The admission pass of a protected site: the keys (JWKS), taking a pass once admitted, the gateway check (nginx `auth_request`, Caddy `forward_auth`)."),
        (name = "admin", description = "Operators: counts, live queue settings, holding admission, products, the console's feed."),
        (name = "fairness", description = "The public admission log: signed heads, leaves, inclusion and consistency proofs, the signing keys (`--fairness-log`)."),
        (name = "operations", description = "Probes, metrics and this document."),
    )
)]
pub struct ApiDoc;

/// The security schemes the admin and token APIs name.
struct BearerSchemes;

impl Modify for BearerSchemes {
    fn modify(&self, api: &mut Document) {
        let components = api.components.get_or_insert_with(Default::default);
        for (name, what) in [
            ("admin", "the admin token (`--admin-token`)"),
            (
                "service",
                "the service token (`--service-token`, else the admin token)",
            ),
        ] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(format!("`Authorization: Bearer` {what}")))
                        .build(),
                ),
            );
        }
    }
}

/// One event of the stream (`text/event-stream`): `event` names it, `id`
/// orders it (`<pass>` or `<pass>.<n>`), `data` is its JSON, and the first
/// frame also sets `retry`.
pub struct StreamEvent;

impl PartialSchema for StreamEvent {
    fn schema() -> RefOr<Schema> {
        let event = |name: &str, data: &str, what: &str| {
            ObjectBuilder::new()
                .description(Some(what))
                .property(
                    "event",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some([name])),
                )
                .required("event")
                .property(
                    "id",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some(r"^[0-9]+(\.[0-9]+)?$"))
                        .description(Some(
                            "`<pass>` or `<pass>.<n>`; only grows for a buyer, \
                             compared as the pair (pass, n)",
                        )),
                )
                .required("id")
                .property(
                    "retry",
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .description(Some("ms to wait before reconnecting; first frame only")),
                )
                .property(
                    "data",
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .description(Some("the event's JSON"))
                        .content_media_type("application/json")
                        .content_schema(Some(Ref::from_schema_name(data))),
                )
                .required("data")
        };
        OneOfBuilder::new()
            .description(Some(
                "The stream's events, in the order of the buyer's state: the current \
                 state at once on every connect, then each change, `: keep-alive` \
                 comments while idle.",
            ))
            .item(event(
                "waiting",
                QueueStatus::name().as_ref(),
                "In line: the status a poll would answer now.",
            ))
            .item(event(
                "ready",
                ReadyEvent::name().as_ref(),
                "Admitted: the status with the entry token, and `admittedAt`.",
            ))
            .item(event(
                "gone",
                GoneEvent::name().as_ref(),
                "The place ended; the stream closes after it.",
            ))
            .item(event(
                "prequeue",
                QueueStatus::name().as_ref(),
                "In a lottery's pre-queue (a `PRE_QUEUE` status): at connect and whenever                  `opensAt` moves; at the draw the same stream goes on with `waiting`.",
            ))
            .into()
    }
}

impl ToSchema for StreamEvent {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((QueueStatus::name().into(), QueueStatus::schema()));
        schemas.push((ReadyEvent::name().into(), ReadyEvent::schema()));
        schemas.push((GoneEvent::name().into(), GoneEvent::schema()));
        <QueueStatus as ToSchema>::schemas(schemas);
        <ReadyEvent as ToSchema>::schemas(schemas);
        <GoneEvent as ToSchema>::schemas(schemas);
    }
}

/// The links between operations, by operation id: a join's ticket leads
/// to the place's other operations (a poll's answer carries no ticket, so
/// the links start at the join), a READY join's token to an order or a
/// claim, a claim to its settling, an order's id to the order. Which
/// answer links where is [`links_of`]; this only walks the document.
fn add_links(api: &mut Document) {
    for path_item in api.paths.paths.values_mut() {
        let operations = [
            path_item.get.as_mut(),
            path_item.post.as_mut(),
            path_item.put.as_mut(),
            path_item.delete.as_mut(),
        ];
        for operation in operations.into_iter().flatten() {
            let id = operation.operation_id.clone().unwrap_or_default();
            for (status, response) in operation.responses.responses.iter_mut() {
                let RefOr::T(response) = response else {
                    continue;
                };
                for (name, link) in links_of(&id, status) {
                    response.links.insert(name.into(), link.into());
                }
            }
        }
    }
}

/// The links of operation `id`'s answer with `status`, by name.
fn links_of(id: &str, status: &str) -> Vec<(&'static str, Link)> {
    match (id, status) {
        ("join", "200" | "201") => join_links(),
        ("claim", "200") => ["consume", "release"]
            .into_iter()
            .map(|to| {
                let settle = LinkBuilder::new()
                    .operation_id(to)
                    .request_body(Some(serde_json::json!({
                        "userId": "$response.body#/userId",
                        "queue": "$response.body#/queue",
                        "claimId": "$response.body#/claimId",
                    })))
                    .description("Settle the claim.")
                    .build();
                (to, settle)
            })
            .collect(),
        ("place_order", "201") => vec![(
            "order",
            LinkBuilder::new()
                .operation_id("get_order")
                .parameter("id", "$response.body#/orderId")
                .parameter("header.X-User-Id", "$request.header.X-User-Id")
                .description("Read the order back.")
                .build(),
        )],
        _ => Vec::new(),
    }
}

/// A join's links: its ticket to the place's other operations, its entry
/// token (once READY) to an order and to a claim.
fn join_links() -> Vec<(&'static str, Link)> {
    let ticket = |to: &str, what: &str| {
        LinkBuilder::new()
            .operation_id(to)
            .parameter("queue", "$request.path.queue")
            .parameter("header.X-Queue-Ticket", "$response.body#/ticket")
            .description(what)
            .build()
    };
    let links = [
        (
            "position",
            ticket("position", "Look up the place this ticket stands for."),
        ),
        ("events", ticket("events", "Follow the place live.")),
        ("leave", ticket("leave", "Give up the place.")),
        (
            "claim",
            LinkBuilder::new()
                .operation_id("claim")
                .request_body(Some(serde_json::json!({
                    "token": "$response.body#/entryToken",
                })))
                .description(
                    "Claim the entry token (token API), once READY; \
                     the answer names its buyer.",
                )
                .build(),
        ),
    ];
    // The demo order service's own operation, in the builds that have it.
    let order = cfg!(feature = "demo-orders").then(|| {
        let order = LinkBuilder::new()
            .operation_id("place_order")
            .parameter("header.X-User-Id", "$request.header.X-User-Id")
            .parameter("header.X-Entry-Token", "$response.body#/entryToken")
            .description("Order with the entry token, once READY.")
            .build();
        ("order", order)
    });
    links.into_iter().chain(order).collect()
}

/// The parameters of every request that names a place by its ticket
/// (position, events, leave): the queue, the ticket in its three carriers
/// (in the order they are taken) and the optional `X-User-Id` check.
pub struct TicketParams;

impl utoipa::IntoParams for TicketParams {
    fn into_params(
        _: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::Required;
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        use utoipa::openapi::schema::SchemaType;
        let text = |nullable: bool, pattern: Option<&str>| {
            let kind = if nullable {
                SchemaType::from_iter([Type::String, Type::Null])
            } else {
                SchemaType::new(Type::String)
            };
            ObjectBuilder::new()
                .schema_type(kind)
                .pattern(pattern)
                .build()
        };
        let param = |name: &str, place: ParameterIn, required: bool, description: &str| {
            ParameterBuilder::new()
                .name(name)
                .parameter_in(place)
                .required(if required {
                    Required::True
                } else {
                    Required::False
                })
                .description(Some(description))
        };
        vec![
            param("queue", ParameterIn::Path, true, "The queue's name.")
                .schema(Some(text(false, Some(r"^[a-z0-9_-]{1,64}$"))))
                .example(Some("default".into()))
                .build(),
            param(
                "X-Queue-Ticket",
                ParameterIn::Header,
                false,
                "The ticket a join answered (taken first).",
            )
            .schema(Some(text(true, None)))
            .build(),
            param(
                "ticket",
                ParameterIn::Query,
                false,
                "The ticket, only with `--ticket-in-query` (off by default: a query string lands in access logs); ignored otherwise. Browsers send the cookie.",
            )
            .schema(Some(text(false, None)))
            .build(),
            param(
                "waitroom_ticket",
                ParameterIn::Cookie,
                false,
                "The ticket cookie a join set (taken last).",
            )
            .schema(Some(text(true, None)))
            .build(),
            param(
                "X-User-Id",
                ParameterIn::Header,
                false,
                "Optional; when sent, it must be the ticket's user.",
            )
            .schema(Some(text(true, Some(r"^[A-Za-z0-9_.:-]{1,64}$"))))
            .build(),
        ]
    }
}

/// The whole document: the frame, every route's operation, the links.
pub fn document() -> Document {
    let (_, mut api) = super::routes().split_for_parts();
    add_links(&mut api);
    api
}

/// The document as served, built once.
static DOCUMENT: LazyLock<Bytes> = LazyLock::new(|| {
    Bytes::from(serde_json::to_vec(&document()).expect("the document serializes"))
});

/// This document.
#[utoipa::path(
    get,
    path = "/api/openapi.json",
    tag = "operations",
    operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.",
        content_type = "application/json", body = Object))
)]
pub async fn openapi_json(State(state): State<AppState>) -> impl IntoResponse {
    let base = &state.settings().base_path;
    let body = if base.is_empty() {
        DOCUMENT.clone()
    } else {
        // Under a base path every route is below it: say so in `servers`.
        let mut doc: serde_json::Value =
            serde_json::from_slice(&DOCUMENT).expect("the document is JSON");
        doc["servers"] = serde_json::json!([{ "url": base }]);
        Bytes::from(serde_json::to_vec(&doc).expect("the document serializes"))
    };
    ([(header::CONTENT_TYPE, "application/json")], body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route the router serves is in the document with a response
    /// for each status it is documented to answer, and the links name
    /// operations that exist.
    #[test]
    fn the_document_covers_the_api_and_its_links_resolve() {
        let api = serde_json::to_value(document()).unwrap();
        assert_eq!(api["openapi"], "3.1.0");
        let paths = api["paths"].as_object().unwrap();
        for (path, methods) in [
            ("/api/queues/{queue}/entries", &["post"][..]),
            ("/api/queues/{queue}/position", &["get"]),
            // The lean writer matches the stream's route by this constant.
            (super::super::EVENTS_PATH, &["get"]),
            ("/api/queues/{queue}/entries/me", &["delete"]),
            #[cfg(feature = "demo-orders")]
            ("/api/orders", &["post"]),
            #[cfg(feature = "demo-orders")]
            ("/api/orders/{id}", &["get"]),
            #[cfg(feature = "demo-orders")]
            ("/api/products", &["get"]),
            ("/api/tokens/claim", &["post"]),
            ("/api/tokens/consume", &["post"]),
            ("/api/tokens/release", &["post"]),
            ("/api/admin/queues", &["get"]),
            ("/api/admin/queues/{queue}/pause", &["post"]),
            ("/api/admin/queues/{queue}/resume", &["post"]),
            #[cfg(feature = "demo-orders")]
            ("/api/admin/products/{id}", &["put"]),
            #[cfg(feature = "demo-orders")]
            ("/api/admin/products", &["get"]),
            ("/api/admin/queues/{queue}", &["get", "put", "delete"]),
            ("/api/admin/events", &["get"]),
            ("/api/admin/queues/{queue}/audit", &["get"]),
            ("/healthz", &["get"]),
            ("/readyz", &["get"]),
            ("/metrics", &["get"]),
            ("/api/openapi.json", &["get"]),
            ("/.well-known/jwks.json", &["get"]),
            ("/api/queues/{queue}/pass", &["get"]),
            ("/api/gate/check", &["get"]),
            ("/api/admin/sessions/{id}", &["delete"]),
        ] {
            for method in methods {
                assert!(paths[path].get(*method).is_some(), "{method} {path}");
            }
        }
        let ids: Vec<&str> = paths
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
            .filter_map(|op| op["operationId"].as_str())
            .collect();
        let mut links = 0;
        for op in paths
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
        {
            for response in op["responses"]
                .as_object()
                .into_iter()
                .flat_map(|r| r.values())
            {
                for link in response["links"]
                    .as_object()
                    .into_iter()
                    .flat_map(|l| l.values())
                {
                    let to = link["operationId"].as_str().unwrap();
                    assert!(ids.contains(&to), "a link to {to}");
                    links += 1;
                }
            }
        }
        assert!(links >= 8, "{links} links");
        // Every code an endpoint answers is named in its description.
        let says = |path: &str, method: &str, status: &str, code: &str| {
            let text = paths[path][method]["responses"][status]["description"]
                .as_str()
                .unwrap_or_default();
            assert!(
                text.contains(code),
                "{method} {path} {status}: {code} in {text:?}"
            );
        };
        for (path, method) in [
            ("/api/queues/{queue}/position", "get"),
            (super::super::EVENTS_PATH, "get"),
            ("/api/queues/{queue}/entries/me", "delete"),
        ] {
            for code in ["missing_identity", "ticket_user_mismatch"] {
                says(path, method, "401", code);
            }
        }
        #[cfg(feature = "demo-orders")]
        for code in ["missing_user_id", "missing_identity"] {
            says("/api/orders/{id}", "get", "401", code);
        }
        #[cfg(feature = "demo-orders")]
        says("/api/orders", "post", "408", "request_timeout");
        // Every error code is listed, as the values of `ErrorBody.error`.
        let listed = &api["components"]["schemas"]["ErrorCode"]["enum"];
        for code in ErrorCode::ALL {
            assert!(
                listed
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c == code.as_str()),
                "{code} in {listed}"
            );
        }
        // A claim takes the token alone.
        let claim = api["components"]["schemas"]["ClaimRequest"]["required"].clone();
        assert_eq!(claim, serde_json::json!(["token"]), "{claim}");
        let stream = &paths["/api/queues/{queue}/events"]["get"]["responses"]["200"]["content"];
        assert!(stream.get("text/event-stream").is_some(), "{stream}");
        for schema in [
            "QueueStatus",
            "ReadyEvent",
            "GoneEvent",
            "StreamEvent",
            "ErrorBody",
            "ErrorCode",
            "AuditPage",
            "AuditEntry",
        ] {
            assert!(
                api["components"]["schemas"].get(schema).is_some(),
                "{schema}"
            );
        }
    }
}
