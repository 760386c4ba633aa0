//! `-o jsonpath=<template>`: kubectl's JSONPath templates, the subset scripts use.
//!
//! A template is literal text with actions in braces: a path (`{.metadata.name}`,
//! `{.items[*].status.state}`, `{.spec.args[0]}`, `{.items[-1:]}`, `{.spec.args[0:4:2]}`,
//! `{.metadata.labels['app.kubernetes.io/name']}`, recursive descent `{..name}`,
//! unions `{.spec.args[0,2]}` and `{.metadata['name','namespace']}`,
//! `{.status.conditions[?(@.type=="Admitted")].reason}`), a quoted string with the
//! escapes `\n`, `\t`, `\\` and `\"` (`{"\n"}`), and `{range <path>}...{end}`,
//! whose body is read once per item with paths relative to the item. As in kubectl,
//! a path that finds nothing prints nothing, several results are separated by a
//! space, strings print bare, other values as compact JSON, and nothing is added at
//! the end (end a template with `{"\n"}` for a newline). `..` finds the value and
//! every object and array inside it, depth first, before the step after it; a
//! union gives all the results of its first member, then all of its second.
//!
//! Two choices differ from kubectl for the sake of label keys: a quoted key is one
//! key even with dots in it (kubectl reads `['a.b']` as `.a.b`; `\.` is accepted in
//! both places), and an index past the end finds nothing instead of failing.
//!
//! The JSONPath crates implement RFC 9535 expressions, not kubectl's templates (text,
//! braces, `range`/`end`), and the paths scripts use are few, so the parser is here.

use std::fmt;

use serde_json::Value;

/// A template that does not parse: what is wrong, where, and in which action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError {
    /// 1-based character position in the template.
    pub position: usize,
    pub message: String,
    /// The action (`{...}`) the error is in, as written, up to its `}` if it has one.
    pub expression: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "jsonpath template: {} at position {}, in {}",
            self.message, self.position, self.expression
        )
    }
}

impl std::error::Error for TemplateError {}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Text(String),
    Path(Path),
    Range(Path, Vec<Node>),
}

