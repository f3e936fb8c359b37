//! Builder core: value bookkeeping, the generic-form op printer, regions, and
//! the module wrapper.
//!
//! Ops are printed eagerly, one line (plus any region text) per op, in MLIR's
//! generic form `%3 = "stablehlo.add"(%1, %2) : (t, t) -> t`. The generic form
//! does not depend on each op's custom assembly format, which has changed
//! between StableHLO versions, so the same text parses on old and new plugins.

use crate::types::TensorType;

/// An SSA value created by a [`Builder`]. Only meaningful for the builder that made it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Value(pub(crate) u32);

struct ValueInfo {
    ty: TensorType,
    /// Printed name: `%arg0`, `%7`, or `%7#1` for the second result of a multi-result op.
    name: String,
    /// Block the value was defined in; it may be used there and in regions nested inside.
    block: u32,
}

/// Builds the body of `func.func public @main`.
pub struct Builder {
    values: Vec<ValueInfo>,
    params: Vec<Value>,
    /// Next SSA number. One counter for the whole function, so names never clash
    /// across nested regions (MLIR rejects redefinitions there).
    next_ssa: u32,
    /// Text of each open block; `[0]` is the body of @main, the last is the block being filled.
    bufs: Vec<String>,
    /// Ids of the open blocks, parallel to `bufs`.
    open_blocks: Vec<u32>,
    /// Block arguments of the open regions (innermost last).
    open_args: Vec<Vec<Value>>,
    next_block: u32,
    pub(crate) precision: Option<Precision>,
    module_name: String,
    /// Functions printed after @main (private; what `call` calls), by name.
    functions: Vec<(String, String)>,
    /// What each `transpose` result was made from: (operand, permutation).
    pub(crate) transposes: std::collections::HashMap<Value, (Value, Vec<i64>)>,
}

/// `precision_config` for dot_general and convolution. XLA on GPU may use
/// reduced-precision (TF32) matmuls for f32 at DEFAULT; HIGHEST forbids that.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    Default,
    High,
    Highest,
}

