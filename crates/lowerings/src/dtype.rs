//! PyTorch dtypes (numbered as c10::ScalarType) and PyTorch's type promotion rules.
use stablehlo::ElemType;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i8)]
pub enum DType {
    U8 = 0,
    I8 = 1,
    I16 = 2,
    I32 = 3,
    I64 = 4,
    F16 = 5,
    F32 = 6,
    F64 = 7,
    C64 = 9,
    C128 = 10,
    Bool = 11,
    BF16 = 15,
    F8E5M2 = 23,
    F8E4M3FN = 24,
    F8E5M2FNUZ = 25,
    F8E4M3FNUZ = 26,
    U16 = 27,
    U32 = 28,
    U64 = 29,
    F8E8M0FNU = 44,
    /// Two float4 e2m1 values per byte: bytes that ops move but do no arithmetic on
    /// (`Op::float4`, as PyTorch's CPU kernels).
    F4E2M1FNX2 = 45,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Bool,
    Int,
    Float,
    Complex,
}

impl DType {
    /// The dtype PyTorch does this dtype's arithmetic in (at::opmath_type): float32 for
    /// 16- and 8-bit floats, the dtype itself otherwise.
    pub fn opmath(self) -> DType {
        match self {
            d if d.is_float() && d.size() < 4 => DType::F32,
            d => d,
        }
    }

    /// Every dtype the lowerings know.
    pub const ALL: [DType; 21] = {
        use DType::*;
        [U8, I8, I16, I32, I64, F16, F32, F64, C64, C128, Bool, BF16, F8E5M2, F8E4M3FN, F8E5M2FNUZ, F8E4M3FNUZ, U16, U32, U64, F8E8M0FNU, F4E2M1FNX2]
    };

    /// The torch name of a c10::ScalarType code that has no DType here, for errors.
    pub fn unsupported_name(code: i8) -> String {
        match code {
            8 => "torch.complex32".into(),
            12 => "torch.qint8".into(),
            13 => "torch.quint8".into(),
            14 => "torch.qint32".into(),
            16 => "torch.quint4x2".into(),
            17 => "torch.quint2x4".into(),
            18..=22 => format!("torch.{}", ["bits1x8", "bits2x4", "bits4x2", "bits8", "bits16"][(code - 18) as usize]),
            30..=36 => format!("torch.uint{}", code - 29),
            37..=43 => format!("torch.int{}", code - 36),
            _ => format!("dtype code {code}"),
        }
    }

    pub fn from_code(code: i8) -> Option<DType> {
        use DType::*;
        Some(match code {
            0 => U8,
            1 => I8,
            2 => I16,
            3 => I32,
            4 => I64,
            5 => F16,
            6 => F32,
            7 => F64,
            9 => C64,
            10 => C128,
            11 => Bool,
            15 => BF16,
            23 => F8E5M2,
            24 => F8E4M3FN,
            25 => F8E5M2FNUZ,
            26 => F8E4M3FNUZ,
            27 => U16,
            28 => U32,
            29 => U64,
            44 => F8E8M0FNU,
            45 => F4E2M1FNX2,
            _ => return None,
        })
    }

