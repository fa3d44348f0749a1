//! The small expression language of mapping files: shapes, conditions and derived config values,
//! written over config fields (`hidden_size / num_attention_heads`, `head_dim ?? hidden_size / num_attention_heads`).
//!
//! Integers, floats, booleans, `null`, lists and strings; `?? || && ! == != < <= > >= + - * / // %`,
//! `in`, parentheses and the functions `ceil_div`, `min`, `max`, `len`, `at(list or string, k)`, `subset(list, allowed)`, `given('field')`. `/` is exact division: an
//! inexact `/` is an error that quotes the expression, which is how divisibility rules explain
//! themselves. A missing field is an error, except on the left of `??`.

use std::fmt;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Longer than any expression a mapping needs (a few dozen tokens), short enough that the deepest
/// tree it allows cannot overflow a thread's stack in a debug build.
const MAX_TOKENS: usize = 256;

/// A parsed expression, keeping its source text for messages.
#[derive(Debug, Clone)]
pub struct Expr {
    src: String,
    node: Node,
}

#[derive(Debug, Clone)]
enum Node {
    Lit(Value),
    Var(String),
    Not(Box<Node>),
    Neg(Box<Node>),
    Bin(Op, Box<Node>, Box<Node>),
    Call(String, Vec<Node>),
    /// A per-layer derived value written in place of its name (see [`Expr::substitute`]).
    Derived(Box<Derived>),
}

#[derive(Debug, Clone)]
struct Derived {
    name: String,
    src: String,
    body: Node,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Coalesce,
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    In,
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Rem,
}

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error("config field '{name}'{} is missing", crate::config::or_spelling(.also.as_deref()))]
    Missing {
        name: String,
        /// transformers' other spelling of the field, when the config class has one.
        also: Option<String>,
    },
    #[error("{a} is not divisible by {b}")]
    NotDivisible { a: i64, b: i64 },
    #[error("division by zero")]
    DivByZero,
    #[error("{0}")]
    Type(String),
    /// A per-layer derived value inside the expression failed.
    #[error("{name} = `{expr}`: {source}")]
    Derived {
        name: String,
        expr: String,
        source: Box<EvalError>,
    },
}

/// Variable lookup: config fields, derived values, `tp`, `i`, ...
pub trait Scope {
    fn get(&self, name: &str) -> Option<Value>;

    /// The other spelling of a config field (transformers' attribute aliases), so that a missing
    /// field's error names both; none by default.
    fn other_spelling(&self, _name: &str) -> Option<&'static str> {
        None
    }

    /// Whether config.json itself states `name` (even as `null`), before defaults: transformers
    /// keeps an explicit `null` where it would default a missing key (DeepSeek's `q_lora_rank`).
    fn given(&self, _name: &str) -> Option<bool> {
        None
    }
}

impl<F: Fn(&str) -> Option<Value>> Scope for F {
    fn get(&self, name: &str) -> Option<Value> {
        self(name)
    }
}

impl Expr {
    pub fn parse(src: &str) -> Result<Expr, String> {
        let toks = lex(src)?;
        let mut p = Parser { toks, pos: 0 };
        let node = p.expr(0)?;
        if p.pos != p.toks.len() {
            return Err(format!("unexpected '{}'", p.toks[p.pos]));
        }
        Ok(Expr {
            src: src.to_string(),
            node,
        })
    }

    /// An expression that is just a value (a YAML number or boolean).
    pub(crate) fn literal(v: Value) -> Expr {
        Expr {
            src: v.to_string(),
            node: Node::Lit(v),
        }
    }

    pub(crate) fn src(&self) -> &str {
        &self.src
    }

    pub fn eval(&self, s: &dyn Scope) -> Result<Value, EvalError> {
        eval(&self.node, s)
    }

    pub fn eval_u64(&self, s: &dyn Scope) -> Result<u64, EvalError> {
        match self.eval(s)? {
            Value::Number(n) if n.as_u64().is_some() => Ok(n.as_u64().unwrap()),
            Value::Number(n) if n.as_f64().is_some_and(|f| f >= 0.0 && f.fract() == 0.0) => {
                Ok(n.as_f64().unwrap() as u64)
            }
            other => Err(EvalError::Type(format!(
                "expected a non-negative integer, got {other}"
            ))),
        }
    }

