//! Shape and data-movement ops: broadcast, reshape, transpose, slicing,
//! concatenate, pad, iota, reverse, gather, scatter.

use crate::builder::{bracket, i64_array, Builder};
use crate::types::{GatherDims, ScatterDims, TensorType};
use crate::Value;

fn is_permutation(perm: &[i64], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank
        && perm.iter().all(|&p| {
            let ok = p >= 0 && (p as usize) < rank && !seen[p as usize];
            if ok {
                seen[p as usize] = true;
            }
            ok
        })
}

impl Builder {
    fn index_scalars(&self, op: &str, idx: &[Value]) {
        for &i in idx {
            let t = self.ty(i);
            assert!(t.dims.is_empty() && t.elem.is_int(), "{op}: start index must be a 0-d integer, got {t}");
        }
    }

    /// Broadcast: operand dim i maps to result dim `broadcast_dimensions[i]`
    /// and must be 1 or equal to it.
    pub fn broadcast_in_dim(&mut self, v: Value, out_dims: &[i64], broadcast_dimensions: &[i64]) -> Value {
        let t = self.ty(v).clone();
        assert_eq!(
            broadcast_dimensions.len(),
            t.rank(),
            "stablehlo.broadcast_in_dim: need one broadcast dimension per operand dim of {t}"
        );
        for (i, &d) in broadcast_dimensions.iter().enumerate() {
            assert!(
                d >= 0 && (d as usize) < out_dims.len() && (t.dims[i] == 1 || t.dims[i] == out_dims[d as usize]),
                "stablehlo.broadcast_in_dim: {t} cannot broadcast to {out_dims:?} with dims {broadcast_dimensions:?}"
            );
        }
        let attrs = format!("broadcast_dimensions = {}", i64_array(broadcast_dimensions));
        self.emit1("stablehlo.broadcast_in_dim", &[v], &[], &attrs, TensorType::new(t.elem, out_dims))
    }

    /// NumPy-style broadcast (dims aligned on the right); returns `v` if the dims already match.
    pub fn broadcast_to(&mut self, v: Value, out_dims: &[i64]) -> Value {
        let dims = self.dims(v).to_vec();
        if dims == out_dims {
            return v;
        }
        assert!(dims.len() <= out_dims.len(), "broadcast_to: {dims:?} has more dims than {out_dims:?}");
        let offset = (out_dims.len() - dims.len()) as i64;
        let bdims: Vec<i64> = (0..dims.len() as i64).map(|i| i + offset).collect();
        self.broadcast_in_dim(v, out_dims, &bdims)
    }

    /// Reshape (row-major); returns `v` if the dims already match.
    pub fn reshape(&mut self, v: Value, dims: &[i64]) -> Value {
        let t = self.ty(v).clone();
        if t.dims == dims {
            return v;
        }
        let out = TensorType::new(t.elem, dims);
        assert_eq!(t.num_elements(), out.num_elements(), "stablehlo.reshape: {t} -> {out} changes the element count");
        self.emit1("stablehlo.reshape", &[v], &[], "", out)
    }