    /// The attribute of the `torch` module naming this dtype (`torch.float32`).
    pub fn python_name(self) -> &'static str {
        use DType::*;
        match self {
            U8 => "uint8",
            I8 => "int8",
            I16 => "int16",
            I32 => "int32",
            I64 => "int64",
            F16 => "float16",
            F32 => "float32",
            F64 => "float64",
            C64 => "complex64",
            C128 => "complex128",
            Bool => "bool",
            BF16 => "bfloat16",
            F8E5M2 => "float8_e5m2",
            F8E4M3FN => "float8_e4m3fn",
            F8E5M2FNUZ => "float8_e5m2fnuz",
            F8E4M3FNUZ => "float8_e4m3fnuz",
            F8E8M0FNU => "float8_e8m0fnu",
            F4E2M1FNX2 => "float4_e2m1fn_x2",
            U16 => "uint16",
            U32 => "uint32",
            U64 => "uint64",
        }
    }

    /// The name PyTorch prints in messages ("Float", "Long", ...).
    pub fn torch_name(self) -> &'static str {
        use DType::*;
        match self {
            U8 => "Byte",
            I8 => "Char",
            I16 => "Short",
            I32 => "Int",
            I64 => "Long",
            F16 => "Half",
            F32 => "Float",
            F64 => "Double",
            C64 => "ComplexFloat",
            C128 => "ComplexDouble",
            Bool => "Bool",
            BF16 => "BFloat16",
            F8E5M2 => "Float8_e5m2",
            F8E4M3FN => "Float8_e4m3fn",
            F8E5M2FNUZ => "Float8_e5m2fnuz",
            F8E4M3FNUZ => "Float8_e4m3fnuz",
            F8E8M0FNU => "Float8_e8m0fnu",
            F4E2M1FNX2 => "Float4_e2m1fn_x2",
            U16 => "UInt16",
            U32 => "UInt32",
            U64 => "UInt64",
        }
    }

    pub fn elem(self) -> ElemType {
        use DType::*;
        match self {
            U8 => ElemType::U8,
            I8 => ElemType::I8,
            I16 => ElemType::I16,
            I32 => ElemType::I32,
            I64 => ElemType::I64,
            F16 => ElemType::F16,
            F32 => ElemType::F32,
            F64 => ElemType::F64,
            C64 => ElemType::C64,
            C128 => ElemType::C128,
            Bool => ElemType::Pred,
            BF16 => ElemType::BF16,
            F8E5M2 => ElemType::F8E5M2,
            F8E4M3FN => ElemType::F8E4M3FN,
            F8E5M2FNUZ => ElemType::F8E5M2FNUZ,
            F8E4M3FNUZ => ElemType::F8E4M3FNUZ,
            F8E8M0FNU => ElemType::F8E8M0FNU,
            F4E2M1FNX2 => ElemType::F4E2M1FNX2,
            U16 => ElemType::U16,
            U32 => ElemType::U32,
            U64 => ElemType::U64,
        }
    }

    pub fn from_elem(e: ElemType) -> DType {
        use DType::*;
        match e {
            ElemType::U8 => U8,
            ElemType::I8 => I8,
            ElemType::I16 => I16,
            ElemType::I32 => I32,
            ElemType::I64 => I64,
            ElemType::F16 => F16,
            ElemType::F32 => F32,
            ElemType::F64 => F64,
            ElemType::C64 => C64,
            ElemType::C128 => C128,
            ElemType::Pred => Bool,
            ElemType::BF16 => BF16,
            ElemType::F8E5M2 => F8E5M2,
            ElemType::F8E4M3FN => F8E4M3FN,
            ElemType::F8E5M2FNUZ => F8E5M2FNUZ,
            ElemType::F8E4M3FNUZ => F8E4M3FNUZ,
            ElemType::F8E8M0FNU => F8E8M0FNU,
            ElemType::F4E2M1FNX2 => F4E2M1FNX2,
            ElemType::U16 => U16,
            ElemType::U32 => U32,
            ElemType::U64 => U64,
        }
    }

    pub fn size(self) -> usize {
        use DType::*;
        match self {
            U8 | I8 | Bool | F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ | F8E8M0FNU | F4E2M1FNX2 => 1,
            I16 | F16 | BF16 | U16 => 2,
            I32 | F32 | U32 => 4,
            I64 | F64 | C64 | U64 => 8,
            C128 => 16,
        }
    }

    pub fn category(self) -> Category {
        use DType::*;
        match self {
            Bool => Category::Bool,
            U8 | I8 | I16 | I32 | I64 | U16 | U32 | U64 => Category::Int,
            F16 | F32 | F64 | BF16 | F8E5M2 | F8E4M3FN | F8E5M2FNUZ | F8E4M3FNUZ | F8E8M0FNU | F4E2M1FNX2 => Category::Float,
            C64 | C128 => Category::Complex,
        }
    }

    pub fn is_float(self) -> bool {
        self.category() == Category::Float
    }
    pub fn is_complex(self) -> bool {
        self.category() == Category::Complex
    }
    pub fn is_int(self) -> bool {
        self.category() == Category::Int
    }
    /// Integral including bool, as PyTorch's isIntegralType(t, includeBool=true).
    pub fn is_integral(self) -> bool {
        matches!(self.category(), Category::Int | Category::Bool)
    }
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool)
    }

    pub fn to_complex(self) -> DType {
        match self {
            DType::F64 => DType::C128,
            DType::C128 => DType::C128,
            _ => DType::C64,
        }
    }
    /// The real counterpart of a complex dtype (itself otherwise).
    pub fn to_real(self) -> DType {
        match self {
            DType::C64 => DType::F32,
            DType::C128 => DType::F64,
            d => d,
        }
    }
}

