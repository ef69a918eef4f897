//! Boolean expressions over JSON-shaped data in the syntax of HashiCorp's go-bexpr: what
//! Nomad's ACL binding rule selectors (and its list endpoints' `filter`) are written in.
//!
//! ```text
//! "admins" in list.groups and value.email matches ".*@example\\.com"
//! not (value.team == "ops" or list.roles is empty)
//! ```
//!
//! Matching operators: `==`, `!=`, `in`, `not in`, `contains`, `not contains`, `matches`,
//! `not matches`, `is empty`, `is not empty`; combined with `and`, `or`, `not` and parentheses.
//! A selector is a dotted path (`a.b.c`, or `a["key with spaces"]`). As go-bexpr, selecting
//! something that is not there is an error, and an error makes the whole expression false
//! where a caller only asks whether it matched ([`Expr::matches`]).

#[allow(unused_imports)]
use crate::prelude::*;

use alloc::boxed::Box;
use serde_json::Value;

/// The most nested parentheses and `not`s an expression may have (a bound on recursion).
const DEPTH_MAX: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Match {
        selector: Vec<String>,
        op: Op,
        value: String,
        /// `value` compiled, for `matches`/`not matches`: once per expression, not once per
        /// item the expression is evaluated on (a list filter over thousands of items).
        pattern: Option<Pattern>,
    },
}

/// A compiled regular expression; equal when its source text is.
#[derive(Clone, Debug)]
pub struct Pattern(regex_automata::meta::Regex);

impl PartialEq for Pattern {
    fn eq(&self, _: &Self) -> bool {
        // Compiled from the `value` beside it, which the derived comparison compares.
        true
    }
}

