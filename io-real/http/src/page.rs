//! Nomad's list pagination: `?per_page=N` returns at most N items, `?next_token=T` starts at
//! the first item whose token is not below T, and the response's `X-Nomad-NextToken` header
//! names the first item of the next page (absent on the last page). Items are listed in
//! token order (a job's or a CSI volume's token is its ID, or `namespace.ID` when listing every
//! namespace; an allocation's, evaluation's, node's or plugin's its ID; a variable's its path).
//! Like Nomad, a `per_page` that is no number is ignored.

use std::sync::Mutex;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use drover_core::bexpr::Expr;
use serde_json::Value;

use super::{ApiError, QueryOptions};

/// `?filter=<go-bexpr>`: each item's full API object is evaluated before paging, as Nomad's
/// paginator does, so `per_page` counts matching items. An expression that does not parse
/// is refused before anything is read (400); one that cannot be evaluated on an item (a
/// field that is not there) fails the list (500), with go-bexpr's texts.
pub struct ItemFilter {
    expr: Option<Expr>,
    error: Mutex<Option<String>>,
}

impl ItemFilter {
    pub fn of(options: &QueryOptions) -> Result<ItemFilter, ApiError> {
        let expr = match options.filter.as_deref().filter(|text| !text.trim().is_empty()) {
            None => None,
            Some(text) => Some(Expr::parse(text).map_err(|error| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("failed to read filter expression: {error}"),
                )
            })?),
        };
        Ok(ItemFilter {
            expr,
            error: Mutex::new(None),
        })
    }

    /// Whether the item whose full object `object` renders is listed (rendered only when
    /// there is a filter). After an evaluation error nothing more is listed.
    pub fn keeps(&self, object: impl FnOnce() -> Value) -> bool {
        let Some(expr) = &self.expr else {
            return true;
        };
        let mut error = self.error.lock().expect("filter lock");
        if error.is_some() {
            return false;
        }
        match expr.evaluate(&object()) {
            Ok(keep) => keep,
            Err(why) => {
                *error = Some(why);
                false
            }
        }
    }

    /// `listed`, unless an item could not be evaluated.
    pub fn finish<T>(self, listed: T) -> Result<T, ApiError> {
        match self.error.into_inner().expect("filter lock") {
            None => Ok(listed),
            Some(why) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, why)),
        }
    }
}

/// The page of `items` (in token order) that `options` asks for, and the next page's token.
pub fn page<T>(items: impl Iterator<Item = (String, T)>, options: &QueryOptions) -> (Vec<T>, Option<String>) {
    page_by(items, options, |token, start| token < start)
}

/// [`page`] of items listed across namespaces, in (namespace, ID) order, whose tokens are
/// `namespace.ID`: tokens compare as that pair, not as strings, or a namespace that prefixes
/// another (`a` and `a-b`: `"a.z" > "a-b.c"` as strings) would hand a client the same page
/// again. Namespace names hold no `.` (Nomad's `^[a-zA-Z0-9-]{1,128}$`).
pub fn namespaced_page<T>(
    items: impl Iterator<Item = (String, T)>,
    options: &QueryOptions,
) -> (Vec<T>, Option<String>) {
    page_by(items, options, |token, start| {
        namespace_and_id(token) < namespace_and_id(start)
    })
}

fn namespace_and_id(token: &str) -> (&str, &str) {
    token.split_once('.').unwrap_or((token, ""))
}

fn page_by<T>(
    items: impl Iterator<Item = (String, T)>,
    options: &QueryOptions,
    before: impl Fn(&str, &str) -> bool,
) -> (Vec<T>, Option<String>) {
    let per_page = options
        .per_page
        .as_deref()
        .and_then(|text| text.parse::<u32>().ok())
        .filter(|n| *n > 0)
        .map(|n| n as usize);
    let start = options.next_token.as_deref().unwrap_or("");
    let mut items = items.skip_while(|(token, _)| before(token, start)).peekable();
    let mut page = Vec::new();
    while per_page.is_none_or(|limit| page.len() < limit) {
        match items.next() {
            Some((_, item)) => page.push(item),
            None => break,
        }
    }
    let next = items.peek().map(|(token, _)| token.clone());
    (page, next)
}

/// Adds `X-Nomad-NextToken` when there is a next page.
pub fn next_token_header(headers: &mut HeaderMap, next: Option<String>) {
    if let Some(value) = next.and_then(|next| HeaderValue::try_from(next).ok()) {
        headers.insert("X-Nomad-NextToken", value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(per_page: Option<&str>, next_token: Option<&str>) -> QueryOptions {
        QueryOptions {
            per_page: per_page.map(String::from),
            next_token: next_token.map(String::from),
            ..QueryOptions::default()
        }
    }

    fn items() -> impl Iterator<Item = (String, u32)> {
        (1..=5).map(|n| (format!("id-{n}"), n))
    }

    #[test]
    fn pages_walk_the_list_in_token_order() {
        assert_eq!(
            page(items(), &options(Some("2"), None)),
            (vec![1, 2], Some("id-3".into()))
        );
        assert_eq!(
            page(items(), &options(Some("2"), Some("id-3"))),
            (vec![3, 4], Some("id-5".into()))
        );
        assert_eq!(page(items(), &options(Some("2"), Some("id-5"))), (vec![5], None));
        // A token between items starts at the next one; none or a bad per_page lists all.
        assert_eq!(page(items(), &options(None, Some("id-35"))), (vec![4, 5], None));
        assert_eq!(page(items(), &options(Some("x"), None)).0.len(), 5);
    }

    #[test]
    fn pages_across_namespaces_follow_the_namespace_id_order() {
        // (namespace, ID) order, as the tables list them: `a` before `a-b`.
        let listed = || {
            [("a", "z"), ("a-b", "c"), ("b", "a")]
                .into_iter()
                .map(|(namespace, id)| (format!("{namespace}.{id}"), id))
        };
        let (first, next) = namespaced_page(listed(), &options(Some("1"), None));
        assert_eq!((first, next.as_deref()), (vec!["z"], Some("a-b.c")));
        let (second, next) = namespaced_page(listed(), &options(Some("1"), next.as_deref()));
        assert_eq!((second, next.as_deref()), (vec!["c"], Some("b.a")));
        // As strings, "a.z" > "a-b.c": the plain comparison hands the first page out again.
        assert_eq!(page(listed(), &options(Some("1"), Some("a-b.c"))).0, vec!["z"]);
    }
}