/// torch.promote_types.
pub fn promote(a: DType, b: DType) -> DType {
    use DType::*;
    if a == b {
        return a;
    }
    if a == Bool {
        return b;
    }
    if b == Bool {
        return a;
    }
    let (ca, cb) = (a.category(), b.category());
    if ca == Category::Complex || cb == Category::Complex {
        let wide = |d: DType| matches!(d, F64 | C128);
        return if wide(a) || wide(b) { C128 } else { C64 };
    }
    if ca == Category::Float && cb == Category::Float {
        // Mixed 16-bit floats (and float8s) meet at float32.
        let rank = |d: DType| match d {
            F64 => 3,
            F32 => 2,
            _ => 1,
        };
        return match rank(a).max(rank(b)) {
            3 => F64,
            2 => F32,
            _ if a.size() == 2 && b.size() == 2 => F32,
            _ if a.size() == 2 => a,
            _ if b.size() == 2 => b,
            _ => F32,
        };
    }
    if ca == Category::Float {
        return a;
    }
    if cb == Category::Float {
        return b;
    }
    // Both integers.
    let (ua, ub) = (a.is_unsigned(), b.is_unsigned());
    if ua == ub {
        return if a.size() >= b.size() { a } else { b };
    }
    let (u, s) = if ua { (a, b) } else { (b, a) };
    if s.size() > u.size() {
        s
    } else {
        match u.size() {
            1 => I16,
            2 => I32,
            _ => I64,
        }
    }
}

/// Can a value of dtype `from` be written into a tensor of dtype `to` (torch.can_cast)?
pub fn can_cast(from: DType, to: DType) -> bool {
    from.category() <= to.category()
}

/// The priority class of an operand in type promotion (at::native::ResultTypeState).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Rank {
    /// A tensor with one or more dimensions.
    Dim,
    /// A 0-d tensor.
    ZeroDim,
    /// A Python number: a Scalar argument or a wrapped 0-d tensor.
    Wrapped,
}

/// at::result_type over operands given as (dtype, rank); `None` for an empty list.
pub fn result_type(operands: &[(DType, Rank)]) -> Option<DType> {
    let mut dim: Option<DType> = None;
    let mut zero: Option<DType> = None;
    let mut wrapped: Option<DType> = None;
    for &(d, r) in operands {
        let slot = match r {
            Rank::Dim => &mut dim,
            Rank::ZeroDim => &mut zero,
            Rank::Wrapped => &mut wrapped,
        };
        // Wrapped numbers count with the default dtype of their category.
        let d = if r == Rank::Wrapped {
            match d.category() {
                Category::Float => DType::F32,
                Category::Complex => DType::C64,
                _ => d,
            }
        } else {
            d
        };
        *slot = Some(match *slot {
            None => d,
            Some(prev) => promote(prev, d),
        });
    }
    let lower = combine(zero, wrapped);
    combine(dim, lower)
}

fn combine(higher: Option<DType>, lower: Option<DType>) -> Option<DType> {
    let (h, l) = match (higher, lower) {
        (None, l) => return l,
        (h, None) => return h,
        (Some(h), Some(l)) => (h, l),
    };
    Some(if h.is_complex() {
        h
    } else if l.is_complex() {
        if h.is_float() {
            h.to_complex()
        } else {
            l
        }
    } else if h.is_float() {
        h
    } else if h == DType::Bool || l.is_float() {
        promote(h, l)
    } else {
        h
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use DType::*;

    #[test]
    fn promote_table() {
        assert_eq!(promote(U8, I8), I16);
        assert_eq!(promote(Bool, F16), F16);
        assert_eq!(promote(F16, BF16), F32);
        assert_eq!(promote(I64, F16), F16);
        assert_eq!(promote(F64, C64), C128);
        assert_eq!(promote(I32, I64), I64);
        assert_eq!(promote(U8, I64), I64);
    }

    #[test]
    fn result_type_ranks() {
        // int tensor + python float -> default float
        assert_eq!(result_type(&[(I64, Rank::Dim), (F64, Rank::Wrapped)]), Some(F32));
        // half tensor + double 0-d tensor -> half
        assert_eq!(result_type(&[(F16, Rank::Dim), (F64, Rank::ZeroDim)]), Some(F16));
        // int tensor + double 0-d tensor -> double
        assert_eq!(result_type(&[(I32, Rank::Dim), (F64, Rank::ZeroDim)]), Some(F64));
        // uint8 tensor + python int -> uint8
        assert_eq!(result_type(&[(U8, Rank::Dim), (I64, Rank::Wrapped)]), Some(U8));
        // bool tensor + python int -> long
        assert_eq!(result_type(&[(Bool, Rank::Dim), (I64, Rank::Wrapped)]), Some(I64));
        // float tensor + complex python -> complex64
        assert_eq!(result_type(&[(F32, Rank::Dim), (C128, Rank::Wrapped)]), Some(C64));
    }
}