impl Precision {
    pub fn mlir_name(self) -> &'static str {
        match self {
            Precision::Default => "DEFAULT",
            Precision::High => "HIGH",
            Precision::Highest => "HIGHEST",
        }
    }
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    pub fn new() -> Self {
        Builder {
            values: Vec::new(),
            params: Vec::new(),
            next_ssa: 0,
            bufs: vec![String::new()],
            open_blocks: vec![0],
            open_args: Vec::new(),
            next_block: 1,
            precision: None,
            module_name: "m".to_string(),
            functions: Vec::new(),
            transposes: std::collections::HashMap::new(),
        }
    }

    /// Name of the printed module (`module @name`); default `m`.
    pub fn set_module_name(&mut self, name: &str) {
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.'),
            "module name {name:?} must be letters, digits, '_' or '.'"
        );
        self.module_name = name.to_string();
    }

    /// Precision attached to every later dot_general / convolution (`None`: omit the attribute).
    pub fn set_precision(&mut self, p: Option<Precision>) {
        self.precision = p;
    }

    /// Calls the function `name` (`func.call`), adding its definition `text` (a whole
    /// `func.func private @name ...`, and any functions it calls) to the module on first use.
    pub fn call(&mut self, name: &str, text: &str, operands: &[Value], result_types: &[TensorType]) -> Vec<Value> {
        if !self.functions.iter().any(|(n, _)| n == name) {
            self.functions.push((name.to_string(), text.to_string()));
        }
        self.emit("func.call", operands, &[], &format!("callee = @{name}"), result_types)
    }

    /// Adds the next argument of @main.
    pub fn param(&mut self, ty: TensorType) -> Value {
        assert_eq!(self.open_blocks.len(), 1, "param() called inside a region");
        let name = format!("%arg{}", self.params.len());
        let v = self.new_value(ty, name, 0);
        self.params.push(v);
        v
    }

    /// `(operand, permutation)` when `v` is a `transpose` result: a consumer that can read the
    /// operand in its own layout (a product of a transposed matrix) need not move its data.
    pub fn transpose_of(&self, v: Value) -> Option<(Value, &[i64])> {
        self.transposes.get(&v).map(|(src, perm)| (*src, &perm[..]))
    }

    pub fn ty(&self, v: Value) -> &TensorType {
        &self.info(v).ty
    }

    pub fn dims(&self, v: Value) -> &[i64] {
        &self.info(v).ty.dims
    }

    pub fn elem(&self, v: Value) -> crate::ElemType {
        self.info(v).ty.elem
    }

    pub fn rank(&self, v: Value) -> usize {
        self.info(v).ty.dims.len()
    }

    /// Number of params added so far.
    /// The value of parameter `i` (in the order `param` created them).
    pub fn param_value(&self, i: usize) -> Value {
        self.params[i]
    }

    pub fn num_params(&self) -> usize {
        self.params.len()
    }

    fn info(&self, v: Value) -> &ValueInfo {
        self.values.get(v.0 as usize).unwrap_or_else(|| panic!("{v:?} does not belong to this builder"))
    }

    fn new_value(&mut self, ty: TensorType, name: String, block: u32) -> Value {
        let v = Value(self.values.len() as u32);
        self.values.push(ValueInfo { ty, name, block });
        v
    }

    /// Panics unless `v` is visible in the block being filled.
    pub(crate) fn check(&self, op: &str, v: Value) {
        let block = self.info(v).block;
        assert!(
            self.open_blocks.contains(&block),
            "{op}: {v:?} was defined inside a region that is already closed"
        );
    }

    /// Prints one op in generic form and returns its results.
    /// `regions` are texts from [`Builder::region`]; `attrs` is the inside of the
    /// attribute dictionary (may be empty).
    pub(crate) fn emit(
        &mut self,
        op: &str,
        operands: &[Value],
        regions: &[String],
        attrs: &str,
        result_types: &[TensorType],
    ) -> Vec<Value> {
        for &v in operands {
            self.check(op, v);
        }
        let id = self.next_ssa;
        if !result_types.is_empty() {
            self.next_ssa += 1;
        }
        let block = *self.open_blocks.last().unwrap();
        let results: Vec<Value> = match result_types.len() {
            1 => vec![self.new_value(result_types[0].clone(), format!("%{id}"), block)],
            _ => result_types
                .iter()
                .enumerate()
                .map(|(i, t)| self.new_value(t.clone(), format!("%{id}#{i}"), block))
                .collect(),
        };
        let mut line = match result_types.len() {
            0 => String::new(),
            1 => format!("%{id} = "),
            n => format!("%{id}:{n} = "),
        };
        line.push_str(&format!("\"{op}\"({})", self.names(operands)));
        if !regions.is_empty() {
            line.push_str(&format!(" ({})", regions.join(", ")));
        }
        if !attrs.is_empty() {
            line.push_str(&format!(" {{{attrs}}}"));
        }
        let ins = self.types_of(operands);
        let outs = match result_types {
            [t] => t.to_string(),
            ts => format!("({})", join_types(ts)),
        };
        line.push_str(&format!(" : ({ins}) -> {outs}"));
        self.push_line(&line);
        results
    }

    /// [`Builder::emit`] for single-result ops.
    pub(crate) fn emit1(&mut self, op: &str, operands: &[Value], regions: &[String], attrs: &str, ty: TensorType) -> Value {
        self.emit(op, operands, regions, attrs, &[ty])[0]
    }

    fn push_line(&mut self, line: &str) {
        let indent = self.indent();
        let buf = self.bufs.last_mut().unwrap();
        buf.push_str(&indent);
        buf.push_str(line);
        buf.push('\n');
    }

    /// Ops of @main sit at 4 spaces (inside module and func); each region adds 2.
    fn indent(&self) -> String {
        " ".repeat(2 * (self.bufs.len() + 1))
    }

    pub(crate) fn names(&self, vs: &[Value]) -> String {
        vs.iter().map(|&v| self.info(v).name.as_str()).collect::<Vec<_>>().join(", ")
    }

    pub(crate) fn types_of(&self, vs: &[Value]) -> String {
        vs.iter().map(|&v| self.info(v).ty.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Builds a one-block region: opens a block with arguments of `arg_types`,
    /// runs `body` (which may create ops, including nested regions), ends the
    /// block with `stablehlo.return` of what `body` returned, and returns the
    /// region text plus the returned types. The block arguments and anything
    /// made inside are unusable once this returns.
    pub(crate) fn region(
        &mut self,
        op: &str,
        arg_types: &[TensorType],
        body: impl FnOnce(&mut Builder, &[Value]) -> Vec<Value>,
    ) -> (String, Vec<TensorType>) {
        let args = self.open_region(arg_types);
        let rets = body(self, &args);
        assert!(!rets.is_empty() || op == "stablehlo.while", "{op}: region returned no values");
        self.close_region(&rets)
    }

    /// Opens a one-block region with arguments of `arg_types` and returns them: ops made from
    /// here on go into the region until [`Builder::close_region`]. For callers whose region
    /// body needs more than the builder (a lowering context wrapping it); values of enclosing
    /// blocks stay usable inside (implicit capture).
    pub fn open_region(&mut self, arg_types: &[TensorType]) -> Vec<Value> {
        let block = self.next_block;
        self.next_block += 1;
        self.open_blocks.push(block);
        self.bufs.push(String::new());
        let args: Vec<Value> = arg_types
            .iter()
            .map(|t| {
                let id = self.next_ssa;
                self.next_ssa += 1;
                self.new_value(t.clone(), format!("%{id}"), block)
            })
            .collect();
        self.open_args.push(args.clone());
        args
    }

    /// Ends the innermost open region with `stablehlo.return` of `rets`; returns the region
    /// text (for [`Builder::case`], [`Builder::while_regions`]) and the returned types.
    pub fn close_region(&mut self, rets: &[Value]) -> (String, Vec<TensorType>) {
        assert!(self.open_blocks.len() > 1, "close_region() without an open region");
        self.emit("stablehlo.return", rets, &[], "", &[]);
        let ret_types = rets.iter().map(|&v| self.ty(v).clone()).collect();
        self.open_blocks.pop();
        let text = self.bufs.pop().unwrap();
        let label_indent = self.indent();
        let args: Vec<String> =
            self.open_args.pop().unwrap().iter().map(|&a| format!("{}: {}", self.info(a).name, self.info(a).ty)).collect();
        let label = if args.is_empty() { "^bb0".to_string() } else { format!("^bb0({})", args.join(", ")) };
        (format!("{{\n{label_indent}{label}:\n{text}{label_indent}}}"), ret_types)
    }

    /// Region whose block arguments and results are all 0-d tensors; checks the
    /// results against `expect` (used by reduce-like ops).
    pub(crate) fn scalar_region(
        &mut self,
        op: &str,
        arg_types: &[TensorType],
        expect: &[TensorType],
        body: impl FnOnce(&mut Builder, &[Value]) -> Vec<Value>,
    ) -> String {
        let (text, got) = self.region(op, arg_types, body);
        assert_eq!(
            got,
            expect,
            "{op}: region must return {} but returned {}",
            join_types(expect),
            join_types(&got)
        );
        text
    }

    /// The whole module text with `func.func public @main` returning `results`.
    pub fn finish(self, results: &[Value]) -> String {
        self.finish_with_aliases(results, &[])
    }

    /// Like [`Builder::finish`], and marks param `p` as donated into result `r`
    /// for each `(p, r)` with the argument attribute `tf.aliasing_output = r : i32`
    /// (the form XLA's MLIR importer turns into input/output aliasing).
    pub fn finish_with_aliases(self, results: &[Value], aliases: &[(usize, usize)]) -> String {
        assert_eq!(self.open_blocks.len(), 1, "finish() called inside a region");
        for &v in results {
            self.check("func.return", v);
        }
        for &(p, r) in aliases {
            assert!(p < self.params.len(), "alias: no param {p}");
            assert!(r < results.len(), "alias: no result {r}");
            assert_eq!(
                self.ty(self.params[p]),
                self.ty(results[r]),
                "alias: param {p} and result {r} have different types"
            );
            assert_eq!(aliases.iter().filter(|a| a.0 == p).count(), 1, "alias: param {p} donated twice");
        }
        let args: Vec<String> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let info = self.info(p);
                match aliases.iter().find(|a| a.0 == i) {
                    Some(&(_, r)) => format!("{}: {} {{tf.aliasing_output = {r} : i32}}", info.name, info.ty),
                    None => format!("{}: {}", info.name, info.ty),
                }
            })
            .collect();
        let result_types: Vec<TensorType> = results.iter().map(|&v| self.ty(v).clone()).collect();
        let mut out = format!("module @{} {{\n", self.module_name);
        out.push_str(&format!(
            "  func.func public @main({}) -> ({}) {{\n",
            args.join(", "),
            join_types(&result_types)
        ));
        out.push_str(&self.bufs[0]);
        out.push_str(&format!(
            "    \"func.return\"({}) : ({}) -> ()\n",
            self.names(results),
            join_types(&result_types)
        ));
        out.push_str("  }\n");
        for (_, text) in &self.functions {
            out.push_str(text);
            out.push('\n');
        }
        out.push_str("}\n");
        out
    }
}

pub(crate) fn join_types(ts: &[TensorType]) -> String {
    ts.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

// ---- attribute text helpers ----

/// `array<i64: 0, 1>` (dense i64 array attribute); `array<i64>` when empty.
pub(crate) fn i64_array(xs: &[i64]) -> String {
    if xs.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {}>", list(xs))
    }
}

/// `0, 1, 2`
pub(crate) fn list(xs: &[i64]) -> String {
    xs.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
}

/// `[0, 1]`, the dimension lists inside #stablehlo.dot/gather/scatter/conv.
pub(crate) fn bracket(xs: &[i64]) -> String {
    format!("[{}]", list(xs))
}

/// `dense<[[lo, hi], ...]> : tensor<Nx2xi64>`, the padding of reduce_window/convolution.
pub(crate) fn padding_attr(padding: &[(i64, i64)]) -> String {
    if padding.is_empty() {
        return "dense<> : tensor<0x2xi64>".to_string();
    }
    let rows: Vec<String> = padding.iter().map(|(l, h)| format!("[{l}, {h}]")).collect();
    format!("dense<[{}]> : tensor<{}x2xi64>", rows.join(", "), padding.len())
}