    pub fn eval_bool(&self, s: &dyn Scope) -> Result<bool, EvalError> {
        Ok(truthy(&self.eval(s)?))
    }

    /// Whether the expression reads the variable `name` itself (not through a value substituted
    /// into it).
    pub(crate) fn reads(&self, name: &str) -> bool {
        let mut found = false;
        walk(&self.node, &mut |n| {
            found |= matches!(n, Node::Var(v) if v == name);
        });
        found
    }

    /// The variables the expression reads itself, each once, in order of appearance.
    pub(crate) fn vars(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        walk(&self.node, &mut |n| {
            if let Node::Var(v) = n
                && !out.contains(&v.as_str())
            {
                out.push(v);
            }
        });
        out
    }

    /// The variables read, each once in order of appearance, also those inside substituted
    /// values (the config fields a derived `linear_layer` stands for).
    pub(crate) fn vars_through_substitutions(&self) -> Vec<&str> {
        fn visit<'a>(n: &'a Node, out: &mut Vec<&'a str>) {
            walk(n, &mut |m| match m {
                Node::Var(v) if !out.contains(&v.as_str()) => out.push(v),
                Node::Derived(d) => visit(&d.body, out),
                _ => {}
            });
        }
        let mut out = Vec::new();
        visit(&self.node, &mut out);
        out
    }

    /// Whether a value substituted into the expression is inside it.
    pub(crate) fn has_substitutions(&self) -> bool {
        let mut found = false;
        walk(&self.node, &mut |n| found |= matches!(n, Node::Derived(_)));
        found
    }

    /// The expression with every read of `name` replaced by `value`, evaluated where it is read;
    /// the source text stays the same, and a failure inside `value` names it. Values substituted
    /// earlier are left as they are: their own reads were resolved when they were defined.
    pub(crate) fn substitute(&self, name: &str, value: &Expr) -> Expr {
        let derived = Node::Derived(Box::new(Derived {
            name: name.to_string(),
            src: value.src.clone(),
            body: value.node.clone(),
        }));
        Expr {
            src: self.src.clone(),
            node: replace(&self.node, name, &derived),
        }
    }

    /// Nodes in the tree, counting each substituted value in full: how much evaluating it costs.
    pub(crate) fn size(&self) -> usize {
        size(&self.node)
    }

    /// The conditions of a chain of `&&`, looking through substituted per-layer values (a layer
    /// condition is usually one such value): what must all hold for the whole to hold, so that a
    /// false one says why. Each keeps the whole expression's source text.
    pub(crate) fn conjuncts(&self) -> Vec<Expr> {
        let mut out = Vec::new();
        split_and(&self.node, &mut out);
        out.into_iter()
            .map(|node| Expr {
                src: self.src.clone(),
                node,
            })
            .collect()
    }
}

fn split_and(n: &Node, out: &mut Vec<Node>) {
    match n {
        Node::Bin(Op::And, a, b) => {
            split_and(a, out);
            split_and(b, out);
        }
        Node::Derived(d) => split_and(&d.body, out),
        _ => out.push(n.clone()),
    }
}

/// Visits every node outside substituted values.
fn walk<'a>(n: &'a Node, f: &mut dyn FnMut(&'a Node)) {
    f(n);
    match n {
        Node::Lit(_) | Node::Var(_) | Node::Derived(_) => {}
        Node::Not(x) | Node::Neg(x) => walk(x, f),
        Node::Bin(_, a, b) => {
            walk(a, f);
            walk(b, f);
        }
        Node::Call(_, args) => args.iter().for_each(|a| walk(a, f)),
    }
}

fn replace(n: &Node, name: &str, with: &Node) -> Node {
    let r = |x: &Node| Box::new(replace(x, name, with));
    match n {
        Node::Var(v) if v == name => with.clone(),
        Node::Lit(_) | Node::Var(_) | Node::Derived(_) => n.clone(),
        Node::Not(x) => Node::Not(r(x)),
        Node::Neg(x) => Node::Neg(r(x)),
        Node::Bin(op, a, b) => Node::Bin(*op, r(a), r(b)),
        Node::Call(f, args) => Node::Call(
            f.clone(),
            args.iter().map(|a| replace(a, name, with)).collect(),
        ),
    }
}