/// Where a path starts: the document (`$`) or the current item (`@`, or a leading `.`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    Root,
    Current,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Path {
    start: Start,
    steps: Vec<Step>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// `.name` or `['name']`.
    Field(String),
    /// `.*` or `[*]`: every member or element.
    All,
    /// `[N]`, negative from the end.
    Index(i64),
    /// `[start:end]` or `[start:end:step]`, bounds optional and negative from the
    /// end, the step positive.
    Slice(Option<i64>, Option<i64>, usize),
    /// `..`: the value and every object and array inside it, depth first.
    Descendants,
    /// `[a,b]`: every result of each member in turn (fields, indexes or slices).
    Union(Vec<Step>),
    /// `[?(@.path)]` or `[?(@.path <op> literal)]`.
    Filter(Box<Path>, Option<(Comparison, Value)>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Comparison {
    Equal,
    NotEqual,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

impl Template {
    /// Parses `source` (the part after `jsonpath=`).
    pub fn parse(source: &str) -> Result<Self, TemplateError> {
        let chars: Vec<char> = source.chars().collect();
        let mut parser = Parser {
            chars,
            at: 0,
            action: 0,
        };
        let nodes = parser.nodes(None)?;
        Ok(Template {
            source: source.to_owned(),
            nodes,
        })
    }

    /// The template as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The template filled in from `document`.
    pub fn render(&self, document: &Value) -> String {
        let mut out = String::new();
        render_nodes(&self.nodes, document, document, &mut out);
        out
    }
}

fn render_nodes(nodes: &[Node], root: &Value, current: &Value, out: &mut String) {
    for node in nodes {
        match node {
            Node::Text(text) => out.push_str(text),
            Node::Path(path) => {
                let found = path.find(root, current);
                let shown: Vec<String> = found.into_iter().map(shown).collect();
                out.push_str(&shown.join(" "));
            }
            Node::Range(path, body) => {
                for found in path.find(root, current) {
                    match found {
                        Value::Array(items) => {
                            for item in items {
                                render_nodes(body, root, item, out);
                            }
                        }
                        item => render_nodes(body, root, item, out),
                    }
                }
            }
        }
    }
}

/// A value as kubectl prints it: strings bare, null as nothing, the rest as JSON.
fn shown(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl Path {
    fn find<'a>(&self, root: &'a Value, current: &'a Value) -> Vec<&'a Value> {
        let mut found = vec![match self.start {
            Start::Root => root,
            Start::Current => current,
        }];
        for step in &self.steps {
            found = match step {
                // As in kubectl, each member reads all the values found so far.
                Step::Union(members) => members
                    .iter()
                    .flat_map(|member| found.iter().flat_map(|value| member.apply(root, value)))
                    .collect(),
                step => found
                    .into_iter()
                    .flat_map(|value| step.apply(root, value))
                    .collect(),
            };
        }
        found
    }
}

/// `index` of a sequence of `len`, counting back from the end when negative.
fn resolve(index: i64, len: usize) -> Option<usize> {
    let len = i64::try_from(len).ok()?;
    let at = if index < 0 { len + index } else { index };
    usize::try_from(at).ok()
}

impl Step {
    fn apply<'a>(&self, root: &'a Value, value: &'a Value) -> Vec<&'a Value> {
        match (self, value) {
            (Step::Field(name), Value::Object(map)) => map.get(name).into_iter().collect(),
            (Step::All, Value::Object(map)) => map.values().collect(),
            (Step::All, Value::Array(items)) => items.iter().collect(),
            (Step::Index(index), Value::Array(items)) => resolve(*index, items.len())
                .and_then(|at| items.get(at))
                .into_iter()
                .collect(),
            (Step::Slice(start, end, step), Value::Array(items)) => {
                let len = items.len();
                let clamp = |bound: i64| resolve(bound, len).unwrap_or(0).min(len);
                let from = start.map_or(0, clamp);
                let to = end.map_or(len, clamp);
                items
                    .get(from..to.max(from))
                    .unwrap_or_default()
                    .iter()
                    .step_by(*step)
                    .collect()
            }
            (Step::Descendants, value) => {
                let mut found = Vec::new();
                collect_containers(value, &mut found);
                found
            }
            (Step::Filter(path, test), Value::Array(items)) => items
                .iter()
                .filter(|item| {
                    let found = path.find(root, item);
                    match test {
                        None => !found.is_empty(),
                        Some((comparison, literal)) => {
                            found.iter().any(|value| comparison.holds(value, literal))
                        }
                    }
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// `value` and every object and array inside it, each before what it holds.
fn collect_containers<'a>(value: &'a Value, found: &mut Vec<&'a Value>) {
    let children: Box<dyn Iterator<Item = &'a Value>> = match value {
        Value::Object(map) => Box::new(map.values()),
        Value::Array(items) => Box::new(items.iter()),
        _ => return,
    };
    found.push(value);
    for child in children {
        collect_containers(child, found);
    }
}

impl Comparison {
    fn holds(self, value: &Value, literal: &Value) -> bool {
        let ordering = match (value, literal) {
            (Value::Number(a), Value::Number(b)) => a
                .as_f64()
                .zip(b.as_f64())
                .and_then(|(a, b)| a.partial_cmp(&b)),
            (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
            (a, b) => (a == b).then_some(std::cmp::Ordering::Equal),
        };
        match self {
            Comparison::Equal => ordering == Some(std::cmp::Ordering::Equal),
            Comparison::NotEqual => ordering != Some(std::cmp::Ordering::Equal),
            Comparison::Less => ordering == Some(std::cmp::Ordering::Less),
            Comparison::LessOrEqual => ordering.is_some_and(|o| o.is_le()),
            Comparison::Greater => ordering == Some(std::cmp::Ordering::Greater),
            Comparison::GreaterOrEqual => ordering.is_some_and(|o| o.is_ge()),
        }
    }
}

struct Parser {
    chars: Vec<char>,
    /// Index of the next character.
    at: usize,
    /// Index of the `{` opening the action being read.
    action: usize,
}

impl Parser {
    fn error(&self, at: usize, message: impl Into<String>) -> TemplateError {
        let from = self.action.min(at);
        let to = self
            .chars
            .iter()
            .enumerate()
            .skip(at.max(from))
            .find(|(_, c)| **c == '}')
            .map_or(self.chars.len(), |(close, _)| close + 1);
        TemplateError {
            position: at + 1,
            message: message.into(),
            expression: self
                .chars
                .get(from..to)
                .unwrap_or_default()
                .iter()
                .collect(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    fn starts_with(&self, word: &str) -> bool {
        (self.at..)
            .zip(word.chars())
            .all(|(at, c)| self.chars.get(at) == Some(&c))
    }

    /// Text and actions up to the end, or up to the `{end}` of a range opened at
    /// `range` (consumed).
    fn nodes(&mut self, range: Option<usize>) -> Result<Vec<Node>, TemplateError> {
        let mut nodes = Vec::new();
        let mut text = String::new();
        while let Some(c) = self.peek() {
            if c != '{' {
                text.push(c);
                self.at += 1;
                continue;
            }
            if !text.is_empty() {
                nodes.push(Node::Text(std::mem::take(&mut text)));
            }
            let open = self.at;
            self.action = open;
            self.at += 1;
            self.skip_spaces();
            if self.starts_with("end") && self.closes_after(3) {
                self.at += 3;
                self.close(open)?;
                return match range {
                    Some(_) => Ok(nodes),
                    None => Err(self.error(open, "{end} without a {range ...} before it")),
                };
            }
            if self.starts_with("range")
                && self
                    .chars
                    .get(self.at + 5)
                    .is_some_and(|c| c.is_whitespace())
            {
                self.at += 5;
                self.skip_spaces();
                let path = self.path()?;
                self.close(open)?;
                let body = self.nodes(Some(open))?;
                nodes.push(Node::Range(path, body));
                continue;
            }
            if self.peek() == Some('"') {
                let literal = self.string()?;
                self.close(open)?;
                nodes.push(Node::Text(literal));
                continue;
            }
            if self.peek() == Some('}') {
                return Err(self.error(open, "empty {}: put a path in it, e.g. {.metadata.name}"));
            }
            let path = self.path()?;
            self.close(open)?;
            nodes.push(Node::Path(path));
        }
        if !text.is_empty() {
            nodes.push(Node::Text(text));
        }
        match range {
            Some(open) => {
                self.action = open;
                Err(self.error(open, "{range ...} without its {end}"))
            }
            None => Ok(nodes),
        }
    }

    /// Whether only spaces and then `}` follow the `len` characters at the cursor.
    fn closes_after(&self, len: usize) -> bool {
        let mut at = self.at + len;
        while self.chars.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
        }
        self.chars.get(at) == Some(&'}')
    }

    /// Expects the `}` closing the action opened at `open`.
    fn close(&mut self, open: usize) -> Result<(), TemplateError> {
        self.skip_spaces();
        match self.peek() {
            Some('}') => {
                self.at += 1;
                Ok(())
            }
            Some(c) => Err(self.error(self.at, format!("unexpected {c:?}, expected }}"))),
            None => Err(self.error(open, "{ is never closed")),
        }
    }

    /// A quoted string at the cursor, escapes resolved.
    fn string(&mut self) -> Result<String, TemplateError> {
        let quote_at = self.at;
        let Some(quote) = self.peek().filter(|c| *c == '"' || *c == '\'') else {
            return Err(self.error(self.at, "expected a quoted string"));
        };
        self.at += 1;
        let mut text = String::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(self.error(quote_at, "string is never closed"));
            };
            self.at += 1;
            if c == quote {
                return Ok(text);
            }
            if c != '\\' {
                text.push(c);
                continue;
            }
            let escape_at = self.at - 1;
            let Some(escaped) = self.peek() else {
                return Err(self.error(quote_at, "string is never closed"));
            };
            self.at += 1;
            text.push(match escaped {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                // `\.` as in kubectl's `['app\.kubernetes\.io/name']`.
                '\\' | '"' | '\'' | '.' => escaped,
                other => {
                    return Err(self.error(
                        escape_at,
                        format!("unknown escape \\{other}: use \\n, \\t, \\r, \\\\, \\\" or \\."),
                    ));
                }
            });
        }
    }

    /// A path at the cursor: `$`, `@` or nothing, then steps.
    fn path(&mut self) -> Result<Path, TemplateError> {
        let begin = self.at;
        let start = if self.eat('$') {
            Start::Root
        } else {
            self.eat('@');
            Start::Current
        };
        let mut steps = Vec::new();
        loop {
            match self.peek() {
                Some('.') => {
                    self.at += 1;
                    if self.eat('.') {
                        steps.push(Step::Descendants);
                        if self.peek() == Some('[') {
                            continue;
                        }
                        if self.eat('*') {
                            steps.push(Step::All);
                            continue;
                        }
                        let name = self.field_name()?;
                        if name.is_empty() {
                            return Err(self.error(
                                self.at,
                                "expected a field name, * or [...] after .., e.g. {..name}",
                            ));
                        }
                        steps.push(Step::Field(name));
                        continue;
                    }
                    if self.eat('*') {
                        steps.push(Step::All);
                        continue;
                    }
                    let name = self.field_name()?;
                    if name.is_empty() {
                        // `{.}`: the current item itself.
                        if steps.is_empty() && self.at == begin + 1 {
                            continue;
                        }
                        return Err(self.error(self.at, "expected a field name after ."));
                    }
                    steps.push(Step::Field(name));
                }
                Some('[') => steps.push(self.bracket()?),
                _ => break,
            }
        }
        if steps.is_empty() && self.at == begin {
            let found = self
                .peek()
                .map_or_else(|| "the end".to_owned(), |c| format!("{c:?}"));
            return Err(self.error(
                self.at,
                format!("expected a path such as .metadata.name, found {found}"),
            ));
        }
        Ok(Path { start, steps })
    }

    /// Characters of a field name: anything but the path's own punctuation, which a
    /// backslash makes part of the name (`.app\.kubernetes\.io/name`).
    fn field_name(&mut self) -> Result<String, TemplateError> {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if matches!(
                c,
                '.' | ',' | '[' | ']' | '{' | '}' | '(' | ')' | '=' | '!' | '<' | '>'
            ) || c.is_whitespace()
            {
                break;
            }
            self.at += 1;
            if c == '\\' {
                let Some(escaped) = self.peek() else {
                    return Err(self.error(self.at - 1, "\\ at the end of a field name"));
                };
                name.push(escaped);
                self.at += 1;
                continue;
            }
            name.push(c);
        }
        Ok(name)
    }

    /// `[...]` at the cursor.
    fn bracket(&mut self) -> Result<Step, TemplateError> {
        let open = self.at;
        self.at += 1;
        self.skip_spaces();
        let step = match self.peek() {
            Some('*') => {
                self.at += 1;
                Step::All
            }
            Some('?') => {
                self.at += 1;
                self.filter()?
            }
            _ => {
                let mut members = vec![self.union_member()?];
                self.skip_spaces();
                while self.eat(',') {
                    self.skip_spaces();
                    members.push(self.union_member()?);
                    self.skip_spaces();
                }
                match <[Step; 1]>::try_from(members) {
                    Ok([step]) => step,
                    Err(members) => Step::Union(members),
                }
            }
        };
        self.skip_spaces();
        if !self.eat(']') {
            return Err(match self.peek() {
                Some(c) => self.error(self.at, format!("unexpected {c:?}, expected ]")),
                None => self.error(open, "[ is never closed"),
            });
        }
        Ok(step)
    }

    /// A quoted key, an index or a slice: what `[ ]` holds alone or between commas.
    fn union_member(&mut self) -> Result<Step, TemplateError> {
        if matches!(self.peek(), Some('"' | '\'')) {
            return self.string().map(Step::Field);
        }
        let begin = self.at;
        let start = self.integer()?;
        self.skip_spaces();
        if !self.eat(':') {
            return start.map(Step::Index).ok_or_else(|| {
                self.error(
                    begin,
                    "expected *, an index, a slice, a quoted key or ?(...) in [ ]",
                )
            });
        }
        self.skip_spaces();
        let end = self.integer()?;
        self.skip_spaces();
        let mut step = 1;
        if self.eat(':') {
            self.skip_spaces();
            let step_at = self.at;
            if let Some(given) = self.integer()? {
                step = usize::try_from(given)
                    .ok()
                    .filter(|step| *step > 0)
                    .ok_or_else(|| {
                        self.error(step_at, format!("slice step {given} must be 1 or more"))
                    })?;
            }
        }
        Ok(Step::Slice(start, end, step))
    }

    /// An optional integer at the cursor.
    fn integer(&mut self) -> Result<Option<i64>, TemplateError> {
        let begin = self.at;
        let mut digits = String::new();
        if self.eat('-') {
            digits.push('-');
        }
        while let Some(c) = self.peek().filter(char::is_ascii_digit) {
            digits.push(c);
            self.at += 1;
        }
        match digits.as_str() {
            "" => Ok(None),
            "-" => Err(self.error(begin, "expected digits after -")),
            _ => digits
                .parse()
                .map(Some)
                .map_err(|_| self.error(begin, format!("{digits} is not an index"))),
        }
    }

    /// `(@.path)` or `(@.path <op> literal)` after `?`.
    fn filter(&mut self) -> Result<Step, TemplateError> {
        if !self.eat('(') {
            return Err(self.error(self.at, "expected ( after ?"));
        }
        self.skip_spaces();
        if self.peek() != Some('@') {
            return Err(self.error(self.at, "a filter tests the item: start it with @"));
        }
        let path = self.path()?;
        self.skip_spaces();
        let comparison = [
            ("==", Comparison::Equal),
            ("!=", Comparison::NotEqual),
            ("<=", Comparison::LessOrEqual),
            (">=", Comparison::GreaterOrEqual),
            ("<", Comparison::Less),
            (">", Comparison::Greater),
        ]
        .into_iter()
        .find(|(op, _)| self.starts_with(op));
        let test = match comparison {
            Some((op, comparison)) => {
                self.at += op.len();
                self.skip_spaces();
                Some((comparison, self.literal()?))
            }
            None => None,
        };
        self.skip_spaces();
        if !self.eat(')') {
            return Err(self.error(self.at, "expected ) closing the filter"));
        }
        Ok(Step::Filter(Box::new(path), test))
    }

    /// A quoted string, a number, true, false or null.
    fn literal(&mut self) -> Result<Value, TemplateError> {
        if matches!(self.peek(), Some('"' | '\'')) {
            return self.string().map(Value::String);
        }
        let begin = self.at;
        let mut word = String::new();
        while let Some(c) = self
            .peek()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '+'))
        {
            word.push(c);
            self.at += 1;
        }
        serde_json::from_str::<Value>(&word)
            .ok()
            .filter(|v| !v.is_object() && !v.is_array())
            .ok_or_else(|| {
                self.error(
                    begin,
                    "expected a quoted string, a number, true, false or null to compare with",
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn render(template: &str, document: &Value) -> String {
        Template::parse(template)
            .unwrap_or_else(|e| panic!("{template}: {e}"))
            .render(document)
    }

    fn error(template: &str) -> String {
        Template::parse(template).expect_err("refused").to_string()
    }

    fn job(name: &str, state: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"app.kubernetes.io/name": "bert"}},
               "spec": {"numWorkers": 2, "args": ["--a", "--b", "--c"]},
               "status": {"state": state, "conditions": [
                   {"type": "Admitted", "status": "True", "reason": "Admitted"},
                   {"type": "Running", "status": "False", "reason": "Queued"}]}})
    }

    fn list() -> Value {
        json!({"kind": "List", "items": [job("bert", "Running"), job("gpt", "Queued")]})
    }

    #[test]
    fn fields_nested_fields_and_literal_text() {
        let bert = job("bert", "Running");
        assert_eq!(render("{.metadata.name}", &bert), "bert");
        assert_eq!(render("name={.metadata.name} ", &bert), "name=bert ");
        assert_eq!(render("{.spec.numWorkers}", &bert), "2");
        assert_eq!(render("{.status.state}{\"\\n\"}", &bert), "Running\n");
        assert_eq!(
            render("{.metadata.name}{\"\\t\"}{.status.state}", &bert),
            "bert\tRunning"
        );
        assert_eq!(render("{$.metadata.name}", &bert), "bert");
        assert_eq!(render("{ .metadata.name }", &bert), "bert");
        assert_eq!(
            render("{.metadata.labels['app.kubernetes.io/name']}", &bert),
            "bert"
        );
        assert_eq!(
            render("{.metadata.labels}", &bert),
            r#"{"app.kubernetes.io/name":"bert"}"#
        );
        assert_eq!(
            render("{.missing.field}", &bert),
            "",
            "missing prints nothing"
        );
    }

    #[test]
    fn indexes_slices_wildcards_and_filters() {
        let bert = job("bert", "Running");
        assert_eq!(render("{.spec.args[0]}", &bert), "--a");
        assert_eq!(render("{.spec.args[-1]}", &bert), "--c");
        assert_eq!(render("{.spec.args[1:]}", &bert), "--b --c");
        assert_eq!(render("{.spec.args[:2]}", &bert), "--a --b");
        assert_eq!(render("{.spec.args[7]}", &bert), "");
        assert_eq!(render("{.spec.args[*]}", &bert), "--a --b --c");
        assert_eq!(
            render("{.status.conditions[*].type}", &bert),
            "Admitted Running"
        );
        assert_eq!(
            render(
                r#"{.status.conditions[?(@.type=="Running")].reason}"#,
                &bert
            ),
            "Queued"
        );
        assert_eq!(
            render("{.status.conditions[?(@.status != 'True')].type}", &bert),
            "Running"
        );
        assert_eq!(
            render("{.status.conditions[?(@.reason)].type}", &bert),
            "Admitted Running"
        );
        assert_eq!(render("{.items[*].metadata.name}", &list()), "bert gpt");
        assert_eq!(
            render("{.items[?(@.spec.numWorkers>=2)].metadata.name}", &list()),
            "bert gpt"
        );
    }

    #[test]
    fn range_reads_its_body_once_per_item() {
        assert_eq!(
            render(
                r#"{range .items[*]}{.metadata.name}{"\t"}{.status.state}{"\n"}{end}"#,
                &list()
            ),
            "bert\tRunning\ngpt\tQueued\n"
        );
        // Over the array itself, with the document still reachable from $.
        assert_eq!(
            render("{range .items}[{.metadata.name} of {$.kind}]{end}", &list()),
            "[bert of List][gpt of List]"
        );
        assert_eq!(
            render(
                "{range .items[*]}{.metadata.name}:{range .spec.args[*]} {@}{end};{end}",
                &list()
            ),
            "bert: --a --b --c;gpt: --a --b --c;"
        );
        assert_eq!(render("{range .nothing[*]}x{end}done", &list()), "done");
        // A field named like a keyword is still a field.
        assert_eq!(render("{.end}", &json!({"end": 1})), "1");
    }

    #[test]
    fn recursive_descent_finds_the_field_at_every_depth() {
        let document = json!({
            "kind": "List",
            "items": [
                {"metadata": {"name": "bert"}, "status": {"addresses": [{"name": "a0"}]}},
                {"metadata": {"name": "gpt"}}
            ],
            "users": [{"name": "myself", "user": {}}, {"name": "e2e"}]
        });
        assert_eq!(
            render("{..name}", &document),
            "bert a0 gpt myself e2e",
            "depth first, each object before what it holds"
        );
        assert_eq!(render("{.users..name}", &document), "myself e2e");
        assert_eq!(render("{$..metadata.name}", &document), "bert gpt");
        assert_eq!(render("{..['name']}", &document), "bert a0 gpt myself e2e");
        assert_eq!(render("{..addresses[0].name}", &document), "a0");
        assert_eq!(render("{.users[1]..*}", &document), "e2e");
        assert_eq!(
            render("{.items[?(@..name==\"a0\")].metadata.name}", &document),
            "bert",
            "a filter may look at every depth of the item"
        );
        assert_eq!(
            render("{range ..metadata}{.name};{end}", &document),
            "bert;gpt;"
        );
        assert_eq!(render("{..missing}", &document), "");
    }

    #[test]
    fn unions_give_each_members_results_in_turn() {
        let bert = job("bert", "Running");
        assert_eq!(render("{.spec.args[0,2]}", &bert), "--a --c");
        assert_eq!(render("{.spec.args[2, 0]}", &bert), "--c --a");
        assert_eq!(render("{.spec.args[-1,0:2]}", &bert), "--c --a --b");
        assert_eq!(render("{.spec.args[0:3:2]}", &bert), "--a --c");
        assert_eq!(render("{.spec.args[::2]}", &bert), "--a --c");
        assert_eq!(
            render("{.metadata['name','labels']}", &bert),
            r#"bert {"app.kubernetes.io/name":"bert"}"#
        );
        assert_eq!(
            render(r#"{.status["state", "missing"]}"#, &bert),
            "Running",
            "a member that finds nothing adds nothing"
        );
        // As in kubectl: all of the first member's results, then all of the second's.
        assert_eq!(
            render("{.items[*].metadata['name','labels']}", &list()),
            r#"bert gpt {"app.kubernetes.io/name":"bert"} {"app.kubernetes.io/name":"bert"}"#
        );
        assert_eq!(
            render("{.items[*].status.conditions[0,1].reason}", &list()),
            "Admitted Admitted Queued Queued"
        );
        assert_eq!(
            render("{range .items[*]}{.spec.args[0,-1]};{end}", &list()),
            "--a --c;--a --c;"
        );
    }

    #[test]
    fn escaped_dots_belong_to_the_key() {
        let bert = job("bert", "Running");
        assert_eq!(
            render(r"{.metadata.labels.app\.kubernetes\.io/name}", &bert),
            "bert"
        );
        assert_eq!(
            render(r"{.metadata.labels['app\.kubernetes\.io/name']}", &bert),
            "bert"
        );
    }

    #[test]
    fn a_bad_template_names_what_is_wrong_where_and_the_action() {
        assert_eq!(
            error("{.metadata.name"),
            "jsonpath template: { is never closed at position 1, in {.metadata.name"
        );
        assert_eq!(
            error("a {range .items[*]}{.x}"),
            "jsonpath template: {range ...} without its {end} at position 3, in {range .items[*]}"
        );
        assert_eq!(
            error("{.a}{end}"),
            "jsonpath template: {end} without a {range ...} before it at position 5, in {end}"
        );
        assert_eq!(
            error("{}"),
            "jsonpath template: empty {}: put a path in it, e.g. {.metadata.name} at position 1, in {}"
        );
        assert_eq!(
            error("x {.items[x]} y"),
            "jsonpath template: expected *, an index, a slice, a quoted key or ?(...) in [ ] at position 11, in {.items[x]}"
        );
        assert_eq!(
            error("{.items[0}"),
            "jsonpath template: unexpected '}', expected ] at position 10, in {.items[0}"
        );
        assert_eq!(
            error(r#"{"\q"}"#),
            "jsonpath template: unknown escape \\q: use \\n, \\t, \\r, \\\\, \\\" or \\. at position 3, in {\"\\q\"}"
        );
        assert_eq!(
            error("{metadata}"),
            "jsonpath template: expected a path such as .metadata.name, found 'm' at position 2, in {metadata}"
        );
        assert_eq!(
            error("{.a b}"),
            "jsonpath template: unexpected 'b', expected } at position 5, in {.a b}"
        );
    }

    #[test]
    fn a_bad_descent_or_union_names_its_expression() {
        assert_eq!(
            error("{.metadata.name} {..}"),
            "jsonpath template: expected a field name, * or [...] after .., e.g. {..name} at position 21, in {..}"
        );
        assert_eq!(
            error("{...name}"),
            "jsonpath template: expected a field name, * or [...] after .., e.g. {..name} at position 4, in {...name}"
        );
        assert_eq!(
            error("{.spec.args[0,]}"),
            "jsonpath template: expected *, an index, a slice, a quoted key or ?(...) in [ ] at position 15, in {.spec.args[0,]}"
        );
        assert_eq!(
            error("{.spec.args[0,*]}"),
            "jsonpath template: expected *, an index, a slice, a quoted key or ?(...) in [ ] at position 15, in {.spec.args[0,*]}"
        );
        assert_eq!(
            error("{.metadata['name' 'labels']}"),
            "jsonpath template: unexpected '\\'', expected ] at position 19, in {.metadata['name' 'labels']}"
        );
        assert_eq!(
            error("{.spec.args[0:2:0]}"),
            "jsonpath template: slice step 0 must be 1 or more at position 17, in {.spec.args[0:2:0]}"
        );
        assert_eq!(
            error("{.spec.args[0, 'a}"),
            "jsonpath template: string is never closed at position 16, in {.spec.args[0, 'a}"
        );
    }
}
