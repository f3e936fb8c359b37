//! Exact printed text for a few ops, and result type inference for each shape op.

use stablehlo::*;
use ElemType::*;

fn t(elem: ElemType, dims: &[i64]) -> TensorType {
    TensorType::new(elem, dims)
}

/// The body lines of @main (without the module/func wrapper), trimmed.
fn body(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    lines[2..lines.len() - 2].iter().map(|l| l.trim().to_string()).collect()
}

#[test]
fn tensor_type_display() {
    assert_eq!(t(F32, &[2, 3]).to_string(), "tensor<2x3xf32>");
    assert_eq!(t(F32, &[]).to_string(), "tensor<f32>");
    assert_eq!(t(F32, &[0, 3]).to_string(), "tensor<0x3xf32>");
    assert_eq!(t(C64, &[4]).to_string(), "tensor<4xcomplex<f32>>");
    assert_eq!(t(U8, &[1]).to_string(), "tensor<1xui8>");
    assert_eq!(t(Pred, &[]).to_string(), "tensor<i1>");
    assert_eq!(t(F8E4M3FN, &[2]).to_string(), "tensor<2xf8E4M3FN>");
    assert_eq!(BF16.byte_size(), 2);
    assert!(U16.is_unsigned() && U16.is_int() && !U16.is_float());
    assert!(C128.is_complex() && !C128.is_float());
}

#[test]
fn whole_module_with_elementwise_ops() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[2, 3]));
    let s = b.param(t(F32, &[]));
    let sb = b.broadcast_to(s, &[2, 3]);
    let y = b.add(x, sb);
    let z = b.tanh(y);
    let text = b.finish(&[z]);
    let expected = r#"module @m {
  func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<f32>) -> (tensor<2x3xf32>) {
    %0 = "stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64>} : (tensor<f32>) -> tensor<2x3xf32>
    %1 = "stablehlo.add"(%arg0, %0) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %2 = "stablehlo.tanh"(%1) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    "func.return"(%2) : (tensor<2x3xf32>) -> ()
  }
}
"#;
    assert_eq!(text, expected);
}

#[test]
fn compare_types_follow_elements() {
    let mut b = Builder::new();
    let f = b.param(t(F32, &[3]));
    let i = b.param(t(I32, &[3]));
    let u = b.param(t(U8, &[3]));
    let c1 = b.compare(CmpDir::Lt, f, f);
    let c2 = b.compare(CmpDir::Ge, i, i);
    let c3 = b.compare(CmpDir::Eq, u, u);
    let c4 = b.compare_total(CmpDir::Ne, f, f);
    assert_eq!(b.ty(c1), &t(Pred, &[3]));
    let text = b.finish(&[c1, c2, c3, c4]);
    assert_eq!(
        body(&text),
        [
            r#"%0 = "stablehlo.compare"(%arg0, %arg0) {comparison_direction = #stablehlo<comparison_direction LT>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>"#,
            r#"%1 = "stablehlo.compare"(%arg1, %arg1) {comparison_direction = #stablehlo<comparison_direction GE>, compare_type = #stablehlo<comparison_type SIGNED>} : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi1>"#,
            r#"%2 = "stablehlo.compare"(%arg2, %arg2) {comparison_direction = #stablehlo<comparison_direction EQ>, compare_type = #stablehlo<comparison_type UNSIGNED>} : (tensor<3xui8>, tensor<3xui8>) -> tensor<3xi1>"#,
            r#"%3 = "stablehlo.compare"(%arg0, %arg0) {comparison_direction = #stablehlo<comparison_direction NE>, compare_type = #stablehlo<comparison_type TOTALORDER>} : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xi1>"#,
            r#""func.return"(%0, %1, %2, %3) : (tensor<3xi1>, tensor<3xi1>, tensor<3xi1>, tensor<3xi1>) -> ()"#,
        ]
    );
}

#[test]
fn reduce_prints_region() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[2, 3]));
    let zero = b.constant_f64(0.0, F32);
    let r = b.reduce(&[x], &[zero], &[1], |b, a| vec![b.add(a[0], a[1])]);
    assert_eq!(b.ty(r[0]), &t(F32, &[2]));
    let text = b.finish(&r);
    let expected = r#"module @m {
  func.func public @main(%arg0: tensor<2x3xf32>) -> (tensor<2xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %4 = "stablehlo.reduce"(%arg0, %0) ({
    ^bb0(%1: tensor<f32>, %2: tensor<f32>):
      %3 = "stablehlo.add"(%1, %2) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%3) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
    "func.return"(%4) : (tensor<2xf32>) -> ()
  }
}
"#;
    assert_eq!(text, expected);
}

