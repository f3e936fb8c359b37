//! What PyTorch prints in messages: caffe2 TypeMeta names (`cpp_type_name`; `meta_name` for
//! the ten common dtypes, torch names otherwise), legacy tensor type names, shapes (`shape_str`),
//! and the dtype checks that print them (`check_scalar_type`, `check_float_kernel`).
use crate::check;
use crate::dtype::DType;
use crate::error::Result;

/// The C++ type name PyTorch prints for a dtype in some messages (caffe2::TypeMeta).
pub(crate) fn cpp_type_name(d: DType) -> &'static str {
    use DType::*;
    match d {
        U8 => "unsigned char",
        I8 => "signed char",
        I16 => "short int",
        I32 => "int",
        I64 => "long int",
        F16 => "c10::Half",
        F32 => "float",
        F64 => "double",
        C64 => "c10::complex<float>",
        C128 => "c10::complex<double>",
        Bool => "bool",
        BF16 => "c10::BFloat16",
        F8E5M2 => "c10::Float8_e5m2",
        F8E4M3FN => "c10::Float8_e4m3fn",
        F8E5M2FNUZ => "c10::Float8_e5m2fnuz",
        F8E4M3FNUZ => "c10::Float8_e4m3fnuz",
        F8E8M0FNU => "c10::Float8_e8m0fnu",
        F4E2M1FNX2 => "c10::Float4_e2m1fn_x2",
        U16 => "unsigned short",
        U32 => "unsigned int",
        U64 => "unsigned long",
    }
}

/// The C++ type name c10's checked Scalar conversions print ("value cannot be converted to type
/// int64_t without overflow"): fixed-width integer names, TypeMeta's otherwise.
pub(crate) fn convert_type_name(d: DType) -> &'static str {
    match d {
        DType::U8 => "uint8_t",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I64 => "int64_t",
        DType::U16 => "uint16_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
        d => cpp_type_name(d),
    }
}

/// The element-type name PyTorch's out= dtype checks print (caffe2 TypeMeta names).
pub(crate) fn meta_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "c10::Half",
        DType::BF16 => "c10::BFloat16",
        DType::I64 => "long int",
        DType::I32 => "int",
        DType::I16 => "short int",
        DType::I8 => "signed char",
        DType::U8 => "unsigned char",
        DType::Bool => "bool",
        d => d.torch_name(),
    }
}

/// The legacy tensor type name PyTorch prints in argument checks ("torch.FloatTensor").
pub(crate) fn tensor_type_name(d: DType) -> String {
    format!("torch.{}Tensor", d.torch_name())
}

/// An out= tensor's dtype against the one the op writes, with CPU's message
/// ("Expected out tensor to have dtype float, but got double instead").
pub(crate) fn check_out_dtype(expected: DType, out: DType) -> Result<()> {
    check!(
        expected == out,
        Runtime,
        "Expected out tensor to have dtype {}, but got {} instead",
        meta_name(expected),
        meta_name(out)
    );
    Ok(())
}

/// The dtype check of a second operand against the first, with the message PyTorch's kernels
/// give (bmm/baddbmm/mv/addmv here; the losses' weights and gradients).
pub(crate) fn check_scalar_type(expected: DType, found: DType) -> Result<()> {
    check!(
        expected == found,
        Runtime,
        "expected scalar type {} but found {}",
        expected.torch_name(),
        found.torch_name()
    );
    Ok(())
}

pub(crate) fn check_float_kernel(dt: DType, kernel: &str, allow_16: bool) -> Result<()> {
    let ok = matches!(dt, DType::F32 | DType::F64) || (allow_16 && dt == DType::BF16);
    check!(ok, NotImplemented, "\"{}\" not implemented for '{}'", kernel, dt.torch_name());
    Ok(())
}

pub(crate) fn shape_str(d: &[i64]) -> String {
    format!("[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}