fn size(n: &Node) -> usize {
    1 + match n {
        Node::Lit(_) | Node::Var(_) => 0,
        Node::Derived(d) => size(&d.body),
        Node::Not(x) | Node::Neg(x) => size(x),
        Node::Bin(_, a, b) => size(a).saturating_add(size(b)),
        Node::Call(_, args) => args.iter().map(size).fold(0, usize::saturating_add),
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.src)
    }
}

impl<'de> Deserialize<'de> for Expr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Expr::parse(&s).map_err(|e| {
                serde::de::Error::custom(format!("in expression `{}`: {e}", shorten(&s)))
            }),
            v @ (Value::Number(_) | Value::Bool(_) | Value::Null) => Ok(Expr::literal(v)),
            other => Err(serde::de::Error::custom(format!(
                "expected an expression, got {other}"
            ))),
        }
    }
}

/// The expression as an error message quotes it: whole unless it is longer than any real one.
fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    match s.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}… ({} bytes)", &s[..at], s.len()),
        None => s.to_string(),
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::Bool(b) => Some(*b as i64),
        _ => None,
    }
}

fn eval(n: &Node, s: &dyn Scope) -> Result<Value, EvalError> {
    match n {
        Node::Lit(v) => Ok(v.clone()),
        Node::Var(name) => s.get(name).ok_or_else(|| EvalError::Missing {
            name: name.clone(),
            also: s.other_spelling(name).map(str::to_string),
        }),
        Node::Not(x) => Ok(Value::Bool(!truthy(&eval(x, s)?))),
        Node::Neg(x) => {
            let v = eval(x, s)?;
            match (int(&v), v.as_f64()) {
                (Some(i), _) if !v.is_boolean() => i
                    .checked_neg()
                    .map(Value::from)
                    .ok_or_else(|| EvalError::Type(format!("cannot negate {v}: out of range"))),
                (_, Some(f)) => Ok(Value::from(-f)),
                _ => Err(EvalError::Type(format!("cannot negate {v}"))),
            }
        }
        Node::Bin(Op::Coalesce, a, b) => match eval(a, s) {
            Ok(Value::Null) | Err(EvalError::Missing { .. }) => eval(b, s),
            other => other,
        },
        Node::Bin(Op::Or, a, b) => {
            let va = eval(a, s)?;
            if truthy(&va) { Ok(va) } else { eval(b, s) }
        }
        Node::Bin(Op::And, a, b) => {
            let va = eval(a, s)?;
            if !truthy(&va) { Ok(va) } else { eval(b, s) }
        }
        Node::Bin(op, a, b) => binary(*op, eval(a, s)?, eval(b, s)?),
        Node::Call(f, args) => {
            let vals = args
                .iter()
                .map(|a| eval(a, s))
                .collect::<Result<Vec<_>, _>>()?;
            if let ("given", [Value::String(name)]) = (f.as_str(), vals.as_slice()) {
                return s.given(name).map(Value::Bool).ok_or_else(|| {
                    EvalError::Type("given() needs a config: it is not known here".into())
                });
            }
            call(f, &vals)
        }
        Node::Derived(d) => eval(&d.body, s).map_err(|e| EvalError::Derived {
            name: d.name.clone(),
            expr: d.src.clone(),
            source: Box::new(e),
        }),
    }
}