#[test]
fn variadic_reduce_has_multiple_results() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[4, 5]));
    let i = b.iota(&t(I32, &[4, 5]), 1);
    let lo = b.constant_f64(f64::NEG_INFINITY, F32);
    let zi = b.constant_i64(0, I32);
    let r = b.reduce(&[x, i], &[lo, zi], &[1], |b, a| {
        let gt = b.compare(CmpDir::Gt, a[2], a[0]);
        vec![b.select(gt, a[2], a[0]), b.select(gt, a[3], a[1])]
    });
    assert_eq!(b.ty(r[0]), &t(F32, &[4]));
    assert_eq!(b.ty(r[1]), &t(I32, &[4]));
    let text = b.finish(&r);
    assert!(text.contains(r#"%10:2 = "stablehlo.reduce"(%arg0, %0, %1, %2) ({"#), "{text}");
    assert!(text.contains(r#"-> (tensor<4xf32>, tensor<4xi32>)"#), "{text}");
    assert!(text.contains(r#""func.return"(%10#0, %10#1)"#), "{text}");
    assert!(text.contains(r#"dense<0xFF800000> : tensor<f32>"#), "{text}");
}

#[test]
fn dot_general_and_gather_attributes() {
    let mut b = Builder::new();
    let l = b.param(t(F32, &[8, 2, 3]));
    let r = b.param(t(F32, &[8, 3, 4]));
    let d = b.dot_general(l, r, &[0], &[0], &[2], &[1], F32);
    assert_eq!(b.dims(d), [8, 2, 4]);
    let idx = b.param(t(I64, &[5, 1]));
    let table = b.param(t(F32, &[10, 7]));
    let dn = GatherDims {
        offset_dims: vec![1],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: 1,
        ..Default::default()
    };
    let g = b.gather(table, idx, &dn, &[1, 7], false);
    assert_eq!(b.ty(g), &t(F32, &[5, 7]));
    let text = b.finish(&[d, g]);
    assert_eq!(
        body(&text)[..2],
        [
            r#"%0 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>} : (tensor<8x2x3xf32>, tensor<8x3x4xf32>) -> tensor<8x2x4xf32>"#,
            r#"%1 = "stablehlo.gather"(%arg3, %arg2) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], operand_batching_dims = [], start_indices_batching_dims = [], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, 7>, indices_are_sorted = false} : (tensor<10x7xf32>, tensor<5x1xi64>) -> tensor<5x7xf32>"#,
        ]
    );
}

#[test]
fn constants() {
    let mut b = Builder::new();
    let vals = [
        b.constant_f64(1.0, F32),
        b.constant_f64(f64::NAN, F32),
        b.constant_f64(f64::INFINITY, F64),
        b.constant_f64(f64::NEG_INFINITY, F16),
        b.constant_f64(-0.0, F32),
        b.constant_f64(0.1, BF16),
        b.constant_f64(1e-7, F64),
        b.constant_bool(true),
        b.constant_i64(i64::MIN, I64),
        b.constant_i64(-1, U32),
        b.constant_f64(-3.9, I8),
        b.constant_complex(1.5, -2.0, C64),
        b.splat_f64(2.5, &t(F32, &[2, 3])),
        b.splat_f64(1.0, &t(F32, &[0, 3])),
        b.constant_array_i64(&[1, 2, 3, 4, 5, 6], &[2, 3], I32),
        b.constant_array_f64(&[0.5, f64::INFINITY], &[2], F32),
    ];
    let text = b.finish(&vals);
    let lits: Vec<String> = body(&text)
        .iter()
        .filter_map(|l| l.split_once("value = ").map(|(_, rest)| rest.split_once('}').unwrap().0.to_string()))
        .collect();
    assert_eq!(
        lits,
        [
            "dense<1.0> : tensor<f32>",
            "dense<0x7FC00000> : tensor<f32>",
            "dense<0x7FF0000000000000> : tensor<f64>",
            "dense<0xFC00> : tensor<f16>",
            "dense<-0.0> : tensor<f32>",
            "dense<0.10009765625> : tensor<bf16>",
            "dense<1.0e-7> : tensor<f64>",
            "dense<true> : tensor<i1>",
            "dense<-9223372036854775808> : tensor<i64>",
            "dense<4294967295> : tensor<ui32>",
            "dense<-3> : tensor<i8>",
            "dense<(1.5, -2.0)> : tensor<complex<f32>>",
            "dense<2.5> : tensor<2x3xf32>",
            "dense<> : tensor<0x3xf32>",
            "dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xi32>",
            "dense<[0.5, 0x7F800000]> : tensor<2xf32>",
        ]
    );
}

#[test]
fn aliases_mark_donated_params() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[4]));
    let y = b.param(t(F32, &[4]));
    let s = b.add(x, y);
    let text = b.finish_with_aliases(&[s], &[(1, 0)]);
    assert!(
        text.contains("@main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> (tensor<4xf32>)"),
        "{text}"
    );
}

#[test]
fn no_ops_and_identity_shortcuts() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[2, 3]));
    assert_eq!(b.reshape(x, &[2, 3]), x);
    assert_eq!(b.broadcast_to(x, &[2, 3]), x);
    assert_eq!(b.convert(x, F32), x);
    assert_eq!(b.transpose(x, &[0, 1]), x);
    assert_eq!(b.concatenate(&[x], 0), x);
    let text = b.finish(&[x]);
    assert_eq!(body(&text), [r#""func.return"(%arg0) : (tensor<2x3xf32>) -> ()"#]);
}

#[test]
fn shape_op_result_types() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[2, 3, 4]));
    let v = b.param(t(F32, &[3, 1]));

    let y = b.broadcast_in_dim(v, &[5, 3, 7], &[1, 2]);
    assert_eq!(b.ty(y), &t(F32, &[5, 3, 7]));
    let y = b.broadcast_to(v, &[2, 3, 6]);
    assert_eq!(b.dims(y), [2, 3, 6]);
    let y = b.reshape(x, &[6, 4]);
    assert_eq!(b.dims(y), [6, 4]);
    let y = b.transpose(x, &[2, 0, 1]);
    assert_eq!(b.dims(y), [4, 2, 3]);
    let y = b.slice(x, &[0, 1, 0], &[2, 3, 4], &[1, 1, 3]);
    assert_eq!(b.dims(y), [2, 2, 2]);
    let i = b.constant_i64(1, I32);
    let y = b.dynamic_slice(x, &[i, i, i], &[1, 2, 3]);
    assert_eq!(b.dims(y), [1, 2, 3]);
    let y = b.dynamic_update_slice(x, y, &[i, i, i]);
    assert_eq!(b.ty(y), b.ty(x));
    let y = b.concatenate(&[x, x, x], 1);
    assert_eq!(b.dims(y), [2, 9, 4]);
    let z = b.constant_f64(0.0, F32);
    let y = b.pad(x, z, &[1, 0, -1], &[0, 2, 0], &[0, 1, 1]);
    assert_eq!(b.dims(y), [3, 7, 6]); // 2+1 ; 3+2+2 ; 4-1+3
    let y = b.iota(&t(I64, &[3, 2]), 1);
    assert_eq!(b.ty(y), &t(I64, &[3, 2]));
    let y = b.reverse(x, &[0, 2]);
    assert_eq!(b.ty(y), b.ty(x));
    let y = b.convert(x, BF16);
    assert_eq!(b.ty(y), &t(BF16, &[2, 3, 4]));
    let y = b.bitcast_convert(x, U8);
    assert_eq!(b.ty(y), &t(U8, &[2, 3, 4, 4]));
    let y = b.bitcast_convert(y, I32);
    assert_eq!(b.ty(y), &t(I32, &[2, 3, 4]));
    let c = b.complex(x, x);
    assert_eq!(b.elem(c), C64);
    let a = b.abs(c);
    let r = b.real(c);
    assert_eq!((b.elem(a), b.elem(r)), (F32, F32));
    let f = b.is_finite(x);
    assert_eq!(b.elem(f), Pred);
    let (vals, idx) = b.top_k(x, 2);
    assert_eq!((b.dims(vals), b.ty(idx)), (&[2, 3, 2][..], &t(I32, &[2, 3, 2])));
}

