//! The role each operation needs: one table for the API (the OpenAPI document states it from
//! here, and the role matrix test reads it back from the document) and one for the settings
//! pages. A request is looked up by the route pattern it was routed to: a page the table does
//! not list needs `viewer`, and a request whose pattern is not known needs `admin`.

use tocsin_domain::Role;

use Role::{Admin, Operator, Viewer};

/// `(method, path template, role)` of every `/api/v1` operation.
pub const API: &[(&str, &str, Role)] = &[
    ("GET", "/api/v1/webhooks", Viewer),
    ("POST", "/api/v1/webhooks", Admin),
    ("GET", "/api/v1/webhooks/{id}", Viewer),
    ("PATCH", "/api/v1/webhooks/{id}", Admin),
    ("DELETE", "/api/v1/webhooks/{id}", Admin),
    ("POST", "/api/v1/webhooks/{id}/reveal-secret", Admin),
    ("POST", "/api/v1/webhooks/{id}/rotate-secret", Admin),
    ("POST", "/api/v1/webhooks/{id}/test", Operator),
    ("POST", "/api/v1/webhooks/{id}/recover", Operator),
    ("POST", "/api/v1/webhooks/{id}/replay", Operator),
    ("GET", "/api/v1/deliveries", Viewer),
    ("GET", "/api/v1/deliveries/{id}", Viewer),
    ("POST", "/api/v1/deliveries/{id}/retry", Operator),
    ("GET", "/api/v1/incidents", Viewer),
    ("GET", "/api/v1/incidents/{id}", Viewer),
    ("PATCH", "/api/v1/incidents/{id}", Operator),
    ("GET", "/api/v1/tokens", Viewer),
    ("POST", "/api/v1/tokens", Admin),
    ("DELETE", "/api/v1/tokens/{id}", Admin),
    ("GET", "/api/v1/admin-keys", Admin),
    ("POST", "/api/v1/admin-keys", Admin),
    ("DELETE", "/api/v1/admin-keys/{id}", Admin),
    ("GET", "/api/v1/audit-log", Admin),
];

/// `(method, path template, role)` of the settings pages that need more than `viewer`.
pub const PAGES: &[(&str, &str, Role)] = &[
    ("GET", "/settings/webhooks/new", Admin),
    ("POST", "/settings/webhooks/new", Admin),
    ("GET", "/settings/webhooks/{id}/edit", Admin),
    ("POST", "/settings/webhooks/{id}/edit", Admin),
    ("POST", "/settings/webhooks/{id}/delete", Admin),
    (
        "POST",
        "/settings/webhooks/{id}/{switch:enable|disable}",
        Admin,
    ),
    ("POST", "/settings/webhooks/{id}/rotate-secret", Admin),
    ("POST", "/settings/webhooks/{id}/test", Operator),
    ("POST", "/settings/webhooks/{id}/recover", Operator),
    ("POST", "/settings/webhooks/{id}/replay", Operator),
    ("POST", "/settings/deliveries/{id}/retry", Operator),
    ("POST", "/settings/incidents/{id}/status", Operator),
    ("POST", "/settings/tokens", Admin),
    ("POST", "/settings/tokens/{id}/revoke", Admin),
    ("GET", "/settings/admin-keys", Admin),
    ("POST", "/settings/admin-keys", Admin),
    ("POST", "/settings/admin-keys/{id}/revoke", Admin),
    ("GET", "/settings/audit-log", Admin),
];

/// The role a request routed to `pattern` needs: its row in `table`, `viewer` when the table
/// has none, `admin` when the pattern is not known (fail closed).
pub fn needed(table: &[(&str, &str, Role)], method: &str, pattern: Option<&str>) -> Role {
    let Some(pattern) = pattern else {
        return Admin;
    };
    table
        .iter()
        .find(|(m, template, _)| *m == method && *template == pattern)
        .map_or(Viewer, |(_, _, role)| *role)
}

/// The role of an API operation as the OpenAPI document names it (`None`: not in [`API`]).
pub fn of_operation(method: &str, template: &str) -> Option<Role> {
    API.iter()
        .find(|(m, t, _)| m.eq_ignore_ascii_case(method) && *t == template)
        .map(|(_, _, role)| *role)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_find_their_operation_by_pattern() {
        assert_eq!(needed(API, "POST", Some("/api/v1/webhooks")), Admin);
        assert_eq!(needed(API, "GET", Some("/api/v1/webhooks")), Viewer);
        assert_eq!(
            needed(API, "POST", Some("/api/v1/deliveries/{id}/retry")),
            Operator
        );
        assert_eq!(needed(API, "GET", None), Admin);
        assert_eq!(
            needed(PAGES, "GET", Some("/settings/webhooks/{id}")),
            Viewer
        );
        assert_eq!(
            of_operation("patch", "/api/v1/incidents/{id}"),
            Some(Operator)
        );
    }
}
