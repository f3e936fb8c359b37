//! Random bits, control flow and collectives.

use crate::builder::{join_types, Builder};
use crate::types::{ElemType, RngAlgorithm, TensorType};
use crate::Value;

impl Builder {
    /// Returns (new state, random bits of type `out`). THREE_FRY takes a
    /// `tensor<2xui64>` state, PHILOX `tensor<2xui64>` or `tensor<3xui64>`.
    pub fn rng_bit_generator(&mut self, algorithm: RngAlgorithm, state: Value, out: &TensorType) -> (Value, Value) {
        let op = "stablehlo.rng_bit_generator";
        let st = self.ty(state).clone();
        assert!(
            st.rank() == 1 && (st.elem.is_int()),
            "{op}: state must be a 1-d integer tensor, got {st}"
        );
        assert!(out.elem.is_int(), "{op}: output must have an integer element type, got {out}");
        let attrs = format!("rng_algorithm = #stablehlo<rng_algorithm {}>", algorithm.mlir_name());
        let r = self.emit(op, &[state], &[], &attrs, &[st, out.clone()]);
        (r[0], r[1])
    }

    /// `while cond(vals) { vals = body(vals) }`. Both closures get the loop
    /// values as block arguments (full tensors, not 0-d); `cond` returns a 0-d
    /// i1 and `body` the next values with unchanged types.
    pub fn while_loop(
        &mut self,
        inits: &[Value],
        cond: impl FnOnce(&mut Builder, &[Value]) -> Value,
        body: impl FnOnce(&mut Builder, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let op = "stablehlo.while";
        let types: Vec<TensorType> = inits.iter().map(|&v| self.ty(v).clone()).collect();
        let pred = vec![TensorType::scalar(ElemType::Pred)];
        let (cond_text, got) = self.region(op, &types, |b, a| vec![cond(b, a)]);
        assert_eq!(got, pred, "{op}: condition must return tensor<i1>, got {}", join_types(&got));
        let (body_text, got) = self.region(op, &types, body);
        assert_eq!(
            got,
            types,
            "{op}: body must return {} but returned {}",
            join_types(&types),
            join_types(&got)
        );
        self.emit(op, inits, &[cond_text, body_text], "", &types)
    }

    /// `stablehlo.case`: runs the branch `index` (an i32 0-d value; out of range means the
    /// last branch) and returns its results. `branches` are region texts from
    /// [`Builder::close_region`] of regions without arguments, each returning `types`.
    pub fn case(&mut self, index: Value, branches: &[String], types: &[TensorType]) -> Vec<Value> {
        let op = "stablehlo.case";
        assert_eq!(self.ty(index), &TensorType::scalar(ElemType::I32), "{op}: the index must be tensor<i32>");
        assert!(!branches.is_empty(), "{op}: no branches");
        self.emit(op, &[index], branches, "", types)
    }

    /// `stablehlo.while` from region texts made with [`Builder::open_region`] /
    /// [`Builder::close_region`]: `cond` takes the loop values and returns tensor<i1>, `body`
    /// takes and returns the loop values (the caller checks the types when it closes them).
    pub fn while_regions(&mut self, inits: &[Value], cond: String, body: String) -> Vec<Value> {
        let types: Vec<TensorType> = inits.iter().map(|&v| self.ty(v).clone()).collect();
        self.emit("stablehlo.while", inits, &[cond, body], "", &types)
    }

    /// Sum (or other `body(acc, x)`) across replicas. `replica_groups` must be
    /// rectangular; `channel_id` adds a channel handle (needed for cross-partition use).
    pub fn all_reduce(
        &mut self,
        v: Value,
        replica_groups: &[Vec<i64>],
        channel_id: Option<i64>,
        body: impl FnOnce(&mut Builder, Value, Value) -> Value,
    ) -> Value {
        let op = "stablehlo.all_reduce";
        let t = self.ty(v).clone();
        let s = TensorType::scalar(t.elem);
        let region = self.scalar_region(op, &[s.clone(), s.clone()], &[s], |b, a| vec![body(b, a[0], a[1])]);
        let width = replica_groups.first().map_or(0, |g| g.len());
        assert!(
            replica_groups.iter().all(|g| g.len() == width),
            "{op}: replica groups must all have the same size, got {replica_groups:?}"
        );
        let groups = if width == 0 {
            format!("dense<> : tensor<{}x0xi64>", replica_groups.len())
        } else {
            let rows: Vec<String> = replica_groups.iter().map(|g| crate::builder::bracket(g)).collect();
            format!("dense<[{}]> : tensor<{}x{width}xi64>", rows.join(", "), replica_groups.len())
        };
        let mut attrs = format!("replica_groups = {groups}");
        if let Some(id) = channel_id {
            // type 1 = DEVICE_TO_DEVICE
            attrs.push_str(&format!(", channel_handle = #stablehlo.channel_handle<handle = {id}, type = 1>"));
        }
        self.emit1(op, &[v], &[region], &attrs, t)
    }
}