#[test]
fn gather_and_scatter_types() {
    let mut b = Builder::new();
    // torch.gather(x, 1, idx) style: batching dims.
    let x = b.param(t(F32, &[4, 6]));
    let idx = b.param(t(I32, &[4, 3, 1]));
    let dn = GatherDims {
        offset_dims: vec![],
        collapsed_slice_dims: vec![1],
        operand_batching_dims: vec![0],
        start_indices_batching_dims: vec![0],
        start_index_map: vec![1],
        index_vector_dim: 2,
    };
    let g = b.gather(x, idx, &dn, &[1, 1], false);
    assert_eq!(b.dims(g), [4, 3]);
    // Row gather with index_vector_dim == rank (implicit trailing 1).
    let rows = b.param(t(I64, &[2, 5]));
    let dn = GatherDims {
        offset_dims: vec![2],
        collapsed_slice_dims: vec![0],
        start_index_map: vec![0],
        index_vector_dim: 2,
        ..Default::default()
    };
    let g = b.gather(x, rows, &dn, &[1, 6], true);
    assert_eq!(b.dims(g), [2, 5, 6]);
    // index_add style scatter of rows.
    let upd = b.param(t(F32, &[3, 6]));
    let ridx = b.param(t(I64, &[3, 1]));
    let sdn = ScatterDims {
        update_window_dims: vec![1],
        inserted_window_dims: vec![0],
        scatter_dims_to_operand_dims: vec![0],
        index_vector_dim: 1,
        ..Default::default()
    };
    let s = b.scatter(x, ridx, upd, &sdn, |b, cur, new| b.add(cur, new));
    assert_eq!(b.ty(s), &t(F32, &[4, 6]));
    let text = b.finish(&[s]);
    assert!(text.contains("#stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], input_batching_dims = [], scatter_indices_batching_dims = [], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, indices_are_sorted = false, unique_indices = false"), "{text}");
}