impl Eq for Pattern {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Equal,
    NotEqual,
    /// `value in selector` / `selector contains value`.
    Contains,
    NotContains,
    Matches,
    NotMatches,
    IsEmpty,
    IsNotEmpty,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Word(String),
    Quoted(String),
    Equal,
    NotEqual,
    Open,
    Close,
    OpenBracket,
    CloseBracket,
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
            }
            '(' | ')' | '[' | ']' => {
                chars.next();
                out.push(match c {
                    '(' => Token::Open,
                    ')' => Token::Close,
                    '[' => Token::OpenBracket,
                    _ => Token::CloseBracket,
                });
            }
            '=' | '!' => {
                chars.next();
                if chars.next() != Some('=') {
                    return Err(format!("expected '=' after '{c}'"));
                }
                out.push(if c == '=' { Token::Equal } else { Token::NotEqual });
            }
            '"' => {
                chars.next();
                let mut value = String::new();
                loop {
                    match chars.next() {
                        None => return Err("unterminated string".into()),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('n') => value.push('\n'),
                            Some('t') => value.push('\t'),
                            Some(other) => value.push(other),
                            None => return Err("unterminated string".into()),
                        },
                        Some(other) => value.push(other),
                    }
                }
                out.push(Token::Quoted(value));
            }
            '`' => {
                chars.next();
                let mut value = String::new();
                loop {
                    match chars.next() {
                        None => return Err("unterminated string".into()),
                        Some('`') => break,
                        Some(other) => value.push(other),
                    }
                }
                out.push(Token::Quoted(value));
            }
            _ => {
                let mut word = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() || "()[]=!\"`".contains(c) {
                        break;
                    }
                    word.push(c);
                    chars.next();
                }
                out.push(Token::Word(word));
            }
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn peek_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w == word)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn expect_word(&mut self, word: &str) -> Result<(), String> {
        match self.next() {
            Some(Token::Word(w)) if w == word => Ok(()),
            other => Err(format!("expected '{word}', found {}", shown(other.as_ref()))),
        }
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while self.peek_word("or") {
            self.next();
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.unary()?;
        while self.peek_word("and") {
            self.next();
            left = Expr::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, String> {
        self.depth += 1;
        if self.depth > DEPTH_MAX {
            return Err(format!("expression nested deeper than {DEPTH_MAX}"));
        }
        let expr = if self.peek_word("not") {
            self.next();
            Expr::Not(Box::new(self.unary()?))
        } else if self.peek() == Some(&Token::Open) {
            self.next();
            let inner = self.or()?;
            match self.next() {
                Some(Token::Close) => inner,
                other => return Err(format!("expected ')', found {}", shown(other.as_ref()))),
            }
        } else {
            self.matcher()?
        };
        self.depth -= 1;
        Ok(expr)
    }

    /// `value [not] in selector`, or `selector <op> ...`.
    fn matcher(&mut self) -> Result<Expr, String> {
        let quoted_first = matches!(self.peek(), Some(Token::Quoted(_)));
        let in_next = |parser: &Parser, from: usize| match (parser.tokens.get(from), parser.tokens.get(from + 1)) {
            (Some(Token::Word(w)), _) if w == "in" => Some(false),
            (Some(Token::Word(n)), Some(Token::Word(w))) if n == "not" && w == "in" => Some(true),
            _ => None,
        };
        if quoted_first || in_next(self, self.at + 1).is_some() {
            let value = self.value()?;
            let negated = match in_next(self, self.at) {
                Some(negated) => negated,
                None => return Err(format!("expected 'in' after {value:?}")),
            };
            self.at += if negated { 2 } else { 1 };
            let selector = self.selector()?;
            let op = if negated { Op::NotContains } else { Op::Contains };
            return Ok(Expr::Match {
                selector,
                op,
                value,
                pattern: None,
            });
        }
        let selector = self.selector()?;
        let op = match self.next() {
            Some(Token::Equal) => Op::Equal,
            Some(Token::NotEqual) => Op::NotEqual,
            Some(Token::Word(w)) if w == "contains" => Op::Contains,
            Some(Token::Word(w)) if w == "matches" => Op::Matches,
            Some(Token::Word(w)) if w == "is" => {
                let negated = self.peek_word("not");
                if negated {
                    self.next();
                }
                self.expect_word("empty")?;
                let op = if negated { Op::IsNotEmpty } else { Op::IsEmpty };
                return Ok(Expr::Match {
                    selector,
                    op,
                    value: String::new(),
                    pattern: None,
                });
            }
            Some(Token::Word(w)) if w == "not" => match self.next() {
                Some(Token::Word(w)) if w == "contains" => Op::NotContains,
                Some(Token::Word(w)) if w == "matches" => Op::NotMatches,
                other => {
                    return Err(format!(
                        "expected 'contains' or 'matches' after 'not', found {}",
                        shown(other.as_ref())
                    ));
                }
            },
            other => return Err(format!("expected a match operator, found {}", shown(other.as_ref()))),
        };
        let value = self.value()?;
        let pattern = match op {
            Op::Matches | Op::NotMatches => Some(Pattern(compile(&value)?)),
            _ => None,
        };
        Ok(Expr::Match {
            selector,
            op,
            value,
            pattern,
        })
    }

    fn value(&mut self) -> Result<String, String> {
        match self.next() {
            Some(Token::Quoted(value)) => Ok(value),
            Some(Token::Word(word)) if !is_keyword(&word) => Ok(word),
            other => Err(format!("expected a value, found {}", shown(other.as_ref()))),
        }
    }

    fn selector(&mut self) -> Result<Vec<String>, String> {
        let first = match self.next() {
            Some(Token::Word(word)) if !is_keyword(&word) => word,
            other => return Err(format!("expected a selector, found {}", shown(other.as_ref()))),
        };
        let mut path: Vec<String> = first.split('.').map(String::from).collect();
        if path.iter().any(String::is_empty) {
            return Err(format!("invalid selector {first:?}"));
        }
        while self.peek() == Some(&Token::OpenBracket) {
            self.next();
            match (self.next(), self.next()) {
                (Some(Token::Quoted(key)), Some(Token::CloseBracket)) => path.push(key),
                _ => return Err("expected [\"key\"] in a selector".into()),
            }
        }
        Ok(path)
    }
}

fn is_keyword(word: &str) -> bool {
    matches!(
        word,
        "and" | "or" | "not" | "in" | "contains" | "matches" | "is" | "empty"
    )
}

fn shown(token: Option<&Token>) -> String {
    match token {
        None => "the end".into(),
        Some(Token::Word(word)) => format!("{word:?}"),
        Some(Token::Quoted(value)) => format!("{value:?}"),
        Some(other) => format!("{other:?}"),
    }
}

fn compile(pattern: &str) -> Result<regex_automata::meta::Regex, String> {
    regex_automata::meta::Regex::new(pattern)
        .map_err(|error| format!("invalid regular expression {pattern:?}: {error}"))
}

/// A selected value that is not there, or not of a shape the operator can use.
#[derive(Debug)]
enum NoMatch {
    /// The selector's part at this position names nothing.
    Missing {
        part: usize,
    },
    Shape,
}

impl Expr {
    /// Parses go-bexpr syntax, or says what is wrong and where.
    pub fn parse(text: &str) -> Result<Expr, String> {
        let mut parser = Parser {
            tokens: tokens(text)?,
            at: 0,
            depth: 0,
        };
        let expr = parser.or()?;
        match parser.peek() {
            None => Ok(expr),
            Some(token) => Err(format!("unexpected {} after the expression", shown(Some(token)))),
        }
    }

    /// Whether `data` satisfies the expression; an error anywhere (a missing field) is `false`.
    pub fn matches(&self, data: &Value) -> bool {
        self.eval(data).unwrap_or(false)
    }

    /// Whether `data` satisfies the expression, or why it cannot be evaluated on it: a
    /// selector naming nothing is an error, as go-bexpr's evaluator makes it (the list
    /// endpoints' `filter` answers it rather than leaving the item out).
    pub fn evaluate(&self, data: &Value) -> Result<bool, String> {
        self.eval_reporting(data)
    }

    fn eval_reporting(&self, data: &Value) -> Result<bool, String> {
        match self {
            Expr::And(left, right) => Ok(left.eval_reporting(data)? && right.eval_reporting(data)?),
            Expr::Or(left, right) => Ok(left.eval_reporting(data)? || right.eval_reporting(data)?),
            Expr::Not(inner) => Ok(!inner.eval_reporting(data)?),
            Expr::Match { selector, .. } => self.eval(data).map_err(|error| {
                let path = selector.join("/");
                match error {
                    NoMatch::Missing { part } => format!(
                        "error finding value in datum: /{path} at part {part}: couldn't find key {:?}",
                        selector[part]
                    ),
                    NoMatch::Shape => format!("the value at /{path} cannot be compared that way"),
                }
            }),
        }
    }

    fn eval(&self, data: &Value) -> Result<bool, NoMatch> {
        match self {
            Expr::And(left, right) => Ok(left.eval(data)? && right.eval(data)?),
            Expr::Or(left, right) => Ok(left.eval(data)? || right.eval(data)?),
            Expr::Not(inner) => Ok(!inner.eval(data)?),
            Expr::Match {
                selector,
                op,
                value,
                pattern,
            } => {
                let selected = selector.iter().enumerate().try_fold(data, |at, (part, key)| {
                    at.get(key.as_str()).ok_or(NoMatch::Missing { part })
                })?;
                apply(selected, *op, value, pattern.as_ref())
            }
        }
    }
}

/// A scalar as go-bexpr compares it: its text.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Bool(flag) => Some(flag.to_string()),
        Value::Number(number) => Some(number.to_string()),
        _ => None,
    }
}

