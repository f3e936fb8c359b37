//! Contractions and reductions: dot_general, convolution, reduce,
//! reduce_window, select_and_scatter, sort.

use crate::builder::{bracket, i64_array, padding_attr, Builder};
use crate::types::{ConvDims, ElemType, TensorType};
use crate::Value;

/// Number of windows along one dim, per the spec of reduce_window/convolution:
/// the input is dilated then padded, the window dilated, then strided.
fn windows(input: i64, window: i64, stride: i64, base_dil: i64, win_dil: i64, pad: (i64, i64)) -> i64 {
    let dilated_in = if input == 0 { 0 } else { (input - 1) * base_dil + 1 };
    let padded = pad.0 + dilated_in + pad.1;
    let dilated_win = if window == 0 { 0 } else { (window - 1) * win_dil + 1 };
    if padded <= 0 || dilated_win > padded {
        0
    } else {
        (padded - dilated_win) / stride + 1
    }
}

/// `xs`, or `n` copies of `fill` when `xs` is empty (the "default" for optional attributes).
fn or_fill(xs: &[i64], n: usize, fill: i64, what: &str) -> Vec<i64> {
    if xs.is_empty() {
        vec![fill; n]
    } else {
        assert_eq!(xs.len(), n, "{what}: expected {n} entries, got {xs:?}");
        xs.to_vec()
    }
}

fn all_distinct_in_range(dims: &[i64], rank: usize) -> bool {
    dims.iter().enumerate().all(|(i, &d)| d >= 0 && (d as usize) < rank && !dims[..i].contains(&d))
}

impl Builder {
    fn precision_attr(&self) -> String {
        match self.precision {
            Some(p) => format!(
                ", precision_config = [#stablehlo<precision {0}>, #stablehlo<precision {0}>]",
                p.mlir_name()
            ),
            None => String::new(),
        }
    }

    /// General contraction. Result dims: batch dims, then lhs free dims, then
    /// rhs free dims (each in operand order); element type `out_elem`.
    #[allow(clippy::too_many_arguments)]
    pub fn dot_general(
        &mut self,
        lhs: Value,
        rhs: Value,
        lhs_batch: &[i64],
        rhs_batch: &[i64],
        lhs_contract: &[i64],
        rhs_contract: &[i64],
        out_elem: ElemType,
    ) -> Value {
        let (lt, rt) = (self.ty(lhs).clone(), self.ty(rhs).clone());
        let op = "stablehlo.dot_general";
        assert!(
            lhs_batch.len() == rhs_batch.len() && lhs_contract.len() == rhs_contract.len(),
            "{op}: batch/contracting dim lists of lhs and rhs must pair up"
        );
        let lhs_used: Vec<i64> = lhs_batch.iter().chain(lhs_contract).copied().collect();
        let rhs_used: Vec<i64> = rhs_batch.iter().chain(rhs_contract).copied().collect();
        assert!(
            all_distinct_in_range(&lhs_used, lt.rank()) && all_distinct_in_range(&rhs_used, rt.rank()),
            "{op}: bad dims for {lt} x {rt}"
        );
        for (l, r) in lhs_used.iter().zip(&rhs_used) {
            assert_eq!(
                lt.dims[*l as usize], rt.dims[*r as usize],
                "{op}: lhs dim {l} of {lt} and rhs dim {r} of {rt} differ"
            );
        }
        let mut dims: Vec<i64> = lhs_batch.iter().map(|&d| lt.dims[d as usize]).collect();
        dims.extend((0..lt.rank() as i64).filter(|d| !lhs_used.contains(d)).map(|d| lt.dims[d as usize]));
        dims.extend((0..rt.rank() as i64).filter(|d| !rhs_used.contains(d)).map(|d| rt.dims[d as usize]));
        let attrs = format!(
            "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, \
             lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>{}",
            bracket(lhs_batch),
            bracket(rhs_batch),
            bracket(lhs_contract),
            bracket(rhs_contract),
            self.precision_attr()
        );
        self.emit1(op, &[lhs, rhs], &[], &attrs, TensorType::new(out_elem, &dims))
    }

