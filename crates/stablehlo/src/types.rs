//! Element and tensor types, and the small enums/structs that op attributes need.

use std::fmt;

/// Element type of a tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ElemType {
    Pred,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    C64,
    C128,
    F8E4M3FN,
    F8E5M2,
    F8E4M3FNUZ,
    F8E5M2FNUZ,
    /// Exponent only: powers of two, no sign, no zero (MX scales).
    F8E8M0FNU,
    /// Two float4 e2m1 values packed in a byte (PyTorch's float4_e2m1fn_x2): bytes to the
    /// compiler (`ui8`), moved and compared as they are; its own type so that a value keeps
    /// its torch dtype through the ops that move it.
    F4E2M1FNX2,
}

impl ElemType {
    /// The MLIR spelling (`i1`, `ui8`, `bf16`, `complex<f32>`, ...).
    pub fn mlir_name(self) -> &'static str {
        use ElemType::*;
        match self {
            Pred => "i1",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            U8 => "ui8",
            U16 => "ui16",
            U32 => "ui32",
            U64 => "ui64",
            F16 => "f16",
            BF16 => "bf16",
            F32 => "f32",
            F64 => "f64",
            C64 => "complex<f32>",
            C128 => "complex<f64>",
            F8E4M3FN => "f8E4M3FN",
            F8E5M2 => "f8E5M2",
            F8E4M3FNUZ => "f8E4M3FNUZ",
            F8E5M2FNUZ => "f8E5M2FNUZ",
            F8E8M0FNU => "f8E8M0FNU",
            F4E2M1FNX2 => "ui8",
        }
    }

    /// Real floating point (not complex).
    pub fn is_float(self) -> bool {
        use ElemType::*;
        matches!(self, F16 | BF16 | F32 | F64 | F8E4M3FN | F8E5M2 | F8E4M3FNUZ | F8E5M2FNUZ | F8E8M0FNU)
    }

    /// Signed or unsigned integer; `Pred` is not an integer here.
    pub fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned()
    }

    pub fn is_signed_int(self) -> bool {
        use ElemType::*;
        matches!(self, I8 | I16 | I32 | I64)
    }

    pub fn is_unsigned(self) -> bool {
        use ElemType::*;
        matches!(self, U8 | U16 | U32 | U64 | F4E2M1FNX2)
    }

    pub fn is_complex(self) -> bool {
        matches!(self, ElemType::C64 | ElemType::C128)
    }

    /// Bytes per element in a dense host buffer (Pred takes one byte).
    pub fn byte_size(self) -> usize {
        use ElemType::*;
        match self {
            Pred | I8 | U8 | F8E4M3FN | F8E5M2 | F8E4M3FNUZ | F8E5M2FNUZ | F8E8M0FNU | F4E2M1FNX2 => 1,
            I16 | U16 | F16 | BF16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 | C64 => 8,
            C128 => 16,
        }
    }

    /// Bits per element as StableHLO counts them (Pred is 1 bit; used by bitcast_convert).
    pub fn bit_width(self) -> usize {
        if self == ElemType::Pred {
            1
        } else {
            8 * self.byte_size()
        }
    }

    /// Real part type of a complex type; identity for other types.
    pub fn real_type(self) -> ElemType {
        match self {
            ElemType::C64 => ElemType::F32,
            ElemType::C128 => ElemType::F64,
            t => t,
        }
    }

    /// Complex type whose parts are `self` (F32 -> C64, F64 -> C128).
    pub fn complex_of(self) -> Option<ElemType> {
        match self {
            ElemType::F32 => Some(ElemType::C64),
            ElemType::F64 => Some(ElemType::C128),
            _ => None,
        }
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir_name())
    }
}

/// A ranked tensor type with static dims.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct TensorType {
    pub elem: ElemType,
    pub dims: Vec<i64>,
}

impl TensorType {
    pub fn new(elem: ElemType, dims: &[i64]) -> Self {
        assert!(dims.iter().all(|&d| d >= 0), "negative dimension in {dims:?}");
        TensorType { elem, dims: dims.to_vec() }
    }

    /// 0-d tensor of `elem`.
    pub fn scalar(elem: ElemType) -> Self {
        TensorType { elem, dims: vec![] }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    pub fn num_elements(&self) -> i64 {
        self.dims.iter().product()
    }

    /// Same dims, other element type.
    pub fn with_elem(&self, elem: ElemType) -> Self {
        TensorType { elem, dims: self.dims.clone() }
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.dims {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

/// `comparison_direction` of `stablehlo.compare`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CmpDir {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpDir {
    pub fn mlir_name(self) -> &'static str {
        match self {
            CmpDir::Eq => "EQ",
            CmpDir::Ne => "NE",
            CmpDir::Lt => "LT",
            CmpDir::Le => "LE",
            CmpDir::Gt => "GT",
            CmpDir::Ge => "GE",
        }
    }
}

/// `rng_algorithm` of `stablehlo.rng_bit_generator`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RngAlgorithm {
    Default,
    ThreeFry,
    Philox,
}

impl RngAlgorithm {
    pub fn mlir_name(self) -> &'static str {
        match self {
            RngAlgorithm::Default => "DEFAULT",
            RngAlgorithm::ThreeFry => "THREE_FRY",
            RngAlgorithm::Philox => "PHILOX",
        }
    }
}

/// Dimension numbers of `stablehlo.gather` (field names follow the spec).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct GatherDims {
    pub offset_dims: Vec<i64>,
    pub collapsed_slice_dims: Vec<i64>,
    pub operand_batching_dims: Vec<i64>,
    pub start_indices_batching_dims: Vec<i64>,
    pub start_index_map: Vec<i64>,
    pub index_vector_dim: i64,
}

/// Dimension numbers of `stablehlo.scatter` (field names follow the spec).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScatterDims {
    pub update_window_dims: Vec<i64>,
    pub inserted_window_dims: Vec<i64>,
    pub input_batching_dims: Vec<i64>,
    pub scatter_indices_batching_dims: Vec<i64>,
    pub scatter_dims_to_operand_dims: Vec<i64>,
    pub index_vector_dim: i64,
    pub indices_are_sorted: bool,
    pub unique_indices: bool,
}

/// Dimension numbers of `stablehlo.convolution`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConvDims {
    pub input_batch_dimension: i64,
    pub input_feature_dimension: i64,
    pub input_spatial_dimensions: Vec<i64>,
    pub kernel_input_feature_dimension: i64,
    pub kernel_output_feature_dimension: i64,
    pub kernel_spatial_dimensions: Vec<i64>,
    pub output_batch_dimension: i64,
    pub output_feature_dimension: i64,
    pub output_spatial_dimensions: Vec<i64>,
}

impl ConvDims {
    /// PyTorch layout: input NC(spatial...), kernel OI(spatial...), output NC(spatial...).
    pub fn nchw(spatial_rank: usize) -> Self {
        let sp: Vec<i64> = (2..2 + spatial_rank as i64).collect();
        ConvDims {
            input_batch_dimension: 0,
            input_feature_dimension: 1,
            input_spatial_dimensions: sp.clone(),
            kernel_input_feature_dimension: 1,
            kernel_output_feature_dimension: 0,
            kernel_spatial_dimensions: sp.clone(),
            output_batch_dimension: 0,
            output_feature_dimension: 1,
            output_spatial_dimensions: sp,
        }
    }
}