fn apply(selected: &Value, op: Op, value: &str, pattern: Option<&Pattern>) -> Result<bool, NoMatch> {
    match op {
        Op::Equal => scalar(selected).map(|text| text == value).ok_or(NoMatch::Shape),
        Op::NotEqual => scalar(selected).map(|text| text != value).ok_or(NoMatch::Shape),
        Op::Contains | Op::NotContains => {
            let found = match selected {
                Value::Array(items) => items.iter().any(|item| scalar(item).as_deref() == Some(value)),
                Value::Object(map) => map.contains_key(value),
                Value::String(text) => text.contains(value),
                _ => return Err(NoMatch::Shape),
            };
            Ok(found == (op == Op::Contains))
        }
        Op::Matches | Op::NotMatches => {
            let Value::String(text) = selected else {
                return Err(NoMatch::Shape);
            };
            let found = pattern.ok_or(NoMatch::Shape)?.0.is_match(text.as_str());
            Ok(found == (op == Op::Matches))
        }
        Op::IsEmpty | Op::IsNotEmpty => {
            let empty = match selected {
                Value::Array(items) => items.is_empty(),
                Value::Object(map) => map.is_empty(),
                Value::String(text) => text.is_empty(),
                Value::Null => true,
                _ => return Err(NoMatch::Shape),
            };
            Ok(empty == (op == Op::IsEmpty))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(expr: &str, data: &Value) -> bool {
        Expr::parse(expr)
            .unwrap_or_else(|error| panic!("{expr}: {error}"))
            .matches(data)
    }

    /// A `matches` pattern is compiled when the expression is parsed, once: a list filter
    /// evaluated on thousands of items compiled it once per item (issue 54 §9: one request
    /// cost 53 s of CPU over 7,564 jobs).
    #[test]
    fn a_pattern_is_compiled_once_when_parsed() {
        let expr = Expr::parse(r#"not (Name matches "^web-[0-9]+$")"#).unwrap();
        let Expr::Not(inner) = &expr else { panic!("{expr:?}") };
        assert!(matches!(**inner, Expr::Match { pattern: Some(_), .. }), "{inner:?}");
        for (name, want) in [("web-12", false), ("web-x", true), ("api-1", true)] {
            assert_eq!(expr.matches(&json!({ "Name": name })), want, "{name}");
        }
    }

    #[test]
    fn selectors_match_as_go_bexpr_does() {
        let data = json!({
            "value": {"name": "alice", "email": "alice@example.com", "admin": true, "uid": 1000},
            "list": {"groups": ["eng", "ops"], "none": []}
        });
        for (expr, want) in [
            (r#"value.name == "alice""#, true),
            (r#"value.name != "alice""#, false),
            (r#"value.admin == true"#, true),
            (r#"value.uid == 1000"#, true),
            (r#""ops" in list.groups"#, true),
            (r#""sales" not in list.groups"#, true),
            (r#"list.groups contains "eng""#, true),
            (r#"list.groups not contains "eng""#, false),
            (r#"value.email matches ".*@example\\.com""#, true),
            (r#"value.email not matches "^bob""#, true),
            (r#"list.none is empty and list.groups is not empty"#, true),
            (r#"value["name"] == `alice`"#, true),
            (r#"not (value.name == "bob" or "sales" in list.groups)"#, true),
            (
                r#"value.name == "bob" or value.name == "alice" and "ops" in list.groups"#,
                true,
            ),
            // A missing field is an error, which no `not` can turn into a match.
            (r#"value.missing == "x""#, false),
            (r#"not (value.missing == "x")"#, false),
            (r#"value.missing != "x""#, false),
            (r#""x" in value.missing or value.name == "alice""#, false),
        ] {
            assert_eq!(check(expr, &data), want, "{expr}");
        }
    }

    #[test]
    fn bad_expressions_are_refused_with_the_reason() {
        for (expr, error) in [
            (r#"value.name ="#, "expected '=' after '='"),
            (r#"value.name == "x"#, "unterminated string"),
            (r#"value.name"#, "expected a match operator, found the end"),
            (r#"(value.a == "b""#, "expected ')', found the end"),
            (r#"value.a == "b" value"#, "unexpected \"value\" after the expression"),
            (r#"value.a matches "(""#, "invalid regular expression"),
            (r#"value.a is full"#, "expected 'empty', found \"full\""),
        ] {
            let got = Expr::parse(expr).unwrap_err();
            assert!(got.starts_with(error), "{expr}: {got}");
        }
        let deep = format!("{}a == \"b\"{}", "(".repeat(100), ")".repeat(100));
        assert!(Expr::parse(&deep).unwrap_err().contains("nested deeper"));
    }

    #[test]
    fn evaluate_names_a_selector_that_finds_nothing() {
        let data = json!({"Status": "running", "Meta": {"team": "ops"}});
        let expr = |text: &str| Expr::parse(text).unwrap();
        assert_eq!(expr(r#"Status == "running""#).evaluate(&data), Ok(true));
        assert_eq!(expr(r#"Meta.team != "ops""#).evaluate(&data), Ok(false));
        assert_eq!(
            expr(r#"InvalidField == "value""#).evaluate(&data),
            Err("error finding value in datum: /InvalidField at part 0: couldn't find key \"InvalidField\"".into())
        );
        assert_eq!(
            expr(r#"Status == "dead" or Meta.owner == "x""#).evaluate(&data),
            Err("error finding value in datum: /Meta/owner at part 1: couldn't find key \"owner\"".into())
        );
        // `matches` keeps reading an error as no match.
        assert!(!expr(r#"InvalidField == "value""#).matches(&data));
    }
}