    /// `chlo.ragged_dot` without batch dims: lhs dim `lhs_ragged` is split into consecutive
    /// groups of `group_sizes` (i32 [G]). With `rhs_group` (ragged non-contracting: lhs [M, K],
    /// rhs [G, K, N]) each row is multiplied by its group's rhs: [M, N]. Without it (ragged
    /// contracting: lhs [M, K] grouped along K, rhs [K, N]) each group gives one product: [G, M, N].
    #[allow(clippy::too_many_arguments)]
    pub fn ragged_dot(
        &mut self,
        lhs: Value,
        rhs: Value,
        group_sizes: Value,
        lhs_contract: i64,
        rhs_contract: i64,
        lhs_ragged: i64,
        rhs_group: Option<i64>,
        out_elem: ElemType,
    ) -> Value {
        let (lt, rt, gt) = (self.ty(lhs).clone(), self.ty(rhs).clone(), self.ty(group_sizes).clone());
        assert!(gt.rank() == 1, "chlo.ragged_dot: group sizes must be 1-d, got {gt}");
        let groups = gt.dims[0];
        let free = |t: &TensorType, used: &[i64]| -> Vec<i64> {
            (0..t.rank() as i64).filter(|d| !used.contains(d)).map(|d| t.dims[d as usize]).collect()
        };
        let mut dims = Vec::new();
        if rhs_group.is_none() {
            dims.push(groups);
        }
        dims.extend(free(&lt, &[lhs_contract]));
        let rhs_used: Vec<i64> = std::iter::once(rhs_contract).chain(rhs_group).collect();
        dims.extend(free(&rt, &rhs_used));
        // Same precision as dot_general's (GPUs take f32 products as TF32 by default).
        let precision = self.precision.map_or("DEFAULT", |p| p.mlir_name());
        let attrs = format!(
            "precision_config = [#chlo<precision {precision}>, #chlo<precision {precision}>], \
             ragged_dot_dimension_numbers = #chlo.ragged_dot<lhs_batching_dimensions = [], \
             rhs_batching_dimensions = [], lhs_contracting_dimensions = [{lhs_contract}], \
             rhs_contracting_dimensions = [{rhs_contract}], lhs_ragged_dimensions = [{lhs_ragged}], \
             rhs_group_dimensions = {}>",
            bracket(rhs_group.as_slice())
        );
        self.emit1("chlo.ragged_dot", &[lhs, rhs, group_sizes], &[], &attrs, TensorType::new(out_elem, &dims))
    }