#[test]
fn conv_reduce_window_and_friends_types() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[2, 4, 9, 9]));
    let w = b.param(t(F32, &[8, 2, 3, 3]));
    let y = b.convolution(x, w, &[2, 2], &[(1, 1), (0, 0)], &[], &[1, 2], &ConvDims::nchw(2), 2, 1, F32);
    // h: (9 + 2 - 3) / 2 + 1 = 5 ; w: dilated kernel 5 -> (9 - 5) / 2 + 1 = 3
    assert_eq!(b.dims(y), [2, 8, 5, 3]);
    let ninf = b.constant_f64(f64::NEG_INFINITY, F32);
    let p = b.reduce_window(&[x], &[ninf], &[1, 1, 2, 2], &[1, 1, 2, 2], &[], &[], &[], |b, a| vec![b.max(a[0], a[1])]);
    assert_eq!(b.dims(p[0]), [2, 4, 4, 4]);
    let zero = b.constant_f64(0.0, F32);
    let g = b.select_and_scatter(
        x,
        p[0],
        zero,
        &[1, 1, 2, 2],
        &[1, 1, 2, 2],
        &[],
        |b, a, c| b.compare(CmpDir::Ge, a, c),
        |b, a, c| b.add(a, c),
    );
    assert_eq!(b.ty(g), b.ty(x));
    let s = b.sort(&[x], 3, true, |b, a| b.compare(CmpDir::Lt, a[0], a[1]));
    assert_eq!(b.ty(s[0]), b.ty(x));
    let state = b.param(t(U64, &[2]));
    let (st, bits) = b.rng_bit_generator(RngAlgorithm::ThreeFry, state, &t(U32, &[3, 3]));
    assert_eq!((b.ty(st), b.ty(bits)), (&t(U64, &[2]), &t(U32, &[3, 3])));
    let text = b.finish(&[y, g, s[0], bits]);
    assert!(text.contains("dimension_numbers = #stablehlo.conv<raw input_batch_dimension = 0, input_feature_dimension = 1, input_spatial_dimensions = [2, 3], kernel_input_feature_dimension = 1, kernel_output_feature_dimension = 0, kernel_spatial_dimensions = [2, 3], output_batch_dimension = 0, output_feature_dimension = 1, output_spatial_dimensions = [2, 3]>, feature_group_count = 2 : i64, batch_group_count = 1 : i64"), "{text}");
    assert!(text.contains("padding = dense<[[1, 1], [0, 0]]> : tensor<2x2xi64>"), "{text}");
    assert!(text.contains("rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>"), "{text}");
}

#[test]
fn while_loop_counts() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[3]));
    let i0 = b.constant_i64(0, I32);
    let out = b.while_loop(
        &[i0, x],
        |b, a| {
            let n = b.constant_i64(5, I32);
            b.compare(CmpDir::Lt, a[0], n)
        },
        |b, a| {
            let one = b.constant_i64(1, I32);
            let y = b.add(a[1], a[1]);
            vec![b.add(a[0], one), y]
        },
    );
    assert_eq!(b.ty(out[1]), &t(F32, &[3]));
    let text = b.finish(&[out[1]]);
    assert!(text.contains(r#":2 = "stablehlo.while"(%0, %arg0) ({"#), "{text}");
}

#[test]
#[should_panic(expected = "stablehlo.add: operand types differ: tensor<2xf32> vs tensor<3xf32>")]
fn mismatched_operands_panic() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[2]));
    let y = b.param(t(F32, &[3]));
    b.add(x, y);
}

#[test]
#[should_panic(expected = "region that is already closed")]
fn region_values_do_not_escape() {
    let mut b = Builder::new();
    let x = b.param(t(F32, &[2]));
    let z = b.constant_f64(0.0, F32);
    let mut leaked = None;
    b.reduce(&[x], &[z], &[0], |b, a| {
        leaked = Some(a[0]);
        vec![b.add(a[0], a[1])]
    });
    b.neg(leaked.unwrap());
}
