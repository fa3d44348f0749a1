//! Derived values that depend on the layer index `i` (MoE layer frequency, per-layer windows).
//! The planner evaluates `derive` once per model; rather than teach it a second, per-layer pass,
//! such a value is written into each `layer` parameter expression that reads it, where `i` is
//! already in scope. The planner's input keeps its shape, and a failure still names the value.

use indexmap::IndexMap;

use crate::mapping::{Expr, ParamSpec};

/// Largest expression, in nodes, that writing per-layer values into it may produce. Real ones are
/// a few dozen; the bound keeps a chain of values that each read the one before twice from growing
/// without end, and keeps evaluation far from the stack's limit.
const MAX_NODES: usize = 1024;

/// The per-layer derived values, in `derive` order, each with the earlier ones written into it.
pub(super) struct PerLayer(Vec<(String, Expr)>);

impl PerLayer {
    /// Splits `derive` into the values computed once and those computed per layer.
    pub(super) fn split(
        derive: IndexMap<String, Expr>,
    ) -> Result<(IndexMap<String, Expr>, PerLayer), String> {
        let names: Vec<String> = derive.keys().cloned().collect();
        let mut once = IndexMap::new();
        let mut per_layer = PerLayer(Vec::new());
        for (pos, (name, expr)) in derive.into_iter().enumerate() {
            if name == "i" {
                return Err(
                    "derive: `i` is the layer index; give the derived value another name".into(),
                );
            }
            let written = per_layer
                .written(&expr)
                .map_err(|e| format!("derive {name}: {e}"))?;
            if !written.reads("i") && !written.has_substitutions() {
                once.insert(name, expr);
                continue;
            }
            // Evaluated where it is read, the value would see every derived value; in order, it
            // sees only those above it. Refuse the case where the two differ.
            if let Some(later) = written
                .vars()
                .into_iter()
                .find(|v| names[pos + 1..].iter().any(|n| n == v))
            {
                return Err(format!(
                    "derive {name} depends on the layer index and reads {later}, which is derived after it; move {later} above {name}"
                ));
            }
            per_layer.0.push((name, written));
        }
        Ok((once, per_layer))
    }

    /// `e` with the per-layer values it reads written into it.
    pub(super) fn written(&self, e: &Expr) -> Result<Expr, String> {
        let mut out = e.clone();
        for (name, value) in &self.0 {
            if out.reads(name) {
                out = out.substitute(name, value);
                let size = out.size();
                if size > MAX_NODES {
                    return Err(format!(
                        "`{e}` grows to {size} nodes once {name} is written into it (at most {MAX_NODES}); simplify the derived values"
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Writes the per-layer values into every expression of a `layer` parameter.
    pub(super) fn write_into(&self, spec: &mut ParamSpec) -> Result<(), String> {
        spec.rewrite_exprs(&mut |e| self.written(e))
    }

    /// The first per-layer value `e` reads, if any.
    pub(super) fn read_by(&self, e: &Expr) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| e.reads(name))
            .map(|(name, _)| name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use crate::mapping::compose::tests::child;

    fn at_layer(i: u64) -> impl Fn(&str) -> Option<Value> {
        move |k: &str| match k {
            "i" => Some(Value::from(i)),
            "hidden_size" => Some(Value::from(8)),
            "every" => Some(Value::from(2)),
            _ => None,
        }
    }

    #[test]
    fn a_derived_value_that_reads_the_layer_is_evaluated_per_layer() {
        let m = child(
            "derive:\n  odd: \"i % every == 1\"\n  wide: \"odd && hidden_size > 0\"\nparameters:\n  layer:\n    - {name: x, when: wide, layout: {kind: replicated, shape: [\"hidden_size * (1 + i % every)\"]}}\n",
        )
        .unwrap();
        // Only the values computed once stay in `derive`, in order.
        let once: Vec<&str> = m.derive.keys().map(String::as_str).collect();
        assert_eq!(
            once,
            ["num_key_value_heads", "head_dim", "o_bias", "qkv_bias"]
        );
        let x = m.parameters.layer.iter().find(|s| s.name == "x").unwrap();
        let when = x.when.as_ref().unwrap();
        assert_eq!(when.src(), "wide");
        for (i, expect) in [(0, false), (1, true), (2, false), (3, true)] {
            assert_eq!(when.eval_bool(&at_layer(i)).unwrap(), expect, "layer {i}");
        }
    }

    #[test]
    fn a_failing_per_layer_value_is_named() {
        let m = child(
            "derive:\n  odd: \"i % nope == 1\"\nparameters:\n  layer:\n    - {name: x, when: odd, layout: {kind: replicated, shape: []}}\n",
        )
        .unwrap();
        let x = m.parameters.layer.iter().find(|s| s.name == "x").unwrap();
        let e = x.when.as_ref().unwrap().eval(&at_layer(0)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "odd = `i % nope == 1`: config field 'nope' is missing"
        );
    }

    #[test]
    fn a_value_may_shadow_the_config_field_it_reads() {
        let m = child(
            "derive:\n  every: \"(every ?? 3) + i\"\nparameters:\n  layer:\n    - {name: x, layout: {kind: replicated, shape: [every]}}\n",
        )
        .unwrap();
        let x = m.parameters.layer.iter().find(|s| s.name == "x").unwrap();
        let crate::mapping::Layout::Replicated(crate::layout::Replicated { shape }) = &x.layout
        else {
            panic!()
        };
        // The config's `every` (2) plus the layer.
        assert_eq!(shape[0].eval_u64(&at_layer(5)).unwrap(), 7);
    }

    #[test]
    fn per_layer_values_are_refused_where_there_is_no_layer() {
        let cases = [
            (
                "derive:\n  odd: \"i % 2\"\n  later: odd\nchecks:\n  - {rule: later, message: m}\n",
                "checks",
            ),
            (
                "derive:\n  odd: \"i % 2\"\nparameters:\n  tail:\n    - {name: y, when: odd, layout: {kind: replicated, shape: []}}\n",
                "y",
            ),
            (
                "derive:\n  odd: \"i % 2\"\nparameters:\n  layers: \"odd + 1\"\n",
                "parameters.layers",
            ),
            (
                "derive:\n  odd: \"i % step\"\n  step: 2\n",
                "move step above odd",
            ),
            ("derive:\n  i: 2\n", "layer index"),
        ];
        for (body, says) in cases {
            let e = child(body).expect_err(body);
            assert!(e.contains(says) && e.contains("t.yaml"), "{body}\n→ {e}");
        }
    }

    /// Each value reading the one before twice doubles the expression: refused at a bound, fast,
    /// instead of growing to 2^40 nodes.
    #[test]
    fn a_doubling_chain_is_refused() {
        let mut body = String::from("derive:\n  v0: i\n");
        for k in 1..40 {
            body.push_str(&format!("  v{k}: \"v{p} + v{p}\"\n", p = k - 1));
        }
        let e = child(&body).unwrap_err();
        assert!(e.contains("nodes"), "{e}");
    }
}