    /// Convolution (cross-correlation, like PyTorch). Empty `window_strides`,
    /// `padding`, `lhs_dilation`, `rhs_dilation` mean 1s / no padding.
    #[allow(clippy::too_many_arguments)]
    pub fn convolution(
        &mut self,
        lhs: Value,
        rhs: Value,
        window_strides: &[i64],
        padding: &[(i64, i64)],
        lhs_dilation: &[i64],
        rhs_dilation: &[i64],
        dn: &ConvDims,
        feature_group_count: i64,
        batch_group_count: i64,
        out_elem: ElemType,
    ) -> Value {
        let op = "stablehlo.convolution";
        let (lt, rt) = (self.ty(lhs).clone(), self.ty(rhs).clone());
        let n = dn.input_spatial_dimensions.len();
        assert!(
            lt.rank() == n + 2
                && rt.rank() == n + 2
                && dn.kernel_spatial_dimensions.len() == n
                && dn.output_spatial_dimensions.len() == n,
            "{op}: {lt} and {rt} do not match {n} spatial dims"
        );
        let strides = or_fill(window_strides, n, 1, "convolution window_strides");
        let lhs_dil = or_fill(lhs_dilation, n, 1, "convolution lhs_dilation");
        let rhs_dil = or_fill(rhs_dilation, n, 1, "convolution rhs_dilation");
        let pad: Vec<(i64, i64)> = if padding.is_empty() { vec![(0, 0); n] } else { padding.to_vec() };
        assert_eq!(pad.len(), n, "{op}: need one padding pair per spatial dim");

        let in_features = lt.dims[dn.input_feature_dimension as usize];
        let k_in = rt.dims[dn.kernel_input_feature_dimension as usize];
        let k_out = rt.dims[dn.kernel_output_feature_dimension as usize];
        let batch = lt.dims[dn.input_batch_dimension as usize];
        assert!(feature_group_count >= 1 && batch_group_count >= 1, "{op}: group counts must be >= 1");
        assert_eq!(
            in_features,
            k_in * feature_group_count,
            "{op}: input features {in_features} != kernel input features {k_in} x feature_group_count {feature_group_count}"
        );
        assert!(
            k_out % feature_group_count == 0 && k_out % batch_group_count == 0 && batch % batch_group_count == 0,
            "{op}: group counts do not divide the kernel output features / batch"
        );

        let mut dims = vec![0; n + 2];
        dims[dn.output_batch_dimension as usize] = batch / batch_group_count;
        dims[dn.output_feature_dimension as usize] = k_out;
        for i in 0..n {
            let input = lt.dims[dn.input_spatial_dimensions[i] as usize];
            let window = rt.dims[dn.kernel_spatial_dimensions[i] as usize];
            dims[dn.output_spatial_dimensions[i] as usize] =
                windows(input, window, strides[i], lhs_dil[i], rhs_dil[i], pad[i]);
        }
        let padding_text = if n == 0 { String::new() } else { format!("padding = {}, ", padding_attr(&pad)) };
        let attrs = format!(
            "window_strides = {}, {padding_text}lhs_dilation = {}, rhs_dilation = {}, \
             dimension_numbers = #stablehlo.conv<raw input_batch_dimension = {}, input_feature_dimension = {}, \
             input_spatial_dimensions = {}, kernel_input_feature_dimension = {}, kernel_output_feature_dimension = {}, \
             kernel_spatial_dimensions = {}, output_batch_dimension = {}, output_feature_dimension = {}, \
             output_spatial_dimensions = {}>, feature_group_count = {feature_group_count} : i64, \
             batch_group_count = {batch_group_count} : i64{}",
            i64_array(&strides),
            i64_array(&lhs_dil),
            i64_array(&rhs_dil),
            dn.input_batch_dimension,
            dn.input_feature_dimension,
            bracket(&dn.input_spatial_dimensions),
            dn.kernel_input_feature_dimension,
            dn.kernel_output_feature_dimension,
            bracket(&dn.kernel_spatial_dimensions),
            dn.output_batch_dimension,
            dn.output_feature_dimension,
            bracket(&dn.output_spatial_dimensions),
            self.precision_attr()
        );
        self.emit1(op, &[lhs, rhs], &[], &attrs, TensorType::new(out_elem, &dims))
    }

    /// Checks variadic reduce-like inputs: same dims, 0-d inits; returns the
    /// 0-d init types (the region's accumulator types).
    fn reduce_inputs(&self, op: &str, inputs: &[Value], inits: &[Value]) -> Vec<TensorType> {
        assert!(
            !inputs.is_empty() && inputs.len() == inits.len(),
            "{op}: need as many init values as inputs (and at least one)"
        );
        let dims = self.dims(inputs[0]);
        for &v in inputs {
            assert_eq!(self.dims(v), dims, "{op}: inputs {} differ in dims", self.types_of(inputs));
        }
        inits
            .iter()
            .map(|&i| {
                let t = self.ty(i);
                assert!(t.dims.is_empty(), "{op}: init value must be 0-d, got {t}");
                t.clone()
            })
            .collect()
    }