fn binary(op: Op, a: Value, b: Value) -> Result<Value, EvalError> {
    let ty = || EvalError::Type(format!("cannot apply {op:?} to {a} and {b}"));
    match op {
        Op::Eq => return Ok(Value::Bool(loose_eq(&a, &b))),
        Op::Ne => return Ok(Value::Bool(!loose_eq(&a, &b))),
        Op::In => {
            return match &b {
                Value::Array(items) => Ok(Value::Bool(items.iter().any(|x| loose_eq(x, &a)))),
                // Python's substring test (Nemotron-H's `'E' in hybrid_override_pattern`).
                Value::String(t) => match &a {
                    Value::String(part) => Ok(Value::Bool(t.contains(part.as_str()))),
                    _ => Err(ty()),
                },
                Value::Null => Ok(Value::Bool(false)),
                _ => Err(ty()),
            };
        }
        _ => {}
    }
    if let (Some(x), Some(y)) = (int(&a), int(&b)) {
        let overflow = || {
            EvalError::Type(format!(
                "{op:?} of {x} and {y} is out of the 64-bit integer range"
            ))
        };
        let v = match op {
            Op::Lt => Value::Bool(x < y),
            Op::Le => Value::Bool(x <= y),
            Op::Gt => Value::Bool(x > y),
            Op::Ge => Value::Bool(x >= y),
            Op::Add => Value::from(x.checked_add(y).ok_or_else(overflow)?),
            Op::Sub => Value::from(x.checked_sub(y).ok_or_else(overflow)?),
            Op::Mul => Value::from(x.checked_mul(y).ok_or_else(overflow)?),
            Op::Div => {
                if y == 0 {
                    return Err(EvalError::DivByZero);
                }
                // checked_rem: i64::MIN % -1 overflows (and panics even in release builds).
                if x.checked_rem(y).ok_or_else(overflow)? != 0 {
                    return Err(EvalError::NotDivisible { a: x, b: y });
                }
                Value::from(x.checked_div(y).ok_or_else(overflow)?)
            }
            Op::FloorDiv => {
                if y == 0 {
                    return Err(EvalError::DivByZero);
                }
                Value::from(x.checked_div_euclid(y).ok_or_else(overflow)?)
            }
            Op::Rem => {
                if y == 0 {
                    return Err(EvalError::DivByZero);
                }
                Value::from(x.checked_rem_euclid(y).ok_or_else(overflow)?)
            }
            _ => return Err(ty()),
        };
        return Ok(v);
    }
    let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) else {
        return Err(ty());
    };
    Ok(match op {
        Op::Lt => Value::Bool(x < y),
        Op::Le => Value::Bool(x <= y),
        Op::Gt => Value::Bool(x > y),
        Op::Ge => Value::Bool(x >= y),
        Op::Add => Value::from(x + y),
        Op::Sub => Value::from(x - y),
        Op::Mul => Value::from(x * y),
        Op::Div => Value::from(x / y),
        Op::FloorDiv => Value::from((x / y).floor()),
        Op::Rem => Value::from(x.rem_euclid(y)),
        _ => return Err(ty()),
    })
}

fn loose_eq(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn call(f: &str, args: &[Value]) -> Result<Value, EvalError> {
    let ints = || {
        args.iter()
            .map(|a| int(a).ok_or_else(|| EvalError::Type(format!("{f}: {a} is not an integer"))))
            .collect::<Result<Vec<i64>, _>>()
    };
    match (f, args.len()) {
        ("ceil_div", 2) => {
            let v = ints()?;
            if v[1] == 0 {
                return Err(EvalError::DivByZero);
            }
            v[1].checked_sub(1)
                .and_then(|d| v[0].checked_add(d))
                .and_then(|n| n.checked_div_euclid(v[1]))
                .map(Value::from)
                .ok_or_else(|| {
                    EvalError::Type(format!("ceil_div({}, {}) is out of range", v[0], v[1]))
                })
        }
        ("min", n) if n > 0 => Ok(Value::from(*ints()?.iter().min().unwrap())),
        ("max", n) if n > 0 => Ok(Value::from(*ints()?.iter().max().unwrap())),
        // Whether every item of a list is one of `allowed` (a null list has none).
        ("subset", 2) => match (&args[0], &args[1]) {
            (Value::Null, _) => Ok(Value::Bool(true)),
            (Value::Array(a), Value::Array(allowed)) => Ok(Value::Bool(
                a.iter().all(|x| allowed.iter().any(|y| loose_eq(x, y))),
            )),
            (v, w) => Err(EvalError::Type(format!("subset: {v} or {w} is not a list"))),
        },
        ("len", 1) => match &args[0] {
            Value::Array(a) => Ok(Value::from(a.len())),
            Value::String(t) => Ok(Value::from(t.chars().count())),
            Value::Null => Ok(Value::from(0)),
            v => Err(EvalError::Type(format!("len: {v} is not a list"))),
        },
        // Python's `seq[k]` for a list or a string (Qwen3.5's `layer_types[i]`, DeepSeek-V3.2's
        // `index_topk_pattern[layer]`, a string of 'S'/'F'); past either end, and of a null list,
        // `null` rather than an IndexError, so that the mapping can say what vLLM does there
        // (`??` a fallback, or a check on the length).
        ("at", 2) => {
            let k = int(&args[1])
                .ok_or_else(|| EvalError::Type(format!("at: {} is not an integer", args[1])))?;
            let k = usize::try_from(k).ok();
            Ok(match &args[0] {
                Value::Array(a) => k.and_then(|k| a.get(k)).cloned().unwrap_or(Value::Null),
                Value::String(t) => k
                    .and_then(|k| t.chars().nth(k))
                    .map_or(Value::Null, |c| Value::String(c.to_string())),
                Value::Null => Value::Null,
                v => {
                    return Err(EvalError::Type(format!(
                        "at: {v} is not a list or a string"
                    )));
                }
            })
        }
        _ => Err(EvalError::Type(format!(
            "unknown function {f} with {} arguments",
            args.len()
        ))),
    }
}

// ---- lexer and Pratt parser ----

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(Value),
    Ident(String),
    Str(String),
    Sym(&'static str),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Num(v) => write!(f, "{v}"),
            Tok::Ident(s) => f.write_str(s),
            Tok::Str(s) => write!(f, "'{s}'"),
            Tok::Sym(s) => f.write_str(s),
        }
    }
}