    /// Result dim i is operand dim `perm[i]`; returns `v` for the identity.
    pub fn transpose(&mut self, v: Value, perm: &[i64]) -> Value {
        let t = self.ty(v).clone();
        assert!(is_permutation(perm, t.rank()), "stablehlo.transpose: {perm:?} is not a permutation for {t}");
        if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
            return v;
        }
        let dims: Vec<i64> = perm.iter().map(|&p| t.dims[p as usize]).collect();
        let attrs = format!("permutation = {}", i64_array(perm));
        let out = self.emit1("stablehlo.transpose", &[v], &[], &attrs, TensorType::new(t.elem, &dims));
        self.transposes.insert(out, (v, perm.to_vec()));
        out
    }

    /// Static slice; result dim = ceil((limit - start) / stride).
    pub fn slice(&mut self, v: Value, start: &[i64], limit: &[i64], strides: &[i64]) -> Value {
        let t = self.ty(v).clone();
        assert!(
            start.len() == t.rank() && limit.len() == t.rank() && strides.len() == t.rank(),
            "stablehlo.slice: start/limit/strides must have one entry per dim of {t}"
        );
        let dims: Vec<i64> = (0..t.rank())
            .map(|i| {
                assert!(
                    0 <= start[i] && start[i] <= limit[i] && limit[i] <= t.dims[i] && strides[i] > 0,
                    "stablehlo.slice: bad bounds {start:?}..{limit:?} step {strides:?} for {t}"
                );
                (limit[i] - start[i] + strides[i] - 1) / strides[i]
            })
            .collect();
        let attrs = format!(
            "start_indices = {}, limit_indices = {}, strides = {}",
            i64_array(start),
            i64_array(limit),
            i64_array(strides)
        );
        self.emit1("stablehlo.slice", &[v], &[], &attrs, TensorType::new(t.elem, &dims))
    }

    /// Slice of static `sizes` at run-time start indices (0-d ints; clamped into range by XLA).
    pub fn dynamic_slice(&mut self, v: Value, start_indices: &[Value], sizes: &[i64]) -> Value {
        let t = self.ty(v).clone();
        assert!(
            start_indices.len() == t.rank() && sizes.len() == t.rank(),
            "stablehlo.dynamic_slice: need one start index and size per dim of {t}"
        );
        assert!(
            sizes.iter().zip(&t.dims).all(|(&s, &d)| 0 <= s && s <= d),
            "stablehlo.dynamic_slice: sizes {sizes:?} exceed {t}"
        );
        self.index_scalars("stablehlo.dynamic_slice", start_indices);
        let mut operands = vec![v];
        operands.extend_from_slice(start_indices);
        let attrs = format!("slice_sizes = {}", i64_array(sizes));
        self.emit1("stablehlo.dynamic_slice", &operands, &[], &attrs, TensorType::new(t.elem, sizes))
    }

    /// Writes `update` into `v` at run-time start indices (0-d ints, clamped by XLA).
    pub fn dynamic_update_slice(&mut self, v: Value, update: Value, start_indices: &[Value]) -> Value {
        let (t, u) = (self.ty(v).clone(), self.ty(update).clone());
        assert!(
            t.elem == u.elem && t.rank() == u.rank() && u.dims.iter().zip(&t.dims).all(|(a, b)| a <= b),
            "stablehlo.dynamic_update_slice: update {u} does not fit in {t}"
        );
        assert_eq!(start_indices.len(), t.rank(), "stablehlo.dynamic_update_slice: need one start index per dim of {t}");
        self.index_scalars("stablehlo.dynamic_update_slice", start_indices);
        let mut operands = vec![v, update];
        operands.extend_from_slice(start_indices);
        self.emit1("stablehlo.dynamic_update_slice", &operands, &[], "", t)
    }

    /// Joins along `dim`; other dims must match. A single input is returned as is.
    pub fn concatenate(&mut self, vs: &[Value], dim: i64) -> Value {
        assert!(!vs.is_empty(), "stablehlo.concatenate: no inputs");
        if vs.len() == 1 {
            return vs[0];
        }
        let first = self.ty(vs[0]).clone();
        let d = dim as usize;
        assert!(dim >= 0 && d < first.rank(), "stablehlo.concatenate: dim {dim} out of range for {first}");
        let mut dims = first.dims.clone();
        dims[d] = 0;
        for &v in vs {
            let t = self.ty(v);
            let compatible = t.elem == first.elem
                && t.rank() == first.rank()
                && (0..t.rank()).all(|i| i == d || t.dims[i] == first.dims[i]);
            assert!(compatible, "stablehlo.concatenate: {t} does not match {first} outside dim {dim}");
            dims[d] += t.dims[d];
        }
        let attrs = format!("dimension = {dim} : i64");
        self.emit1("stablehlo.concatenate", vs, &[], &attrs, TensorType::new(first.elem, &dims))
    }

    /// Pads with the 0-d `pad_value`; negative low/high crop. Result dim =
    /// low + high + d + (d - 1) * interior.
    pub fn pad(&mut self, v: Value, pad_value: Value, low: &[i64], high: &[i64], interior: &[i64]) -> Value {
        let t = self.ty(v).clone();
        let pv = self.ty(pad_value);
        assert!(
            pv.dims.is_empty() && pv.elem == t.elem,
            "stablehlo.pad: pad value must be 0-d {}, got {pv}",
            t.elem
        );
        assert!(
            low.len() == t.rank() && high.len() == t.rank() && interior.len() == t.rank(),
            "stablehlo.pad: low/high/interior need one entry per dim of {t}"
        );
        let dims: Vec<i64> = (0..t.rank())
            .map(|i| {
                let d = t.dims[i];
                let n = low[i] + high[i] + d + (d - 1).max(0) * interior[i];
                assert!(interior[i] >= 0 && n >= 0, "stablehlo.pad: bad padding for dim {i} of {t}");
                n
            })
            .collect();
        let attrs = format!(
            "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
            i64_array(low),
            i64_array(high),
            i64_array(interior)
        );
        self.emit1("stablehlo.pad", &[v, pad_value], &[], &attrs, TensorType::new(t.elem, &dims))
    }

    /// 0, 1, 2, ... along `dim` of `ty`.
    pub fn iota(&mut self, ty: &TensorType, dim: i64) -> Value {
        assert!(dim >= 0 && (dim as usize) < ty.rank(), "stablehlo.iota: dim {dim} out of range for {ty}");
        let attrs = format!("iota_dimension = {dim} : i64");
        self.emit1("stablehlo.iota", &[], &[], &attrs, ty.clone())
    }

    /// Reverses the order of elements along `dims`.
    pub fn reverse(&mut self, v: Value, dims: &[i64]) -> Value {
        let t = self.ty(v).clone();
        assert!(
            dims.iter().all(|&d| d >= 0 && (d as usize) < t.rank()),
            "stablehlo.reverse: dims {dims:?} out of range for {t}"
        );
        let attrs = format!("dimensions = {}", i64_array(dims));
        self.emit1("stablehlo.reverse", &[v], &[], &attrs, t)
    }

    /// Gather slices of `slice_sizes` from `operand` at `start_indices`; result
    /// shape per the spec: batch dims of the indices interleaved with the
    /// non-collapsed slice dims at `offset_dims`.
    pub fn gather(
        &mut self,
        operand: Value,
        start_indices: Value,
        dn: &GatherDims,
        slice_sizes: &[i64],
        indices_are_sorted: bool,
    ) -> Value {
        let (ot, it) = (self.ty(operand).clone(), self.ty(start_indices).clone());
        assert!(it.elem.is_int(), "stablehlo.gather: indices must be integers, got {it}");
        assert_eq!(slice_sizes.len(), ot.rank(), "stablehlo.gather: need one slice size per dim of {ot}");
        let ivd = dn.index_vector_dim as usize;
        assert!(ivd <= it.rank(), "stablehlo.gather: index_vector_dim {ivd} out of range for {it}");
        let batch: Vec<i64> = (0..it.rank()).filter(|&i| i != ivd).map(|i| it.dims[i]).collect();
        let offsets: Vec<i64> = (0..ot.rank() as i64)
            .filter(|d| !dn.collapsed_slice_dims.contains(d) && !dn.operand_batching_dims.contains(d))
            .map(|d| slice_sizes[d as usize])
            .collect();
        assert_eq!(
            offsets.len(),
            dn.offset_dims.len(),
            "stablehlo.gather: offset_dims {:?} must name every slice dim that is neither collapsed nor batching",
            dn.offset_dims
        );
        let rank = batch.len() + offsets.len();
        let (mut bi, mut oi) = (0, 0);
        let dims: Vec<i64> = (0..rank as i64)
            .map(|i| {
                if dn.offset_dims.contains(&i) {
                    oi += 1;
                    offsets[oi - 1]
                } else {
                    bi += 1;
                    batch[bi - 1]
                }
            })
            .collect();
        let attrs = format!(
            "dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = {}, \
             operand_batching_dims = {}, start_indices_batching_dims = {}, start_index_map = {}, \
             index_vector_dim = {}>, slice_sizes = {}, indices_are_sorted = {indices_are_sorted}",
            bracket(&dn.offset_dims),
            bracket(&dn.collapsed_slice_dims),
            bracket(&dn.operand_batching_dims),
            bracket(&dn.start_indices_batching_dims),
            bracket(&dn.start_index_map),
            dn.index_vector_dim,
            i64_array(slice_sizes)
        );
        self.emit1("stablehlo.gather", &[operand, start_indices], &[], &attrs, TensorType::new(ot.elem, &dims))
    }

    /// Scatter `updates` into `operand` at `indices`, combining with `body(current, update)`
    /// on 0-d values of the operand element type. Result has the operand's type.
    pub fn scatter(
        &mut self,
        operand: Value,
        indices: Value,
        updates: Value,
        dn: &ScatterDims,
        body: impl FnOnce(&mut Builder, Value, Value) -> Value,
    ) -> Value {
        let (ot, it, ut) = (self.ty(operand).clone(), self.ty(indices).clone(), self.ty(updates).clone());
        assert!(it.elem.is_int(), "stablehlo.scatter: indices must be integers, got {it}");
        assert_eq!(ut.elem, ot.elem, "stablehlo.scatter: updates {ut} and operand {ot} differ in element type");
        let scatter_dims = it.rank() - usize::from((dn.index_vector_dim as usize) < it.rank());
        assert_eq!(
            ut.rank(),
            scatter_dims + dn.update_window_dims.len(),
            "stablehlo.scatter: updates {ut} must have the {scatter_dims} scatter dims of {it} plus update_window_dims {:?}",
            dn.update_window_dims
        );
        let s = TensorType::scalar(ot.elem);
        let region = self.scalar_region("stablehlo.scatter", &[s.clone(), s.clone()], &[s], |b, a| vec![body(b, a[0], a[1])]);
        let attrs = format!(
            "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {}, inserted_window_dims = {}, \
             input_batching_dims = {}, scatter_indices_batching_dims = {}, scatter_dims_to_operand_dims = {}, \
             index_vector_dim = {}>, indices_are_sorted = {}, unique_indices = {}",
            bracket(&dn.update_window_dims),
            bracket(&dn.inserted_window_dims),
            bracket(&dn.input_batching_dims),
            bracket(&dn.scatter_indices_batching_dims),
            bracket(&dn.scatter_dims_to_operand_dims),
            dn.index_vector_dim,
            dn.indices_are_sorted,
            dn.unique_indices
        );
        self.emit1("stablehlo.scatter", &[operand, indices, updates], &[region], &attrs, ot)
    }
}