    /// Reduces `dims` away. `body` gets 2N 0-d block args (acc_0..acc_N-1,
    /// x_0..x_N-1) and returns N 0-d values of the init types.
    pub fn reduce(
        &mut self,
        inputs: &[Value],
        inits: &[Value],
        dims: &[i64],
        body: impl FnOnce(&mut Builder, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let op = "stablehlo.reduce";
        let acc = self.reduce_inputs(op, inputs, inits);
        let in_dims = self.dims(inputs[0]).to_vec();
        assert!(all_distinct_in_range(dims, in_dims.len()), "{op}: bad dims {dims:?} for {in_dims:?}");
        let out_dims: Vec<i64> = (0..in_dims.len() as i64)
            .filter(|d| !dims.contains(d))
            .map(|d| in_dims[d as usize])
            .collect();
        let args: Vec<TensorType> = acc.iter().chain(&acc).cloned().collect();
        let region = self.scalar_region(op, &args, &acc, body);
        let results: Vec<TensorType> = acc.iter().map(|t| TensorType::new(t.elem, &out_dims)).collect();
        let operands: Vec<Value> = inputs.iter().chain(inits).copied().collect();
        let attrs = format!("dimensions = {}", i64_array(dims));
        self.emit(op, &operands, &[region], &attrs, &results)
    }

    /// Windowed reduction (pooling). Empty strides/dilations/padding mean 1s / none.
    /// `body` is as for [`Builder::reduce`].
    #[allow(clippy::too_many_arguments)]
    pub fn reduce_window(
        &mut self,
        inputs: &[Value],
        inits: &[Value],
        window_dims: &[i64],
        window_strides: &[i64],
        base_dilations: &[i64],
        window_dilations: &[i64],
        padding: &[(i64, i64)],
        body: impl FnOnce(&mut Builder, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let op = "stablehlo.reduce_window";
        let acc = self.reduce_inputs(op, inputs, inits);
        let in_dims = self.dims(inputs[0]).to_vec();
        let r = in_dims.len();
        assert_eq!(window_dims.len(), r, "{op}: need one window dim per input dim of {in_dims:?}");
        let strides = or_fill(window_strides, r, 1, "reduce_window window_strides");
        let base_dil = or_fill(base_dilations, r, 1, "reduce_window base_dilations");
        let win_dil = or_fill(window_dilations, r, 1, "reduce_window window_dilations");
        let pad: Vec<(i64, i64)> = if padding.is_empty() { vec![(0, 0); r] } else { padding.to_vec() };
        assert_eq!(pad.len(), r, "{op}: need one padding pair per input dim");
        let out_dims: Vec<i64> =
            (0..r).map(|i| windows(in_dims[i], window_dims[i], strides[i], base_dil[i], win_dil[i], pad[i])).collect();

        let args: Vec<TensorType> = acc.iter().chain(&acc).cloned().collect();
        let region = self.scalar_region(op, &args, &acc, body);
        let results: Vec<TensorType> = acc.iter().map(|t| TensorType::new(t.elem, &out_dims)).collect();
        let operands: Vec<Value> = inputs.iter().chain(inits).copied().collect();
        let padding_text = if r == 0 { String::new() } else { format!(", padding = {}", padding_attr(&pad)) };
        let attrs = format!(
            "window_dimensions = {}, window_strides = {}, base_dilations = {}, window_dilations = {}{padding_text}",
            i64_array(window_dims),
            i64_array(&strides),
            i64_array(&base_dil),
            i64_array(&win_dil),
        );
        self.emit(op, &operands, &[region], &attrs, &results)
    }

    /// For each window of `operand`, `select(a, b) -> i1` picks one element
    /// (true keeps `a`); the matching `source` element is combined into a
    /// tensor initialised to `init` with `scatter(acc, x)`. This is the
    /// gradient of max pooling. `source` must have the pooled dims.
    #[allow(clippy::too_many_arguments)]
    pub fn select_and_scatter(
        &mut self,
        operand: Value,
        source: Value,
        init: Value,
        window_dims: &[i64],
        window_strides: &[i64],
        padding: &[(i64, i64)],
        select: impl FnOnce(&mut Builder, Value, Value) -> Value,
        scatter: impl FnOnce(&mut Builder, Value, Value) -> Value,
    ) -> Value {
        let op = "stablehlo.select_and_scatter";
        let (ot, st, it) = (self.ty(operand).clone(), self.ty(source).clone(), self.ty(init).clone());
        let r = ot.rank();
        assert!(it.dims.is_empty() && it.elem == st.elem, "{op}: init must be 0-d of the source element type, got {it}");
        assert_eq!(window_dims.len(), r, "{op}: need one window dim per operand dim of {ot}");
        let strides = or_fill(window_strides, r, 1, "select_and_scatter window_strides");
        let pad: Vec<(i64, i64)> = if padding.is_empty() { vec![(0, 0); r] } else { padding.to_vec() };
        assert_eq!(pad.len(), r, "{op}: need one padding pair per operand dim");
        let pooled: Vec<i64> = (0..r).map(|i| windows(ot.dims[i], window_dims[i], strides[i], 1, 1, pad[i])).collect();
        assert_eq!(st.dims, pooled, "{op}: source {st} must have the pooled dims {pooled:?}");

        let os = TensorType::scalar(ot.elem);
        let ss = TensorType::scalar(st.elem);
        let pred = TensorType::scalar(ElemType::Pred);
        let sel = self.scalar_region(op, &[os.clone(), os], &[pred], |b, a| vec![select(b, a[0], a[1])]);
        let sct = self.scalar_region(op, &[ss.clone(), ss.clone()], &[ss], |b, a| vec![scatter(b, a[0], a[1])]);
        let padding_text = if r == 0 { String::new() } else { format!(", padding = {}", padding_attr(&pad)) };
        let attrs = format!(
            "window_dimensions = {}, window_strides = {}{padding_text}",
            i64_array(window_dims),
            i64_array(&strides)
        );
        self.emit1(op, &[operand, source, init], &[sel, sct], &attrs, ot.with_elem(st.elem))
    }

    /// Sorts `inputs` (same dims) together along `dim`. `comparator` gets 2N
    /// 0-d args paired per input (lhs_0, rhs_0, lhs_1, rhs_1, ...) and returns
    /// an i1 "lhs goes first".
    pub fn sort(
        &mut self,
        inputs: &[Value],
        dim: i64,
        is_stable: bool,
        comparator: impl FnOnce(&mut Builder, &[Value]) -> Value,
    ) -> Vec<Value> {
        let op = "stablehlo.sort";
        assert!(!inputs.is_empty(), "{op}: no inputs");
        let dims = self.dims(inputs[0]).to_vec();
        for &v in inputs {
            assert_eq!(self.dims(v), dims, "{op}: inputs {} differ in dims", self.types_of(inputs));
        }
        assert!(dim >= 0 && (dim as usize) < dims.len(), "{op}: dim {dim} out of range for {dims:?}");
        let mut args = Vec::new();
        for &v in inputs {
            let s = TensorType::scalar(self.elem(v));
            args.push(s.clone());
            args.push(s);
        }
        let pred = TensorType::scalar(ElemType::Pred);
        let region = self.scalar_region(op, &args, &[pred], |b, a| vec![comparator(b, a)]);
        let results: Vec<TensorType> = inputs.iter().map(|&v| self.ty(v).clone()).collect();
        let attrs = format!("dimension = {dim} : i64, is_stable = {is_stable}");
        self.emit(op, inputs, &[region], &attrs, &results)
    }

    /// Escape hatch: prints `"name"(operands) {attrs} : (...) -> (...)` with the
    /// given result types. `attrs` is the inside of the attribute dictionary
    /// (e.g. `call_target_name = "foo"` for stablehlo.custom_call), may be empty.
    pub fn custom_op(&mut self, name: &str, operands: &[Value], attrs: &str, result_types: &[TensorType]) -> Vec<Value> {
        assert!(
            name.contains('.') && !name.contains('"'),
            "custom_op: {name:?} should be a dialect-qualified op name"
        );
        self.emit(name, operands, &[], attrs, result_types)
    }
}

#[cfg(test)]
mod tests {
    use super::windows;

    #[test]
    fn window_counts() {
        assert_eq!(windows(5, 3, 1, 1, 1, (0, 0)), 3);
        assert_eq!(windows(5, 3, 2, 1, 1, (1, 1)), 3);
        assert_eq!(windows(4, 2, 2, 1, 1, (0, 0)), 2);
        assert_eq!(windows(5, 3, 1, 1, 2, (0, 0)), 1); // dilated window covers 5
        assert_eq!(windows(3, 2, 1, 2, 1, (0, 0)), 4); // dilated input has 5 positions
        assert_eq!(windows(2, 3, 1, 1, 1, (0, 0)), 0);
    }
}