const SYMS: [&str; 21] = [
    "??", "||", "&&", "==", "!=", "<=", ">=", "//", "<", ">", "+", "-", "*", "/", "%", "!", "(",
    ")", ",", "[", "]",
];

fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let mut out = Vec::new();
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        // Parsing, evaluating and dropping recurse once per level of the tree, and a tree is never
        // deeper than its token count: bounding the tokens bounds the stack, whatever the nesting.
        if out.len() > MAX_TOKENS {
            return Err(format!(
                "more than {MAX_TOKENS} tokens; split the expression into `derive` entries"
            ));
        }
        let c = b[i] as char;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let j = i + src[i..]
                .find(|ch: char| !(ch.is_ascii_digit() || ch == '.' || ch == '_' || ch == 'e'))
                .unwrap_or(src.len() - i);
            let text = src[i..j].replace('_', "");
            let v = if let Ok(n) = text.parse::<i64>() {
                Value::from(n)
            } else {
                Value::from(
                    text.parse::<f64>()
                        .map_err(|_| format!("bad number '{text}'"))?,
                )
            };
            out.push(Tok::Num(v));
            i = j;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let j = i + src[i..]
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '.'))
                .unwrap_or(src.len() - i);
            out.push(Tok::Ident(src[i..j].to_string()));
            i = j;
        } else if c == '\'' || c == '"' {
            let j = src[i + 1..].find(c).ok_or("unterminated string")?;
            out.push(Tok::Str(src[i + 1..i + 1 + j].to_string()));
            i += j + 2;
        } else if let Some(s) = SYMS.iter().find(|s| src[i..].starts_with(*s)) {
            out.push(Tok::Sym(s));
            i += s.len();
        } else {
            return Err(format!("unexpected character '{c}'"));
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

fn infix(t: &Tok) -> Option<(Op, u8)> {
    Some(match t {
        Tok::Sym("??") => (Op::Coalesce, 1),
        Tok::Sym("||") => (Op::Or, 2),
        Tok::Ident(s) if s == "or" => (Op::Or, 2),
        Tok::Sym("&&") => (Op::And, 3),
        Tok::Ident(s) if s == "and" => (Op::And, 3),
        Tok::Sym("==") => (Op::Eq, 4),
        Tok::Sym("!=") => (Op::Ne, 4),
        Tok::Sym("<") => (Op::Lt, 4),
        Tok::Sym("<=") => (Op::Le, 4),
        Tok::Sym(">") => (Op::Gt, 4),
        Tok::Sym(">=") => (Op::Ge, 4),
        Tok::Ident(s) if s == "in" => (Op::In, 4),
        Tok::Sym("+") => (Op::Add, 5),
        Tok::Sym("-") => (Op::Sub, 5),
        Tok::Sym("*") => (Op::Mul, 6),
        Tok::Sym("/") => (Op::Div, 6),
        Tok::Sym("//") => (Op::FloorDiv, 6),
        Tok::Sym("%") => (Op::Rem, 6),
        _ => return None,
    })
}

impl Parser {
    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn expect(&mut self, s: &'static str) -> Result<(), String> {
        match self.next() {
            Some(Tok::Sym(x)) if x == s => Ok(()),
            Some(t) => Err(format!("expected '{s}', found '{t}'")),
            None => Err(format!("expected '{s}' at the end")),
        }
    }

    fn expr(&mut self, min: u8) -> Result<Node, String> {
        let mut lhs = self.prefix()?;
        while let Some((op, prec)) = self.toks.get(self.pos).and_then(infix) {
            if prec < min {
                break;
            }
            self.pos += 1;
            // `??` is right-associative: a ?? b ?? c = a ?? (b ?? c); the rest are left-associative.
            let next_min = if op == Op::Coalesce { prec } else { prec + 1 };
            let rhs = self.expr(next_min)?;
            lhs = Node::Bin(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn prefix(&mut self) -> Result<Node, String> {
        match self.next() {
            Some(Tok::Num(v)) => Ok(Node::Lit(v)),
            Some(Tok::Str(s)) => Ok(Node::Lit(Value::String(s))),
            Some(Tok::Ident(s)) => match s.as_str() {
                "true" => Ok(Node::Lit(Value::Bool(true))),
                "false" => Ok(Node::Lit(Value::Bool(false))),
                "null" | "None" => Ok(Node::Lit(Value::Null)),
                "not" => Ok(Node::Not(Box::new(self.expr(7)?))),
                _ if self.toks.get(self.pos) == Some(&Tok::Sym("(")) => {
                    self.pos += 1;
                    let mut args = Vec::new();
                    if self.toks.get(self.pos) != Some(&Tok::Sym(")")) {
                        loop {
                            args.push(self.expr(0)?);
                            if self.toks.get(self.pos) == Some(&Tok::Sym(",")) {
                                self.pos += 1;
                            } else {
                                break;
                            }
                        }
                    }
                    self.expect(")")?;
                    Ok(Node::Call(s, args))
                }
                _ => Ok(Node::Var(s)),
            },
            Some(Tok::Sym("!")) => Ok(Node::Not(Box::new(self.expr(7)?))),
            Some(Tok::Sym("-")) => Ok(Node::Neg(Box::new(self.expr(7)?))),
            Some(Tok::Sym("(")) => {
                let n = self.expr(0)?;
                self.expect(")")?;
                Ok(n)
            }
            Some(Tok::Sym("[")) => {
                let mut items = Vec::new();
                while self.toks.get(self.pos) != Some(&Tok::Sym("]")) {
                    match self.expr(0)? {
                        Node::Lit(v) => items.push(v),
                        _ => return Err("list items must be literals".into()),
                    }
                    if self.toks.get(self.pos) == Some(&Tok::Sym(",")) {
                        self.pos += 1;
                    }
                }
                self.expect("]")?;
                Ok(Node::Lit(Value::Array(items)))
            }
            Some(t) => Err(format!("unexpected '{t}'")),
            None => Err("unexpected end of expression".into()),
        }
    }
}

impl EvalError {
    /// The variable the expression named that nothing defines, when that is why it failed.
    pub(crate) fn missing_variable(&self) -> Option<&str> {
        match self {
            EvalError::Missing { name, .. } => Some(name),
            EvalError::Derived { source, .. } => source.missing_variable(),
            _ => None,
        }
    }
}

/// The fix for an expression naming `name`, which neither config.json nor the mapping (its
/// defaults and derived values) defines. A defined name a typo away means the mapping file is
/// wrong, not the config; otherwise either may be, and the closest names help decide.
pub(crate) fn unknown_variable_fix<'k>(
    name: &str,
    known: impl IntoIterator<Item = &'k str>,
    mapping_file: &str,
) -> String {
    // Closest first: a name sharing a word (`heads` in `n_heads` and `num_attention_heads`),
    // then by edit distance.
    let words = |s: &'k str| s.split('_').filter(|w| w.len() > 1);
    let shares_word = |k: &'k str| words(k).any(|w| name.split('_').any(|x| x == w));
    let mut near: Vec<(bool, usize, &str)> = known
        .into_iter()
        .filter(|k| *k != name)
        .map(|k| (!shares_word(k), edit_distance(name, k), k))
        .collect();
    near.sort_unstable_by_key(|&(no_word, d, k)| (d > typo_distance(name), no_word, d, k));
    match near.first() {
        Some(&(_, d, k)) if d <= typo_distance(name) => format!(
            "'{name}' is not a config field or a value the mapping defines; did you mean '{k}'? Correct it in {mapping_file}"
        ),
        _ => {
            let closest: Vec<String> = near
                .iter()
                .take(3)
                .map(|(_, _, k)| format!("'{k}'"))
                .collect();
            let closest = if closest.is_empty() {
                String::new()
            } else {
                format!(" (closest known: {})", closest.join(", "))
            };
            format!(
                "'{name}' is an unknown variable: if the model needs that field, add it to config.json or pass it with --hf-overrides; if the name is wrong, correct it in {mapping_file}{closest}"
            )
        }
    }
}

/// The most edits that still read as a typo of `name` rather than another word.
fn typo_distance(name: &str) -> usize {
    (name.chars().count() / 4).clamp(1, 3)
}

/// Levenshtein distance over characters: names are short, a row of the table is enough.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(src: &str) -> Result<Value, EvalError> {
        let cfg = json!({"hidden_size": 4096, "num_attention_heads": 32, "head_dim": null,
                         "layers": [1, 3], "tie": false});
        let scope = move |k: &str| cfg.get(k).cloned();
        Expr::parse(src).unwrap().eval(&scope)
    }

    /// `at(list, k)`: an item of a list (Qwen3.5's `layer_types[i]`), null for a null list so
    /// that a fallback can follow, an error past the end.
    #[test]
    fn at_reads_an_item_of_a_list() {
        assert_eq!(ev("at(layers, 1)").unwrap(), json!(3));
        assert_eq!(ev("at(head_dim, 7) == null").unwrap(), json!(true));
        // Past the end is null, as for a null list: the mapping checks the length itself.
        assert_eq!(ev("at(layers, 2) == null").unwrap(), json!(true));
        assert!(ev("at(hidden_size, 0)").is_err());
        assert_eq!(ev("subset(layers, [1, 2, 3])").unwrap(), json!(true));
        assert_eq!(ev("subset(layers, [1])").unwrap(), json!(false));
        assert_eq!(ev("subset(head_dim, [1])").unwrap(), json!(true));
    }

    #[test]
    fn conjuncts_split_and_chains_through_substituted_values() {
        let moe = Expr::parse("n > 0 && i >= k && (i % f == 0 || x)").unwrap();
        let when = Expr::parse("moe_layer && shared")
            .unwrap()
            .substitute("moe_layer", &moe);
        let conds = when.conjuncts();
        let parts: Vec<Vec<&str>> = conds.iter().map(Expr::vars).collect();
        assert_eq!(
            parts,
            vec![
                vec!["n"],
                vec!["i", "k"],
                vec!["i", "f", "x"],
                vec!["shared"]
            ]
        );
        // One condition is its own only conjunct.
        assert_eq!(Expr::parse("a || b").unwrap().conjuncts().len(), 1);
    }

    #[test]
    fn arithmetic_and_precedence() {
        assert_eq!(ev("hidden_size / num_attention_heads").unwrap(), json!(128));
        assert_eq!(ev("1 + 2 * 3").unwrap(), json!(7));
        assert_eq!(ev("(1 + 2) * 3").unwrap(), json!(9));
        assert_eq!(ev("7 // 2").unwrap(), json!(3));
        assert_eq!(ev("ceil_div(1000, 64) * 64").unwrap(), json!(1024));
        assert_eq!(ev("at('SFS', 1)").unwrap(), json!("F"));
        assert_eq!(ev("at([1, 2], 5)").unwrap(), json!(null));
        assert_eq!(ev("at(null, 0)").unwrap(), json!(null));
        assert_eq!(ev("len('SFS')").unwrap(), json!(3));
        assert_eq!(ev("-3 + 5").unwrap(), json!(2));
    }

    #[test]
    fn exact_division_explains_itself() {
        assert_eq!(
            ev("hidden_size / 3"),
            Err(EvalError::NotDivisible { a: 4096, b: 3 })
        );
    }

    #[test]
    fn coalesce_covers_missing_and_null() {
        assert_eq!(
            ev("head_dim ?? hidden_size / num_attention_heads").unwrap(),
            json!(128)
        );
        assert_eq!(ev("nope ?? 5").unwrap(), json!(5));
        assert_eq!(ev("a ?? b ?? 2").unwrap(), json!(2));
        assert_eq!(
            ev("nope"),
            Err(EvalError::Missing {
                name: "nope".into(),
                also: None
            })
        );
    }

    #[test]
    fn logic_and_membership() {
        assert_eq!(ev("1 in layers").unwrap(), json!(true));
        assert_eq!(ev("2 in layers").unwrap(), json!(false));
        // A string: Python's substring test.
        assert_eq!(ev("'E' in 'M-M*'").unwrap(), json!(false));
        assert_eq!(ev("'*' in 'M-M*'").unwrap(), json!(true));
        assert!(ev("1 in 'M-M*'").is_err());
        assert_eq!(ev("!tie && 3 > 2").unwrap(), json!(true));
        assert_eq!(ev("tie || 0").unwrap(), json!(0));
        assert_eq!(ev("tie == false").unwrap(), json!(true));
    }

    /// Values at the edge of i64 give errors, not overflow panics (`-i64::MIN`, `i64::MIN / -1`).
    #[test]
    fn integer_edges_are_errors_not_panics() {
        let cfg = json!({"min": i64::MIN, "neg": -1});
        let scope = move |k: &str| cfg.get(k).cloned();
        for src in [
            "-min",
            "min / neg",
            "min // neg",
            "min % neg",
            "ceil_div(min, neg)",
            "ceil_div(1, min)",
            "min - 1",
        ] {
            assert!(Expr::parse(src).unwrap().eval(&scope).is_err(), "{src}");
        }
    }

    /// Nesting is bounded before the parser recurses: no stack overflow.
    #[test]
    fn deep_or_long_expressions_are_refused() {
        let deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(Expr::parse(&deep).unwrap_err().contains("tokens"));
        let long = vec!["1"; 10_000].join(" + ");
        assert!(Expr::parse(&long).unwrap_err().contains("tokens"));
        assert!(Expr::parse(&vec!["1"; 100].join(" + ")).is_ok());
    }

    #[test]
    fn parse_errors_are_reported() {
        assert!(Expr::parse("1 +").is_err());
        assert!(Expr::parse("(1").is_err());
        assert!(Expr::parse("a $ b").is_err());
    }

    #[test]
    fn an_unknown_variable_near_a_known_one_is_a_typo_in_the_mapping() {
        let known = ["hidden_size", "num_attention_heads", "vocab_size", "tp"];
        let fix = unknown_variable_fix("hiden_size", known, "my.yaml");
        assert_eq!(
            fix,
            "'hiden_size' is not a config field or a value the mapping defines; did you mean 'hidden_size'? Correct it in my.yaml"
        );
        // Nothing close: it may be a field the config lacks, or a name to correct.
        let fix = unknown_variable_fix("rope_scaling_factor", known, "my.yaml");
        assert!(fix.starts_with("'rope_scaling_factor' is an unknown variable: if the model needs that field, add it to config.json"), "{fix}");
        assert!(
            fix.contains("correct it in my.yaml (closest known: "),
            "{fix}"
        );
        // A shared word ranks a name first, however far it is by edits.
        let fix = unknown_variable_fix("n_heads_total", known, "my.yaml");
        assert!(
            fix.ends_with("(closest known: 'num_attention_heads', 'hidden_size', 'vocab_size')"),
            "{fix}"
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(edit_distance("模型", "模"), 1);
    }

    #[test]
    fn the_missing_variable_is_found_through_derived_values() {
        let missing = EvalError::Missing {
            name: "x".into(),
            also: None,
        };
        let derived = EvalError::Derived {
            name: "d".into(),
            expr: "x + 1".into(),
            source: Box::new(missing.clone()),
        };
        assert_eq!(derived.missing_variable(), Some("x"));
        assert_eq!(EvalError::DivByZero.missing_variable(), None);
    }
}
